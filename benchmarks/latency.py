"""Batch-1 decode latency, side by side: cinq, llama.cpp (same weights, exported by `cinq export --format gguf`)
and Hugging Face transformers `generate`, in one process, on the same prompt token ids.

Models: the embedded cinq-tiny and the ~110M random Llama of benchmarks/throughput.py (hidden 768, 12 layers,
vocab 32000, tied embeddings). Precisions, paired by the bytes a decode step reads:
* cinq bf16        vs llama.cpp bf16 (and HF bf16);
* cinq int8 (RTN 8-bit per channel, GPTQ file)  vs llama.cpp q8_0 (blocks of 32, one scale each);
* cinq int4 (GPTQ 4-bit, group 128, cinq's quantizer on a small calibration set: speed does not depend on how
  the integers were chosen)  vs llama.cpp q4_0 (blocks of 32, embedding and output q8_0; cinq's int4 keeps
  the LM head bf16).
Each measurement: a greedy generation of --new-tokens tokens after a prompt of 128 (and 1024) random ids; the
prefill is timed apart; ms/step = the median decode step of a generation, decode tok/s = 1000 / that (the
mean is kept in the JSON), then medians over --rounds rounds. HF's steps are not seen one by one: its ms/step
is (generate(N + 1) - generate(1)) / N. Threads 1 and 2 (torch threads for cinq and HF; n_threads for
llama.cpp). The machine is shared and noisy: every round runs every engine once per setting, in an order
rotated each round, and the load average is recorded with every measurement.

llama.cpp is an optional baseline: `pip install 'cinq[llama]'` (llama-cpp-python, compiled from source). When it
is absent the table says so and the other rows are still measured.

    python benchmarks/latency.py                # writes benchmarks/results/latency.{md,json}
    python benchmarks/latency.py --quick        # smoke run: cinq-tiny, prompt 128, 1 round, not written
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py

import torch  # noqa: E402

from benchmarks.throughput import build_model  # noqa: E402
from cinq.assets import resolve_model_path  # noqa: E402
from cinq.cache import cache_dir  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402
from cinq.engine.engine import LLMEngine  # noqa: E402
from cinq.sampling_params import OutputKind, SamplingParams  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORK = cache_dir() / "bench-latency"
# engine -> the llama.cpp engine it is compared with
PAIRS = {"cinq bf16": "llama.cpp bf16", "cinq int8": "llama.cpp q8_0", "cinq int4": "llama.cpp q4_0",
         "HF bf16": "llama.cpp bf16"}
ENGINE_ORDER = ["cinq bf16", "llama.cpp bf16", "HF bf16", "cinq int8", "llama.cpp q8_0", "cinq int4", "llama.cpp q4_0"]


def prepare_model(name: str) -> tuple[Path, int]:
    """(dense folder, vocab size) of a benchmark model."""
    if name == "cinq-tiny":
        return resolve_model_path("cinq-tiny", "model"), 8192
    return build_model(WORK / "llama-110m", 768, 12, 12, 2048, 32000), 32000


def quantized(src: Path, tag: str, bits: int, method: str, vocab: int) -> Path:
    """A cinq quantized folder of ``src`` (cached): RTN per channel for 8 bits, GPTQ group 128 for 4 bits."""
    from cinq.quant.calibration import calibration_windows
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model

    out = WORK / f"{tag}-{method}{bits}"
    if (out / "config.json").is_file():
        return out
    calib = None
    if method == "gptq":  # a small calibration set: the kernel's speed does not depend on it
        rng = random.Random(0)
        calib = calibration_windows([rng.randrange(300, vocab) for _ in range(16 * 128)], 16, 128, 0)
    cfg = QuantConfig(method=method, bits=bits, group_size=128 if bits == 4 else -1, sym=True)
    quantize_model(src, out, cfg, calib, progress=False)
    return out


def gguf_file(src: Path, tag: str, outtype: str) -> Path:
    from cinq.export.gguf import export_gguf
    out = WORK / f"{tag}-{outtype}.gguf"
    if not out.is_file():
        export_gguf(src, out, outtype)
    return out


class CinqRunner:
    def __init__(self, folder: Path, max_len: int) -> None:
        self.engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", kv_cache_memory=0.25,
                                             max_model_len=max_len, max_num_batched_tokens=max_len,
                                             enable_prefix_caching=False, seed=0))
        self.n = 0

    def run(self, prompt: list[int], new_tokens: int) -> dict:
        self.n += 1
        self.engine.add_request(f"r{self.n}", prompt, SamplingParams(
            temperature=0, max_tokens=new_tokens, ignore_eos=True, output_kind=OutputKind.FINAL_ONLY))
        t0 = time.perf_counter()
        self.engine.step()  # the whole prompt in one step (budget = max_len) and the first token
        prefill = time.perf_counter() - t0
        steps, tokens = [], []
        while self.engine.has_unfinished_requests():
            t = time.perf_counter()
            outs = self.engine.step()
            steps.append(time.perf_counter() - t)
            for o in outs:
                tokens = list(o.outputs[0].token_ids)
        return {"prefill_s": prefill, "step_s": steps, "tokens": tokens}


class LlamaCppRunner:
    def __init__(self, path: Path, threads: int, max_len: int) -> None:
        from cinq.export.llama_cpp import LlamaCppGreedy
        self.g = LlamaCppGreedy(path, threads, n_ctx=max_len)

    def run(self, prompt: list[int], new_tokens: int) -> dict:
        r = self.g.generate(prompt, new_tokens)
        return {"prefill_s": r.prefill_s, "step_s": r.step_s, "tokens": r.token_ids}


class HFRunner:
    """transformers `generate` (greedy, KV cache); decode time = generate(N + 1) - generate(1), the prefill and
    first token being the same work in both."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()

    def _generate(self, prompt: list[int], n: int) -> tuple[float, list[int]]:
        ids = torch.tensor([prompt])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0, out[0, len(prompt):].tolist()

    def run(self, prompt: list[int], new_tokens: int) -> dict:
        first, _ = self._generate(prompt, 1)
        total, tokens = self._generate(prompt, new_tokens)
        decode = max(total - first, 1e-9)
        return {"prefill_s": first, "step_s": [decode / (new_tokens - 1)] * (new_tokens - 1), "tokens": tokens}


def llama_cpp_available() -> str | None:
    """None when llama-cpp-python imports, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python not installed ({e.name}); pip install 'cinq[llama]'"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cinq-tiny,llama-110m")
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--quick", action="store_true", help="cinq-tiny, prompt 128, 1 round, 16 tokens; not written")
    ap.add_argument("--render", action="store_true", help="rewrite latency.md from latency.json, measuring nothing")
    args = ap.parse_args()
    if args.render:
        (RESULTS / "latency.md").write_text(render(json.loads((RESULTS / "latency.json").read_text())))
        return 0
    if args.quick:
        args.models, args.prompt_lens, args.rounds, args.new_tokens = "cinq-tiny", "128", 1, 16
    models = args.models.split(",")
    prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    threads = [int(x) for x in args.threads.split(",")]
    max_len = max(prompt_lens) + args.new_tokens + 16
    WORK.mkdir(parents=True, exist_ok=True)
    absent = llama_cpp_available()
    print(f"llama.cpp baseline: {'ABSENT: ' + absent if absent else 'present'}", flush=True)

    measurements: list[dict] = []
    for model in models:
        src, vocab = prepare_model(model)
        runners: dict[tuple[str, int], object] = {}
        for t in threads:  # cinq and HF: one instance, torch's threads set per measurement
            runners[("cinq bf16", t)] = runners.get(("cinq bf16", threads[0])) or CinqRunner(src, max_len)
            runners[("cinq int8", t)] = runners.get(("cinq int8", threads[0])) or CinqRunner(
                quantized(src, model, 8, "rtn", vocab), max_len)
            runners[("cinq int4", t)] = runners.get(("cinq int4", threads[0])) or CinqRunner(
                quantized(src, model, 4, "gptq", vocab), max_len)
            if not args.skip_hf:
                runners[("HF bf16", t)] = runners.get(("HF bf16", threads[0])) or HFRunner(src)
            if not absent:
                for q in ("bf16", "q8_0", "q4_0"):
                    runners[(f"llama.cpp {q}", t)] = LlamaCppRunner(gguf_file(src, model, q), t, max_len)
        rng = random.Random(1)
        prompts = {n: [rng.randrange(300, vocab) for _ in range(n)] for n in prompt_lens}
        keys = list(runners)
        for rnd in range(args.rounds + 1):  # round 0 warms every engine up and is not kept
            rot = rnd % len(keys)
            for n in prompt_lens:
                for name, t in keys[rot:] + keys[:rot]:
                    torch.set_num_threads(t)
                    r = runners[(name, t)].run(prompts[n], args.new_tokens)
                    steps = r["step_s"]
                    # tok/s from the median step: one descheduled step on the shared cores moves a mean, not this
                    m = {"model": model, "engine": name, "threads": t, "prompt_len": n, "round": rnd,
                         "tok_s": 1 / statistics.median(steps), "tok_s_mean": len(steps) / sum(steps),
                         "ms_step": 1000 * statistics.median(steps),
                         "prefill_s": r["prefill_s"], "tokens": r["tokens"], "loadavg": os.getloadavg()}
                    if rnd:
                        measurements.append(m)
                    print(f"[{model} p{n} t{t} round {rnd}] {name}: {m['tok_s']:.1f} tok/s, {m['ms_step']:.2f} "
                          f"ms/step, prefill {m['prefill_s']:.2f} s, load {m['loadavg'][0]:.1f}", flush=True)
        del runners
    result = summarize(measurements, args, absent)
    print(render(result))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "latency.json").write_text(json.dumps(result, indent=1))
        (RESULTS / "latency.md").write_text(render(result))
    return 0


def summarize(ms: list[dict], args: argparse.Namespace, absent: str | None) -> dict:
    rows: dict[tuple, dict] = {}
    for m in ms:
        key = (m["model"], m["prompt_len"], m["threads"], m["engine"])
        rows.setdefault(key, {"tok_s": [], "tok_s_mean": [], "ms_step": [], "prefill_s": [], "loadavg": [],
                              "tokens": m["tokens"]})
        for f in ("tok_s", "tok_s_mean", "ms_step", "prefill_s"):
            rows[key][f].append(m[f])
        rows[key]["loadavg"].append(m["loadavg"][0])
    table = []
    for (model, n, t, engine), r in rows.items():
        med = statistics.median(r["tok_s"])
        base = rows.get((model, n, t, PAIRS.get(engine, "")))
        table.append({"model": model, "prompt_len": n, "threads": t, "engine": engine, "tok_s": med,
                      "tok_s_runs": r["tok_s"], "tok_s_mean_runs": r["tok_s_mean"],
                      "ms_step": statistics.median(r["ms_step"]),
                      "prefill_s": statistics.median(r["prefill_s"]), "loadavg_1m": r["loadavg"],
                      "vs": PAIRS.get(engine), "ratio": med / statistics.median(base["tok_s"]) if base else None,
                      "first_tokens": r["tokens"][:8]})
    table.sort(key=lambda x: (x["model"], x["prompt_len"], x["threads"], ENGINE_ORDER.index(x["engine"])))
    return {"rows": table, "llama_cpp_absent": absent, "new_tokens": args.new_tokens, "rounds": args.rounds,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "torch": torch.__version__, "llama_cpp": _llama_cpp_version(),
                        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}}


def _llama_cpp_version() -> str | None:
    try:
        import llama_cpp
        return llama_cpp.__version__
    except ImportError:
        return None


def render(r: dict) -> str:
    rows = {(x["model"], x["prompt_len"], x["threads"], x["engine"]): x for x in r["rows"]}
    lines = ["# Batch-1 decode latency: cinq vs llama.cpp vs HF transformers", "",
             "Written by `python benchmarks/latency.py` (method in its docstring). Decode tok/s = 1000 / the "
             f"median ms per decode step, medians of {r['rounds']} interleaved rounds, {r['new_tokens']} new "
             "tokens after the prompt (same random prompt ids for every engine), the prefill timed apart. ratio: "
             "this row's tok/s over the llama.cpp row it is paired with (bf16 - bf16, int8 - q8_0, int4 - q4_0; "
             "HF bf16 - llama.cpp bf16) in the same run; extra ms: this row's ms/step minus that row's.", ""]
    if r["llama_cpp_absent"]:
        lines += [f"**llama.cpp baseline ABSENT**: {r['llama_cpp_absent']}. Its rows and the ratios are missing.",
                  ""]
    else:
        for engine, goal in (("cinq bf16", "bf16 >= 1.0x llama.cpp bf16"), ("cinq int4", "int4 >= 1.0x q4_0")):
            ratios = [x["ratio"] for x in r["rows"] if x["engine"] == engine and x["ratio"] is not None]
            if ratios:
                verdict = "met" if min(ratios) >= 1.0 else "**missed**"
                lines.append(f"- goal {goal}: {verdict} ({min(ratios):.2f}x to {max(ratios):.2f}x over "
                             f"{len(ratios)} settings)")
        lines.append("")
    lines += ["| model | prompt | threads | engine | decode tok/s | ms/step | prefill s | ratio | vs | extra ms "
              "| load (1 min) |", "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---|"]
    for x in r["rows"]:
        base = rows.get((x["model"], x["prompt_len"], x["threads"], x["vs"]))
        ratio = f"**{x['ratio']:.2f}x**" if x["ratio"] is not None else "n/a"
        vs = x["vs"] if x["ratio"] is not None else ("absent" if x["vs"] else "")
        extra = f"{x['ms_step'] - base['ms_step']:+.2f}" if base else ""
        load = ", ".join(f"{v:.1f}" for v in x["loadavg_1m"])
        lines.append(f"| {x['model']} | {x['prompt_len']} | {x['threads']} | {x['engine']} | {x['tok_s']:.1f} | "
                     f"{x['ms_step']:.2f} | {x['prefill_s']:.2f} | {ratio} | {vs} | {extra} | {load} |")
    m = r["machine"]
    lines += ["", f"Machine: {m['cpu']}, {m['cores']} cores (shared with other jobs: see the load column), torch "
                  f"{m['torch']}, llama-cpp-python {m['llama_cpp'] or 'absent'}, OMP_WAIT_POLICY="
                  f"{m['omp_wait_policy']} for every engine (one process)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
