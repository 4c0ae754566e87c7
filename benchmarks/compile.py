"""torch.compile of the decode step against eager, batch 1, in the same run: ms per decode step (wall and process
CPU), start-up compile time (a cold inductor cache, then a warm one), and whether the greedy tokens are equal.

Each measurement is a subprocess (alternating eager / compiled, ``--rounds`` times, so drifting load on this
shared machine hits both alike) timing benchmarks/step_breakdown.py's clean step (its engine and loop: a 32-token
prompt, 20 warm-up decode steps, then ``--repeats`` x ``--steps`` timed steps); medians are reported. Models:
cinq-tiny bf16 and its RTN int4 (g128, LM head int4) version.

    python benchmarks/compile.py                    # cinq-tiny bf16 + int4, 1 thread
    python benchmarks/compile.py --threads 1,2
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


def measure(model: str, threads: int, steps: int, repeats: int, compilation: dict[str, Any] | None) -> dict[str, Any]:
    """One configuration's numbers (in a child process): benchmarks/step_breakdown.py's engine and clean step."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_breakdown import _engine, clean_steps

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
    ap.add_argument("--no-int4", action="store_true", help="cinq-tiny bf16 only")
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
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "inductor"  # starts empty: the first compiled run pays a cold compile
        for name, model in models.items():
            for threads in [int(x) for x in args.threads.split(",")]:
                samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for _ in range(args.rounds):
                    for label, cfg in (("eager", None), ("compiled", COMPILED)):
                        r = _child(model, threads, args.steps, args.repeats, cfg, cache)
                        samples[label].append(r)
                        print(f"{name} t={threads} {label}: {r['step_ms_median']:.3f} ms/step "
                              f"({r['cpu_ms_median']:.3f} CPU ms), start-up {r['startup_s']:.1f} s (compile "
                              f"{r['compile_s']:.1f} s), load {r['loadavg'][0]:.2f}", flush=True)
                e, c = samples["eager"], samples["compiled"]
                run = {"model": name, "threads": threads, "eager": _merge(e), "compiled": _merge(c),
                       "compile_s_each": [s["compile_s"] for s in c],
                       "tokens_equal": all(s["first_tokens"] == e[0]["first_tokens"] for s in e + c)}
                run["ratio_wall"] = run["eager"]["step_ms_median"] / run["compiled"]["step_ms_median"]
                run["ratio_cpu"] = run["eager"]["cpu_ms_median"] / run["compiled"]["cpu_ms_median"]
                print(f"{name} t={threads}: eager / compiled = {run['ratio_wall']:.2f}x wall, "
                      f"{run['ratio_cpu']:.2f}x CPU; tokens equal: {run['tokens_equal']}", flush=True)
                runs.append(run)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dispatch-only"], check=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True).stdout
    dispatch = json.loads(out.strip().splitlines()[-1])
    print(f"one native call: {dispatch['direct_us']:.1f} us direct, {dispatch['custom_op_us']:.1f} us as a custom op")
    write({"compilation_config": COMPILED, "runs": runs, "dispatch": dispatch})


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
    cfg = json.dumps(result["compilation_config"])
    lines = ["# torch.compile of the decode step vs eager (batch 1, same run)", "",
             f"`python benchmarks/compile.py`: greedy batch-1 decode after a 32-token prompt, bf16 compute; "
             f"compiled = `--compilation-config '{cfg}'`, eager = the default. Eager and compiled alternate in "
             "subprocesses; ms / step are medians over repeats and rounds (wall, and process CPU time, which "
             "leaves out the waits on this shared 2-core machine). Compile time is the start-up compile of the "
             "batch-1 step: the benchmark's first compiled run (the first model's) starts from an empty inductor cache "
             "(cold), later ones reuse it (warm). With the machine this loaded, wall times mostly measure waiting "
             "for a core: read the CPU column.", "",
             "| model | threads | eager ms / step (wall, CPU) | compiled ms / step (wall, CPU) | eager / compiled "
             "(wall, CPU) | compile s (cold, then warm) | start-up s (eager, compiled) | greedy tokens equal | "
             "load avg (1 min) |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in result["runs"]:
        e, c = r["eager"], r["compiled"]
        loads = ", ".join(f"{x[0]:.1f}" for x in e["loadavg"] + c["loadavg"])
        lines.append(f"| {r['model']} | {r['threads']} | {e['step_ms_median']:.3f}, {e['cpu_ms_median']:.3f} | "
                     f"{c['step_ms_median']:.3f}, {c['cpu_ms_median']:.3f} | {r['ratio_wall']:.2f}x, "
                     f"{r['ratio_cpu']:.2f}x | {', '.join(f'{s:.1f}' for s in r['compile_s_each'])} | "
                     f"{e['startup_s']:.1f}, {c['startup_s']:.1f} | {r['tokens_equal']} | {loads} |")
    d = result.get("dispatch")
    if d:
        extra_us = d["custom_op_us"] - d["direct_us"]
        lines += ["", f"Why: the compiled step calls each native kernel through its torch custom op "
                  f"(`torch.ops.cinq.*`, a Python kernel behind the dispatcher): {d['custom_op_us']:.1f} us a call "
                  f"against {d['direct_us']:.1f} us for the direct extension call of eager steps (one batch-1 "
                  f"RMSNorm, measured in this run). Per decode step (an estimate from these two figures):", "",
                  "| model | native calls / step | extra dispatch (ms) | compiled - eager CPU (ms) | so inductor saves "
                  "on the rest (ms) |", "|---|---:|---:|---:|---:|"]
        for r in result["runs"]:
            n = r["eager"]["native_calls_per_step"]
            tax = n * extra_us / 1e3
            loss = r["compiled"]["cpu_ms_median"] - r["eager"]["cpu_ms_median"]
            lines.append(f"| {r['model']} | {n} | {tax:.2f} | {loss:+.2f} | {tax - loss:.2f} |")
        lines += ["", "Registering the kernels in C++ (TORCH_LIBRARY, no Python in the dispatch; not tried) could "
                  "remove most of that tax, for a gain of about the last column; the rest of the step is the "
                  "weight stream, which compiling does not change."]
    lines += ["", "A ratio above 1 means the compiled step is faster. The default stays eager unless the compiled "
              "batch-1 step is faster here and its start-up compile acceptable (docs/architecture.md, Decisions).",
              ""]
    (RESULTS / "compile.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'compile.md'}")


if __name__ == "__main__":
    main()
