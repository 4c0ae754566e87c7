"""Which parts of a batch-1 decode step gain from a second thread: the step's time at 1 and 2 threads per precision
variant, split into the stepping thread's kernels (per op and weight shape, from the torch profiler) and host time,
each 2-thread figure over its 1-thread one from the same run; and, at 2 threads, a layer's attention split across
the fused step's team against it whole (``--split-ab``: same process, alternated).

Variants as ``cinq bench latency``'s (cinq/bench/latency_engines.py: bf16; RTN int8 per channel and GPTQ int4 g128
copies of a folder model; a GGUF model's q8_0 / q4_0 files and its own file). Every (variant, threads) runs in its
own child process (the OpenMP pool starts with its thread count and cinq's wait policy), alternated over
``--rounds``; medians over rounds. Clean step: wall ms per step over 50 steps after a 128-token prompt; kernel and
host ms as benchmarks/step_breakdown.py measures them (the stepping thread's kernels under the profiler; host = a
clean run right before minus that, median of 7 pairs): at 2 threads the team's parts on the other thread are not
in the kernel time, and what the step waits for them is. Per op: the stepping thread's self time per step, grouped
by op name and input shapes (the LM head apart from the layers' linears of the same kernel).

    python benchmarks/thread_scaling.py                                   # cinq-tiny bf16 / int8 / int4
    python benchmarks/thread_scaling.py --model smollm2-135m-instruct --variants bf16,file \\
        --out benchmarks/results/thread_scaling_smollm2
    python benchmarks/thread_scaling.py --child int8 2 ...                # one measurement as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# step_breakdown_measure by its bare name, as step_breakdown.py imports it (it imports cinq and torch only inside
# its functions)
sys.path.append(str(Path(__file__).resolve().parent))
import step_breakdown_measure as sbm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOP_OPS = 8  # per variant: the ops with the most 1-thread time
_ATTENTION_PARTS = {"cinq::paged_decode_heads": "cinq::paged_decode", "cinq::paged_decode_seqs": "cinq::paged_decode"}


def child(model: str, variant: str, threads: int, prompt_len: int, work: Path) -> dict[str, Any]:
    """One (variant, threads) measurement in this process."""
    from cinq.process_env import set_omp_wait_policy
    set_omp_wait_policy()
    import torch

    from cinq.bench.latency_engines import variant_config
    from cinq.config import EngineConfig

    cfg = variant_config(EngineConfig(model=model), variant, work)
    torch.set_num_threads(threads)
    engine = sbm._engine(cfg.model, threads, prompt_len=prompt_len)
    step, _ = sbm.clean_steps(engine, 50, 5)
    kernels, host, _ = sbm.host_and_kernel_ms(engine)
    return {"variant": variant, "threads": threads, "step_ms": statistics.median(step), "kernel_ms": kernels,
            "host_ms": host, "ops_us": per_op_us(engine, linear_names(engine.model_config)),
            "weight_mb": sbm._weight_mb(engine)}


def split_ab(model: str, variant: str, prompt_len: int, work: Path, alternations: int = 12) -> dict[str, Any]:
    """At 2 threads in this process: the fused step with a layer's attention split across the team (the default
    threshold) against it whole on the stepping thread (threshold past any context), blocks of 30 steps
    alternated in rotated order; medians of the wall ms per step."""
    from cinq.process_env import set_omp_wait_policy
    set_omp_wait_policy()
    from cinq.bench.latency_engines import variant_config
    from cinq.config import EngineConfig
    from cinq.kernels.cpu_native import native_module

    engine = sbm._engine(variant_config(EngineConfig(model=model), variant, work).model, 2, prompt_len=prompt_len)
    mod = native_module("decode_layers")
    default = mod.min_attention_split_bytes()
    ms: dict[str, list[float]] = {"split": [], "whole": []}
    try:
        for i in range(alternations):
            for arm in ("split", "whole") if i % 2 == 0 else ("whole", "split"):
                mod.set_min_attention_split_bytes(default if arm == "split" else 1 << 40)
                for _ in range(3):
                    engine.step()
                t0 = time.perf_counter()
                for _ in range(30):
                    engine.step()
                ms[arm].append((time.perf_counter() - t0) / 30 * 1e3)
    finally:
        mod.set_min_attention_split_bytes(default)
    return {"variant": variant, "prompt_len": prompt_len, "split_ms": statistics.median(ms["split"]),
            "whole_ms": statistics.median(ms["whole"])}


def linear_names(cfg: Any) -> dict[tuple[int, int], str]:
    """(input channels, output rows) -> the decode step's linear it is: qkv_proj, o_proj, gate_up_proj, down_proj,
    lm_head; a split linear's part (half its rows, either rounding) too, named '<linear> (part)'."""
    q, kv, h, i = cfg.q_size, cfg.kv_size, cfg.hidden_size, cfg.intermediate_size
    full = {(h, q + 2 * kv): "qkv_proj", (q, h): "o_proj", (h, 2 * i): "gate_up_proj", (i, h): "down_proj",
            (h, cfg.vocab_size): "lm_head"}
    names = {(k, n - n // 2): f"{name} (part)" for (k, n), name in full.items()}
    names.update({(k, n // 2): f"{name} (part)" for (k, n), name in full.items()})
    return {**names, **full}


def per_op_us(engine: Any, names: dict[tuple[int, int], str], steps: int = 30) -> dict[str, float]:
    """The stepping thread's self microseconds per step by op and what it computes: a linear kernel by the linear
    it serves (``names``: its activations' width and its weight's rows), any other op by its first input shapes
    (the native kernels through their registered ops, as step_breakdown_measure.kernel_ms routes them)."""
    events, _ = sbm.stepping_thread_ops(engine, steps, record_shapes=True)
    out: dict[str, float] = defaultdict(float)
    for e in events:
        shapes = [s for s in (e.input_shapes or []) if s][:2]
        linear = (names.get((shapes[0][-1], shapes[1][0])) if len(shapes) == 2 and len(shapes[0]) == 2
                  and "linear" in e.name else None)
        # a split linear's parts write into the whole output (the kernel's _out form): the same kernel;
        # attention split across the team runs a part of paged_decode per thread (by heads or sequences)
        name = e.name.removesuffix("_out")
        part = _ATTENTION_PARTS.get(name)
        key = f"{part} {shapes} (part)" if part else f"{name} {linear or shapes}"
        out[key] += e.self_cpu_time_total / steps
    return dict(out)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every (variant, threads) in its own child, alternated over rounds (order rotated each round)."""
    configs = [(v, t) for v in args.variants.split(",") for t in (1, 2)]
    samples: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in range(args.rounds):
        for v, t in configs[r % len(configs):] + configs[:r % len(configs)]:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", v, str(t), "--model", args.model,
                   "--prompt-len", str(args.prompt_len)]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if proc.returncode:
                raise SystemExit(f"{v} at {t} threads failed:\n" + "\n".join(proc.stderr.splitlines()[-15:]))
            s = json.loads(proc.stdout.strip().splitlines()[-1])
            samples[(v, t)].append(s)
            print(f"round {r + 1}: {v} {t} thr {s['step_ms']:.3f} ms/step (kernels {s['kernel_ms']:.3f}, host "
                  f"{s['host_ms']:.3f})", flush=True)
    rows = []
    for (v, t), ss in samples.items():
        ops = {k: statistics.median(s["ops_us"].get(k, 0.0) for s in ss) for k in {k for s in ss for k in s["ops_us"]}}
        rows.append({"variant": v, "threads": t, "weight_mb": ss[0]["weight_mb"], "ops_us": ops,
                     **{k: statistics.median(s[k] for s in ss) for k in ("step_ms", "kernel_ms", "host_ms")},
                     "step_ms_all": [s["step_ms"] for s in ss]})
    ab = []
    for prompt in [int(p) for p in args.split_ab.split(",") if p]:
        for v in args.variants.split(","):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child-ab", v, str(prompt), "--model", args.model]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if proc.returncode:
                raise SystemExit(f"split A/B of {v} failed:\n" + "\n".join(proc.stderr.splitlines()[-15:]))
            ab.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"attention split A/B: {v} prompt {prompt}: split {ab[-1]['split_ms']:.3f} ms, whole "
                  f"{ab[-1]['whole_ms']:.3f} ms", flush=True)
    return {"model": args.model, "prompt_len": args.prompt_len, "rounds": args.rounds, "rows": rows,
            "split_ab": ab}


def render(data: dict[str, Any]) -> str:
    """The markdown of a run."""
    from cinq.bench.report import model_label, run_conditions
    by = {(r["variant"], r["threads"]): r for r in data["rows"]}
    lines = ["# Decode at 1 and 2 threads: which parts gain from the second thread", "",
             f"`python benchmarks/thread_scaling.py --model {model_label(data['model'])} --variants "
             f"{','.join(dict.fromkeys(r['variant'] for r in data['rows']))}` ({data['date']}): batch 1, greedy, "
             f"prompt {data['prompt_len']}, {data['rounds']} round(s) of child processes alternated, medians. "
             f"{run_conditions(data['load_start'])[1]} 2 / 1 = the 1-thread time over the 2-thread time (above 1: "
             "the second thread helps).", "",
             "| variant | weights MB | step ms 1 thr | 2 thr | 2 / 1 | kernels ms 1 thr | 2 thr | 2 / 1 | "
             "host ms 1 thr | 2 thr |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    variants = list(dict.fromkeys(r["variant"] for r in data["rows"]))
    for v in variants:
        a, b = by[(v, 1)], by[(v, 2)]
        lines.append(f"| {v} | {a['weight_mb']:.1f} | {a['step_ms']:.3f} | {b['step_ms']:.3f} | "
                     f"{a['step_ms'] / b['step_ms']:.2f}x | {a['kernel_ms']:.3f} | {b['kernel_ms']:.3f} | "
                     f"{a['kernel_ms'] / b['kernel_ms']:.2f}x | {a['host_ms']:.3f} | {b['host_ms']:.3f} |")
    for v in variants:
        a, b = by[(v, 1)]["ops_us"], by[(v, 2)]["ops_us"]
        top = sorted(a, key=lambda k: -a[k])[:TOP_OPS]
        lines += ["", f"## {v}: the stepping thread's ops (us per step; op [first input shapes])", "",
                  "| op (linear served, or first input shapes) | 1 thr | 2 thr | 2 / 1 |", "|---|---:|---:|---:|"]
        for k in top:
            part = f"{k} (part)" in b  # split across the team: the stepping thread computed its part
            two = b.get(f"{k} (part)" if part else k, 0.0)
            lines.append(f"| `{k}`{' (2 thr: its part)' if part else ''} | {a[k]:.0f} | {two:.0f} | "
                         + (f"{a[k] / two:.2f}x |" if two else " |"))
    if data.get("split_ab"):
        lines += ["", "## A layer's attention split across the team at batch 1, or whole on the stepping thread", "",
                  "2 threads, one process, blocks of 30 steps alternated (12 blocks each, rotated order), medians; "
                  "the context grows from the prompt by ~800 tokens over the blocks. Split: the default threshold "
                  "(query heads on the bf16 path, whole kv heads on the widening one); whole: the threshold past "
                  "any context.", "", "| variant | prompt | split ms / step | whole ms / step | whole / split |",
                  "|---|---:|---:|---:|---:|"]
        for r in data["split_ab"]:
            lines.append(f"| {r['variant']} | {r['prompt_len']} | {r['split_ms']:.3f} | {r['whole_ms']:.3f} | "
                         f"{r['whole_ms'] / r['split_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cinq-tiny")
    ap.add_argument("--variants", default="bf16,int8,int4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out", default=str(RESULTS / "thread_scaling"))
    ap.add_argument("--split-ab", default="128,1024",
                    help="prompt lengths of the split-vs-whole attention A/B at 2 threads ('' skips it)")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "THREADS"), help=argparse.SUPPRESS)
    ap.add_argument("--child-ab", nargs=2, metavar=("VARIANT", "PROMPT_LEN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    from cinq.cache import cache_dir
    work = cache_dir() / "bench-latency"  # the quantized copies cinq bench latency made (or makes) for its variants
    if args.child_ab:
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(split_ab(args.model, args.child_ab[0], int(args.child_ab[1]), work)))
        return
    if args.child:
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(child(args.model, args.child[0], int(args.child[1]), args.prompt_len, work)))
        return
    load_start = os.getloadavg()[0]
    data = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load_start, **measure(args)}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    out.with_suffix(".md").write_text(render(data))
    print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
