"""What int8 activations cost in quality on the real model: SmolLM2-135M-Instruct's q4_0 and q8_0 GGUF files (the
latency benchmark's, exported from the dense copy of the Q4_1 file) served natively by cinq with int16 activations
(``CINQ_INT8_ACTIVATIONS=0``) and with int8 ones (``=1``, the default), perplexity on the held-out text and KL /
top-1 agreement of the next-token distributions against the dense bf16 model (cinq.eval.text_scores); and the
batch-1 decode speed of the same files both ways in one run (interleaved rounds, 1 and 2 threads), with how many
greedy tokens the two agree on.

    python benchmarks/int8_activations.py          # writes benchmarks/results/int8_activations.{json,md}
    python benchmarks/int8_activations.py --tokens 512 --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

from cinq.bench.report import BenchResult, Table, print_report, run_conditions, write_report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FILES = ("q4_0", "q8_0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the held-out text scored (all of them for KL)")
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved decode-speed rounds per thread count")
    ap.add_argument("--out", default=str(RESULTS / "int8_activations"))
    args = ap.parse_args()
    load = os.getloadavg()[0]
    _, conditions = run_conditions(load)

    from cinq.bench.latency_engines import dense_folder, gguf_file
    from cinq.cache import cache_dir
    from cinq.config import EngineConfig
    from cinq.eval.perplexity import encode_text
    from cinq.eval.text_scores import base_scores, score_text
    from cinq.eval.texts import read_text
    from cinq.layers.quantization.int8_activations import int8_activations, set_int8_activations
    from cinq.model.loader import load_model
    from cinq.model.tokenizer import Tokenizer

    work = cache_dir() / "bench-latency"  # the latency benchmark's files: the same weights it times
    dense = dense_folder(EngineConfig(model=args.model), work)
    ids = encode_text(Tokenizer.from_pretrained(dense), read_text("held-out"))[:args.tokens + 1]
    t0 = time.perf_counter()
    base = base_scores(load_model(dense, dtype="bfloat16"), ids, args.context_len, kl_tokens=args.tokens)
    rows: list[list[object]] = []
    data: dict[str, object] = {"model": args.model, "tokens": len(ids) - 1, "context_len": args.context_len,
                               "load_at_start": load, "rows": []}
    ref = score_text(load_model(dense, dtype="bfloat16"), ids, args.context_len, base)
    rows.append(["bf16 (dense)", "-", ref.perplexity, 0.0, 1.0, None])
    for outtype in FILES:
        path = gguf_file(dense, outtype, work)
        ppl_int16 = None
        for enabled in (False, True):
            set_int8_activations(enabled)
            if enabled and not int8_activations():
                raise SystemExit("the int8-activation kernel is unavailable here (no compiler, or no AVX2 + FMA)")
            s = score_text(load_model(path, dtype="bfloat16"), ids, args.context_len, base)
            acts = "int8" if enabled else "int16"
            ppl_int16 = s.perplexity if not enabled else ppl_int16
            rows.append([outtype, acts, s.perplexity, s.kl, s.top1,
                         None if not enabled else 100 * (s.perplexity / ppl_int16 - 1)])
            data["rows"].append({"file": outtype, "activations": acts, "perplexity": s.perplexity, "kl": s.kl,
                                 "top1": s.top1})
            print(f"{outtype} {acts}: ppl {s.perplexity:.3f} KL {s.kl:.5f} top1 {s.top1:.4f}", flush=True)
    set_int8_activations(None)
    speed_rows, data["speed"] = decode_speed(dense, work, args.rounds)
    data["base_perplexity"] = ref.perplexity
    data["seconds"] = time.perf_counter() - t0
    q4 = [r for r in data["rows"] if r["file"] == "q4_0"]  # type: ignore[index]
    headline = (f"q4_0 with int8 activations: KL vs bf16 {q4[1]['kl']:.4f} (int16: {q4[0]['kl']:.4f}), perplexity "
                f"{q4[1]['perplexity']:.3f} vs {q4[0]['perplexity']:.3f} with int16 "
                f"({100 * (q4[1]['perplexity'] / q4[0]['perplexity'] - 1):+.2f}%); batch-1 decode of q4_0 " +
                ", ".join(f"{r['ms_int16'] / r['ms_int8']:.2f}x at {r['threads']} thread(s)"  # type: ignore[index]
                          for r in data["speed"] if r["file"] == "q4_0"))  # type: ignore[union-attr,index]
    result = BenchResult(
        "int8_activations", "Quality cost of int8 activations (SmolLM2-135M-Instruct, native GGUF blocks)",
        f"`python benchmarks/int8_activations.py --tokens {args.tokens}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): "
        f"{len(ids) - 1} tokens of the held-out text in windows of {args.context_len}, bf16 compute; KL(bf16 || "
        f"variant) per token and top-1 agreement against the dense bf16 model. {conditions} (Quality figures do not "
        f"depend on the load.)",
        [Table("Perplexity and KL against the dense bf16 model",
               ["weights", "activations", "perplexity", "KL vs bf16", "top-1 vs bf16", "ppl vs int16 acts (%)"],
               rows),
         Table("Batch-1 decode (prompt 128, 64 new tokens): median ms per step",
               ["weights", "threads", "int16 acts (ms)", "int8 acts (ms)", "speedup", "greedy tokens equal"],
               speed_rows)],
        headline, data,
        notes=["int16: the activations rounded to 2^-16 of their 32/64-channel block's largest value "
               "(cinq/kernels/cpu/grouped_int_linear.cpp); int8: to 2^-8 of their 32-channel block's "
               "(cinq/kernels/cpu/int8_activation_linear.cpp, llama.cpp's Q8_0 of the activations)."])
    print_report(result)
    write_report(result, args.out)


def decode_speed(dense: Path, work: Path, rounds: int) -> tuple[list[list[object]], list[dict[str, object]]]:
    """Median ms per decode step of each file served with int16 and with int8 activations (both engines loaded
    side by side: GGUF layers pick their kernel when they load), interleaved per round; the int8 run's speedup and
    the length of the greedy prefix the two produce alike."""
    import random
    import statistics

    import torch

    from cinq.bench.latency_engines import CinqRunner, gguf_file
    from cinq.config import EngineConfig
    from cinq.layers.quantization.int8_activations import set_int8_activations
    prompt = [random.Random(0).randrange(1000, 40000) for _ in range(128)]
    table: list[list[object]] = []
    raw: list[dict[str, object]] = []
    for outtype in FILES:
        engines = {}
        for enabled in (False, True):
            set_int8_activations(enabled)
            engines[enabled] = CinqRunner(EngineConfig(model=str(gguf_file(dense, outtype, work)), dtype="bfloat16"))
        set_int8_activations(None)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            steps: dict[bool, list[float]] = {False: [], True: []}
            tokens: dict[bool, list[int]] = {}
            for r in range(rounds + 1):  # round 0 warms up
                for enabled in ((False, True) if r % 2 else (True, False)):
                    t = engines[enabled].run(prompt, 64)
                    tokens[enabled] = t.tokens
                    if r:
                        steps[enabled].append(statistics.median(t.gaps_s) * 1e3)
            ms = {k: statistics.median(v) for k, v in steps.items()}
            same = next((i for i, (a, b) in enumerate(zip(tokens[False], tokens[True])) if a != b),
                        min(len(tokens[False]), len(tokens[True])))
            table.append([outtype, threads, ms[False], ms[True], ms[False] / ms[True], f"{same} / 64"])
            raw.append({"file": outtype, "threads": threads, "ms_int16": ms[False], "ms_int8": ms[True],
                        "greedy_prefix_equal": same})
            print(f"{outtype} t{threads}: int16 {ms[False]:.2f} ms, int8 {ms[True]:.2f} ms "
                  f"({ms[False] / ms[True]:.2f}x), greedy equal for {same} tokens", flush=True)
        del engines
    return table, raw


if __name__ == "__main__":
    main()
