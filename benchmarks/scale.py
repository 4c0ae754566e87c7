"""Scaling over devices: tensor parallelism (TP) 1 vs 2 on this machine's CPU cores (gloo between processes).

For each model: the same engine settings at tensor_parallel_size 1 (one process, ``--threads`` torch threads) and
2 (two processes, ``--threads / 2`` threads each: the same cores split between the ranks), measured in the same
run, rounds interleaved (TP 1, TP 2, TP 1, ...), best round kept:

* batch-1 decode: one request, 16-token prompt, ``--decode-tokens`` greedy tokens: ms per output token;
* batch throughput: ``--requests`` requests, 64-token prompts, 32 output tokens each: output tokens/s.

Models: the embedded cinq-tiny (hidden 384, 5 layers, bf16) and a random wider one (hidden 1024, 4 layers,
intermediate 4096, 16 heads / 4 KV heads, vocab 8192, bf16), built once under the cinq cache.

    python benchmarks/scale.py            # writes benchmarks/results/scale.{md,json}
    python benchmarks/scale.py --quick    # a smoke run (one round, fewer tokens), results not written
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py
import torch  # noqa: E402

from cinq.assets import resolve_model_path  # noqa: E402
from cinq.bench.drive import run_until_done  # noqa: E402
from cinq.cache import cache_dir  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402
from cinq.engine.engine import LLMEngine  # noqa: E402
from cinq.model.byte_tokenizer import save_byte_tokenizer  # noqa: E402
from cinq.model.config import ModelConfig  # noqa: E402
from cinq.model.saver import init_random_model, save_model  # noqa: E402
from cinq.sampling_params import OutputKind, SamplingParams  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def wide_model() -> Path:
    path = cache_dir() / "benchmarks" / "scale-wide-1024x4"
    if (path / "config.json").is_file():
        return path
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": 1024, "intermediate_size": 4096,
        "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 256, "eos_token_id": 262})
    save_model(init_random_model(config, seed=0, dtype=torch.bfloat16), path, torch.bfloat16)
    save_byte_tokenizer(path)
    return path


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Seconds to finish every prompt, and the output tokens made."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=OutputKind.FINAL_ONLY)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", p, params)
    t0 = time.perf_counter()
    made = sum(len(o.outputs[0].token_ids) for o in run_until_done(engine).values())
    return time.perf_counter() - t0, made


def measure(model: Path, tp: int, threads: int, args: argparse.Namespace, rng: random.Random) -> dict:
    per_rank = max(1, threads // tp)
    torch.set_num_threads(per_rank)  # rank 0 runs in this process
    engine = LLMEngine(EngineConfig(model=str(model), dtype="bfloat16", tensor_parallel_size=tp,
                                    num_threads=per_rank, kv_cache_memory=0.5, seed=0))
    try:
        vocab = engine.vocab_size
        run(engine, [[rng.randrange(10, vocab) for _ in range(16)]], 4)  # warm-up
        s, made = run(engine, [[rng.randrange(10, vocab) for _ in range(16)]], args.decode_tokens)
        decode_ms = 1000 * s / made
        batch = [[rng.randrange(10, vocab) for _ in range(64)] for _ in range(args.requests)]
        s, made = run(engine, batch, 32)
        return {"decode_ms_per_token": decode_ms, "batch_tokens_per_s": made / s}
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.decode_tokens, args.requests = 1, 16, 4
    load = os.getloadavg()[0]
    models = {"cinq-tiny": resolve_model_path("cinq-tiny"), "wide 1024x4": wide_model()}
    rows = []
    for name, path in models.items():
        best: dict[int, dict] = {}
        for r in range(args.rounds):
            for tp in (1, 2):
                got = measure(path, tp, args.threads, args, random.Random(r))
                prev = best.get(tp)
                best[tp] = got if prev is None else {
                    "decode_ms_per_token": min(prev["decode_ms_per_token"], got["decode_ms_per_token"]),
                    "batch_tokens_per_s": max(prev["batch_tokens_per_s"], got["batch_tokens_per_s"])}
                print(f"{name} round {r} TP {tp}: {got}", flush=True)
        rows.append({"model": name, "tp1": best[1], "tp2": best[2],
                     "decode_speedup": best[1]["decode_ms_per_token"] / best[2]["decode_ms_per_token"],
                     "batch_speedup": best[2]["batch_tokens_per_s"] / best[1]["batch_tokens_per_s"]})
        print(rows[-1], flush=True)
    if args.quick:
        return
    meta = {"threads": args.threads, "rounds": args.rounds, "load_average_at_start": load,
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__}
    (RESULTS / "scale.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# Tensor parallelism: TP 1 vs TP 2 on this CPU", "",
             f"Produced by `python benchmarks/scale.py`; see its docstring. {args.threads} cores in all (TP 2: "
             f"{max(1, args.threads // 2)} thread(s) per rank, gloo between the two processes), bf16, best of "
             f"{args.rounds} interleaved rounds. Load average at the start: {load:.2f} on {os.cpu_count()} cores "
             f"(other jobs share them: read the ratios, not absolute times).", "",
             "| model | decode ms/token TP 1 | TP 2 | TP1/TP2 | batch tok/s TP 1 | TP 2 | TP2/TP1 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['tp1']['decode_ms_per_token']:.2f} | "
                     f"{row['tp2']['decode_ms_per_token']:.2f} | {row['decode_speedup']:.2f}x | "
                     f"{row['tp1']['batch_tokens_per_s']:.0f} | {row['tp2']['batch_tokens_per_s']:.0f} | "
                     f"{row['batch_speedup']:.2f}x |")
    (RESULTS / "scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
