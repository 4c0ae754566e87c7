"""torch.compile of the decode step against eager, batch 1, in the same run: ms per decode step (wall and process
CPU), start-up compile time (a cold inductor cache, then a warm one), and whether the greedy tokens are equal. Two
compiled modes: inductor's Python wrapper (the default) and its ``cpp_wrapper`` (C++ between the kernels).

Each measurement is a subprocess (alternating eager / compiled, ``--rounds`` times, so drifting load on this
shared machine hits both alike) timing benchmarks/step_breakdown.py's clean step (its engine and loop: a 32-token
prompt, 20 warm-up decode steps, then ``--repeats`` x ``--steps`` timed steps); medians are reported. Models:
cinq-tiny bf16, its RTN int4 (g128, LM head int4) version and SmolLM2-135M-Instruct bf16.

    python benchmarks/compile.py                    # cinq-tiny bf16 + int4 + SmolLM2 bf16, 1 thread
    python benchmarks/compile.py --no-int4 --cpp-wrapper cinq-tiny --rounds 1   # the quiet rerun (~6-8 min)
    python benchmarks/compile.py --render           # the .md again from the saved .json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
COMPILED = {"mode": 3, "backend": "inductor", "compile_sizes": [1]}
CONFIGS: dict[str, dict[str, Any] | None] = {
    "eager": None, "compiled": COMPILED,
    "cpp_wrapper": {**COMPILED, "inductor_compile_config": {"cpp_wrapper": True}}}


def measure(model: str, threads: int, steps: int, repeats: int, compilation: dict[str, Any] | None) -> dict[str, Any]:
    """One configuration's numbers (in a child process): benchmarks/step_breakdown.py's engine and clean step."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_breakdown_measure import _engine, clean_steps

    t0 = time.perf_counter()
    engine = _engine(model, threads, compilation_config=compilation)
    startup_s = time.perf_counter() - t0  # the engine's start-up (compiling included) and the prompt's prefill
    compiled = engine.executor.runner.compiled
    step_ms, cpu_ms = clean_steps(engine, steps, repeats)
    tokens = engine.scheduler.running[0].output_token_ids
    return {"threads": threads, "startup_s": startup_s, "native_calls_per_step": _count_native_calls(engine),
            "compile_s": sum(compiled.compile_times_s.values()) if compiled is not None else 0.0,
            "compiled_steps": compiled.steps if compiled is not None else 0,
            "step_ms_median": statistics.median(step_ms), "step_ms_all": step_ms,
            "cpu_ms_median": statistics.median(cpu_ms), "cpu_ms_all": cpu_ms,
            "first_tokens": list(tokens[:64]), "loadavg": os.getloadavg()}


def _count_native_calls(engine: Any) -> int:
    """Native kernel calls in one decode step (each is one torch.ops.cinq call in the compiled step); 0 when the
    step runs compiled (the graph calls the ops without Python)."""
    import cinq.kernels.cpu_native as cpu_native
    import cinq.layers.quantization.native as int4_native

    calls = [0]
    real = cpu_native.call_native

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)
    cpu_native.call_native = int4_native.call_native = counted
    try:
        engine.step()
    finally:
        cpu_native.call_native = int4_native.call_native = real
    return calls[0]


def dispatch_cost(calls: int = 5000) -> dict[str, float]:
    """Microseconds per call of one batch-1 RMSNorm kernel ([1, 384] bf16, cinq-tiny's width): the extension
    called directly (eager steps) and through its custom op torch.ops.cinq.rms_norm (the compiled step), in
    alternation."""
    import torch

    from cinq.kernels import custom_ops  # noqa: F401
    from cinq.kernels.cpu_native import native_module

    mod = native_module("rms_norm")
    x, w = torch.randn(1, 384).to(torch.bfloat16), torch.ones(384, dtype=torch.bfloat16)
    ways = {"direct_us": lambda: mod.rms_norm(x, x, w, 1e-5),
            "custom_op_us": lambda: torch.ops.cinq.rms_norm(x, x, w, 1e-5)}
    samples: dict[str, list[float]] = defaultdict(list)
    with torch.inference_mode():
        for _ in range(5):
            for name, fn in ways.items():
                for _ in range(200):
                    fn()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append(1e6 * (time.perf_counter() - t0) / calls)
    return {name: statistics.median(v) for name, v in samples.items()}


def _child(model: str, threads: int, steps: int, repeats: int, compilation: dict[str, Any] | None,
           inductor_cache: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
               TORCHINDUCTOR_CACHE_DIR=str(inductor_cache))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure-only", "--model", model, "--threads",
           str(threads), "--steps", str(steps), "--repeats", str(repeats), "--config", json.dumps(compilation)]
    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _int4_model() -> str:
    """cinq-tiny quantized RTN int4 (group 128, GPTQ format, LM head int4), built once into the cinq cache."""
    from cinq.assets import resolve_model_path
    from cinq.cache import cache_dir
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model

    out = cache_dir() / "bench-cinq-tiny-int4"
    if not (out / "config.json").is_file():
        quantize_model(resolve_model_path("cinq-tiny"), out,
                       QuantConfig(method="rtn", bits=4, group_size=128, lm_head=True), progress=False)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1", help="torch thread counts to measure")
    ap.add_argument("--steps", type=int, default=50, help="decode steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats (medians are reported)")
    ap.add_argument("--rounds", type=int, default=2, help="eager/compiled alternations per configuration")
    ap.add_argument("--no-int4", action="store_true", help="no cinq-tiny int4")
    ap.add_argument("--no-smollm2", action="store_true", help="no SmolLM2-135M-Instruct bf16")
    ap.add_argument("--cpp-wrapper", choices=("all", "cinq-tiny", "none"), default="all",
                    help="which models also run inductor's cpp_wrapper (its cold compile of SmolLM2 took 15 min on a "
                         "loaded machine)")
    ap.add_argument("--model", default="cinq-tiny")
    ap.add_argument("--config", default="null", help=argparse.SUPPRESS)
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dispatch-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--render", action="store_true", help="rewrite the .md from the saved .json (no measuring)")
    args = ap.parse_args()
    if args.render:
        write(json.loads((RESULTS / "compile.json").read_text()))
        return
    if args.dispatch_only:
        print(json.dumps(dispatch_cost()))
        return
    if args.measure_only:
        from cinq.process_env import set_omp_wait_policy
        set_omp_wait_policy()
        print(json.dumps(measure(args.model, int(args.threads), args.steps, args.repeats, json.loads(args.config))))
        return
    models = {"cinq-tiny bf16": "cinq-tiny"}
    if not args.no_int4:
        models["cinq-tiny int4 (RTN g128)"] = _int4_model()
    if not args.no_smollm2:
        models["smollm2-135m-instruct bf16"] = "smollm2-135m-instruct"
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "inductor"  # starts empty: the first compiled run pays a cold compile
        for name, model in models.items():
            cpp = args.cpp_wrapper == "all" or (args.cpp_wrapper == "cinq-tiny" and name.startswith("cinq-tiny"))
            configs = {k: v for k, v in CONFIGS.items() if cpp or k != "cpp_wrapper"}
            for threads in [int(x) for x in args.threads.split(",")]:
                samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for _ in range(args.rounds):
                    for label, cfg in configs.items():
                        r = _child(model, threads, args.steps, args.repeats, cfg, cache)
                        samples[label].append(r)
                        print(f"{name} t={threads} {label}: {r['step_ms_median']:.3f} ms/step "
                              f"({r['cpu_ms_median']:.3f} CPU ms), start-up {r['startup_s']:.1f} s (compile "
                              f"{r['compile_s']:.1f} s), load {r['loadavg'][0]:.2f}", flush=True)
                e = samples["eager"]
                run = {"model": name, "threads": threads, **{k: _merge(v) for k, v in samples.items()},
                       "tokens_equal": all(s["first_tokens"] == e[0]["first_tokens"] for v in samples.values()
                                           for s in v)}
                for label in configs:
                    if label != "eager":
                        run[f"compile_s_each_{label}"] = [s["compile_s"] for s in samples[label]]
                        run[f"ratio_wall_{label}"] = run["eager"]["step_ms_median"] / run[label]["step_ms_median"]
                        run[f"ratio_cpu_{label}"] = run["eager"]["cpu_ms_median"] / run[label]["cpu_ms_median"]
                        print(f"{name} t={threads}: eager / {label} = {run[f'ratio_wall_{label}']:.2f}x wall, "
                              f"{run[f'ratio_cpu_{label}']:.2f}x CPU", flush=True)
                print(f"{name} t={threads}: tokens equal: {run['tokens_equal']}", flush=True)
                runs.append(run)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dispatch-only"], check=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True).stdout
    dispatch = json.loads(out.strip().splitlines()[-1])
    print(f"one native call: {dispatch['direct_us']:.1f} us direct, {dispatch['custom_op_us']:.1f} us as a custom op")
    write({"configs": CONFIGS, "runs": runs, "dispatch": dispatch})


def _merge(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Several child runs of one configuration: medians of the per-run medians."""
    out = dict(samples[-1])
    for key in ("step_ms_median", "cpu_ms_median", "startup_s"):
        out[key] = statistics.median(s[key] for s in samples)
    out["step_ms_all"] = [x for s in samples for x in s["step_ms_all"]]
    out["loadavg"] = [s["loadavg"] for s in samples]
    return out


def write(result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compile.json").write_text(json.dumps(result, indent=2) + "\n")
    labels = [k for k in result["configs"] if k != "eager"]
    lines = ["# The compiled decode step vs eager (batch 1, same run)", "",
             "`python benchmarks/compile.py`: greedy batch-1 decode after a 32-token prompt, bf16 compute; "
             + "; ".join(f"{k} = `--compilation-config '{json.dumps(v)}'`" for k, v in result["configs"].items()
                         if v is not None)
             + ", eager = the default. The compiled steps run over the persistent step buffers "
             "(cinq/engine/step_buffers.py) and call the native kernels as C++-registered ops. Configurations "
             "alternate in subprocesses; ms / step are medians over repeats and rounds (wall, and process CPU "
             "time, which leaves out the waits on a shared machine). Compile time is the start-up compile of the "
             "batch-1 step: the first compiled run starts from an empty inductor cache (cold), later ones reuse "
             "it (warm: what a second start pays).", "",
             "| model | threads | config | ms / step (wall, CPU) | eager / this (wall, CPU) | compile s (each run) | "
             "start-up s | load avg (1 min) |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in result["runs"]:
        for label in [k for k in result["configs"] if k in r]:
            c = r[label]
            loads = ", ".join(f"{x[0]:.1f}" for x in c["loadavg"])
            ratio = ("" if label == "eager" else
                     f"{r[f'ratio_wall_{label}']:.2f}x, {r[f'ratio_cpu_{label}']:.2f}x")
            each = ", ".join(f"{x:.1f}" for x in r.get(f"compile_s_each_{label}", []))
            lines.append(f"| {r['model']} | {r['threads']} | {label} | {c['step_ms_median']:.3f}, "
                         f"{c['cpu_ms_median']:.3f} | {ratio} | {each} | {c['startup_s']:.1f} | {loads} |")
        lines.append(f"| | | greedy tokens equal across configs: {r['tokens_equal']} | | | | | |")
    d = result.get("dispatch")
    if d:
        lines += ["", f"One batch-1 RMSNorm call ([1, 384] bf16), measured in this run: {d['direct_us']:.1f} us "
                  f"through the extension's pybind function (eager steps), {d['custom_op_us']:.1f} us through "
                  "`torch.ops.cinq.rms_norm` (now registered in C++; before this change a Python custom op, "
                  "10.4 us)."]
    lines += ["", "A ratio above 1 means the compiled step is faster. The default stays eager unless a compiled "
              "batch-1 step is faster here and its start-up compile acceptable (docs/architecture.md, Decisions).",
              ""]
    (RESULTS / "compile.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'compile.md'}")


if __name__ == "__main__":
    main()
