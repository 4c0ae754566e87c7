"""Where a batch-1 decode step spends its time: per-phase milliseconds, ATen op and host-sync counts, measured on
this checkout and on a baseline commit in the same run (back to back, each in its own subprocess).

Phases (CPU time of the process, instrumented run: a shared machine preempts us, and CPU time leaves the waits
out): scheduler.schedule, input building (step/batch_inputs.build_batch), the
model forward split into embedding, per-layer input norm / qkv projection / rope / attention (KV write + kernel) /
o projection / post-attention norm / MLP, final norm, LM head (runner._compute_logits), sampler
(runner._sample), scheduler.update and output processing (detokenization). Timers wrap the engine's own objects
(functions and module hooks), so the instrumented step is a little slower than a clean one; the clean step time
is measured separately, without any instrumentation, both as wall time and as process CPU time. Counts (noise-free): ATen ops per decode step (a
TorchDispatchMode counter; the native kernels' calls are not ATen ops and are counted apart) and host syncs
(``Tensor.item`` / ``tolist`` / ``bool`` of a tensor). Host time: a clean run's wall time per step minus the kernel
time of a profiled run right after it (median over 7 pairs of 10 steps), the self (wall) time of the step's
kernels on the thread that runs the step (the native ``cinq::`` kernels, routed
through their registered ops for the profiled steps, and ATen's compute ops; views, allocations and the compiler's
wrappers are host work) under the torch profiler; at 2+ threads the team's parts on other threads overlap it and
are not added, and what the step waits for them is host time.

    python benchmarks/step_breakdown.py                      # cinq-tiny, 1 and 2 threads, vs c961254
    python benchmarks/step_breakdown.py --baseline none --compiled --smollm2 --threads 1
                                                             # eager vs the compiled step, cinq-tiny + SmolLM2
    python benchmarks/step_breakdown.py --model-110m         # + the ~110M random Llama of throughput.py
    python benchmarks/step_breakdown.py --model-110m --int4  # + its int4 versions (LM head int4 / bf16)
    python benchmarks/step_breakdown.py --baseline none      # this checkout only
    python benchmarks/step_breakdown.py --smollm2-only --prompt-len 1024 --batch 4 --baseline 61d4a1a \
        --out benchmarks/results/step_breakdown_context  # long contexts, several sequences (attention's share)
    python benchmarks/step_breakdown.py --render             # the .md again from the saved .json (step_breakdown_report.py)
    python benchmarks/step_breakdown.py --measure-only ...   # one measurement as JSON (what the parent runs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

# The measurement by its bare name, from this script's folder (a script's first path entry; appended for an import
# as benchmarks.step_breakdown), not as benchmarks.step_breakdown_measure: a child (--measure-only) must not have
# this checkout's root on its path, or its `import cinq` could find this checkout instead of the tree it measures.
sys.path.append(str(Path(__file__).resolve().parent))
from step_breakdown_measure import PHASES, measure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BASE_COMMIT = "c961254"
COMPILED = {"mode": 3, "backend": "inductor", "compile_sizes": [1]}  # the compiled decode step measured


def _baseline_tree(commit: str, into: Path) -> Path:
    """The repository's tree at ``commit`` extracted into ``into`` (no checkout, no change to this worktree)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "cinq"],
                             check=True, capture_output=True).stdout
    tar = into / "base.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def _int4_model(dense: Path, lm_head: bool) -> Path:
    """RTN int4 (group 128, GPTQ format) of ``dense``, with the LM head int4 too or left bf16; built once, cached
    next to it."""
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model

    out = dense.with_name(dense.name + ("-int4" if lm_head else "-int4-bf16-head"))
    if not (out / "config.json").is_file():
        quantize_model(dense, out, QuantConfig(method="rtn", bits=4, group_size=128, lm_head=lm_head), progress=False)
    return out


def _child(code_root: Path, model: str, threads: int, steps: int, repeats: int,
           compilation: dict[str, Any] | None = None, prompt_len: int = 32, batch: int = 1) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code_root), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure-only", "--model", model, "--threads",
           str(threads), "--steps", str(steps), "--repeats", str(repeats), "--config", json.dumps(compilation),
           "--prompt-len", str(prompt_len), "--batch", str(batch)]
    proc = subprocess.run(cmd, env=env, cwd=code_root, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"measurement of {model} ({threads} threads) under {code_root} failed:\n"
                           + "\n".join(proc.stderr.strip().splitlines()[-15:]))
    out = proc.stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not Path(result["cinq"]).resolve().is_relative_to(Path(code_root).resolve()):
        raise RuntimeError(f"measured {result['cinq']}, not the code under {code_root}")
    result["cinq"] = str(Path(result["cinq"]).resolve().relative_to(Path(code_root).resolve()))  # no machine paths
    # The roofline this machine allows now: weight bytes over a streaming read measured right after the run, here
    # (the measured checkout may predate cinq.bench, whose probe this is).
    from cinq.plan.probe import read_bandwidth
    bandwidth = read_bandwidth()
    result["read_bandwidth_gb_s"] = bandwidth / 1e9
    result["roofline_ms"] = 1e3 * result["weight_mb"] * 1e6 / bandwidth
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=BASE_COMMIT, help="commit measured as 'before' ('none': skip)")
    ap.add_argument("--threads", default="1,2", help="torch thread counts to measure")
    ap.add_argument("--steps", type=int, default=50, help="decode steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats (medians are reported)")
    ap.add_argument("--rounds", type=int, default=2, help="before/after alternations per configuration")
    ap.add_argument("--model-110m", action="store_true", help="also the ~110M random Llama of throughput.py")
    ap.add_argument("--int4", action="store_true",
                    help="with --model-110m: also its RTN int4 (g128) versions, LM head int4 and bf16 (first "
                         "thread count only)")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct (bf16)")
    ap.add_argument("--smollm2-only", action="store_true", help="SmolLM2-135M-Instruct alone (no cinq-tiny)")
    ap.add_argument("--compiled", action="store_true",
                    help=f"also this checkout's compiled decode step ({json.dumps(COMPILED)}) beside its eager one")
    ap.add_argument("--config", default="null", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="cinq-tiny")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request (the context decoded over)")
    ap.add_argument("--batch", type=int, default=1, help="requests decoding together")
    ap.add_argument("--out", default=str(RESULTS / "step_breakdown"), help="results prefix (.json and .md)")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--render", action="store_true", help="rewrite the .md from the saved .json (no measuring)")
    args = ap.parse_args()
    if args.render:
        _write(json.loads(Path(args.out + ".json").read_text()), Path(args.out))
        return
    if args.measure_only:
        sys.path.insert(0, os.getcwd())
        from cinq.process_env import set_omp_wait_policy
        set_omp_wait_policy()
        print(json.dumps(measure(args.model, int(args.threads), args.steps, args.repeats, json.loads(args.config),
                                 args.prompt_len, args.batch)))
        return

    models = {} if args.smollm2_only else {"cinq-tiny": "cinq-tiny"}
    if args.smollm2 or args.smollm2_only:
        models["smollm2-135m-instruct"] = "smollm2-135m-instruct"
    if args.model_110m:
        from benchmarks.random_model import LLAMA_110M, build_random_llama
        from cinq.cache import cache_dir
        models["llama-110m"] = str(build_random_llama(cache_dir() / "bench-llama-110m", LLAMA_110M))
        if args.int4:
            for head in (True, False):
                name = "llama-110m-int4" + ("" if head else "-bf16-head")
                models[name] = str(_int4_model(Path(models["llama-110m"]), head))
    first_threads = args.threads.split(",")[0]
    load_at_start = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = _baseline_tree(args.baseline, Path(tmp)) if args.baseline != "none" else None
        for name, model in models.items():
            for threads in [int(x) for x in (first_threads if "int4" in name else args.threads).split(",")]:
                versions = [("after", ROOT, None)] + ([("before", base, None)] if base else [])
                if args.compiled:
                    versions.append(("compiled", ROOT, COMPILED))
                samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
                for rnd in range(args.rounds):  # alternate, so drifting machine load hits both alike
                    # each round starts with the next version: the first child of a round read slower on this VM
                    for label, root, compilation in versions[rnd % len(versions):] + versions[:rnd % len(versions)]:
                        r = _child(root, model, threads, args.steps, args.repeats, compilation, args.prompt_len,
                                   args.batch)
                        samples[label].append(r)
                        print(f"{name} t={threads} {label}: {r['step_ms_median']:.3f} ms/step "
                              f"({r['cpu_ms_median']:.3f} CPU ms), "
                              f"{r['aten_ops']} ops, {r['host_syncs']} syncs, host {r['host_ms']:.3f} ms, "
                              f"load {r['loadavg'][0]:.2f}",
                              flush=True)
                runs.append({"model": name, "threads": threads, **{k: _merge(v) for k, v in samples.items()}})
    result = {"baseline": args.baseline, "prompt_len": args.prompt_len, "batch": args.batch,
              "load_at_start": load_at_start, "runs": runs}
    for run in runs:
        if "before" in run:
            same = run["before"]["first_tokens"] == run["after"]["first_tokens"]
            run["greedy_tokens_identical"] = same
            b, a = run["before"], run["after"]
            print(f"{run['model']} t={run['threads']}: before {b['step_ms_median']:.3f} ms ({b['cpu_ms_median']:.3f} "
                  f"CPU), after {a['step_ms_median']:.3f} ms ({a['cpu_ms_median']:.3f} CPU): wall "
                  f"{b['step_ms_median'] / a['step_ms_median']:.2f}x, "
                  f"CPU {b['cpu_ms_median'] / a['cpu_ms_median']:.2f}x; tokens identical: {same}")
    if not args.no_write:
        _write(result, Path(args.out))


def _write(result: dict[str, Any], out: Path) -> None:
    """The .json and .md (benchmarks/step_breakdown_report.py; imported here, in the parent only: a child imports
    nothing from this checkout but the code it measures)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.step_breakdown_report import write
    write(result, out, COMPILED)


def _merge(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Several child runs of one version: medians of the per-run medians; counts must agree."""
    out = dict(samples[-1])
    out["step_ms_median"] = statistics.median(s["step_ms_median"] for s in samples)
    out["cpu_ms_median"] = statistics.median(s["cpu_ms_median"] for s in samples)
    out["kernel_ms"] = statistics.median(s.get("kernel_ms", float("nan")) for s in samples)
    out["host_ms"] = statistics.median(s.get("host_ms", float("nan")) for s in samples)
    out["profiled_ops"] = statistics.median(s.get("profiled_ops", 0.0) for s in samples)
    out["instrumented_step_ms_median"] = statistics.median(s["instrumented_step_ms_median"] for s in samples)
    out["phases_ms"] = {p: statistics.median(s["phases_ms"][p] for s in samples) for p in (*PHASES, "other")}
    out["read_bandwidth_gb_s"] = statistics.median(s["read_bandwidth_gb_s"] for s in samples)
    out["roofline_ms"] = statistics.median(s["roofline_ms"] for s in samples)
    out["step_ms_all"] = [x for s in samples for x in s["step_ms_all"]]
    out["loadavg"] = [s["loadavg"] for s in samples]
    return out


if __name__ == "__main__":
    main()
