"""Decode kernels against an earlier commit's, in one process: this checkout's native kernel and the one built from
``--before``'s sources time the same decode step's linears (SmolLM2-135M's 30 layers of merged qkv, o_proj, merged
gate_up, down_proj, then the LM head; every weight its own tensor, so a pass reads them from memory as a step does)
in alternating order, round after round. Drift on this VM (two runs minutes apart differ by up to ~15-30% per
kernel) then lands on both sides of a round; the speedup is the median of the per-round ratios, beside the read
probe taken at the start and the end.

    python benchmarks/kernel_ab.py --before 5d401d7 --kernels "q4_0 i8,q4_1 i8,q8_0 i8"
    python benchmarks/kernel_ab.py --before HEAD~1 --kernels bf16 --rows 1,5 --threads 2 --out /tmp/ab

Both builds take the same weight tensors: a commit whose kernel read another layout fails with its own error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch, as the engine does

import torch  # noqa: E402

from benchmarks.decode_kernels import (KERNELS, LAYERS, SHAPES, _group, call_for, make_weight,  # noqa: E402
                                       module_name, nbytes)
from cinq.bench.report import BenchResult, Table, machine_info, publish, run_conditions  # noqa: E402
from cinq.kernels.cpu_native import module_from  # noqa: E402
from cinq.plan.probe import read_bandwidth  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def commit_sources(commit: str, into: Path) -> Path:
    """``cinq/kernels/cpu`` as of ``commit``, extracted under ``into``; returns that folder."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "cinq/kernels/cpu"], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "cinq" / "kernels" / "cpu"


def before_and_head(before: str) -> tuple[str, str]:
    """The short hashes of ``--before``'s commit and of HEAD; SystemExit naming --before when it is no commit here."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", "--quiet",
                            f"{before}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"--before: {before!r} is not a commit of this repository")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return found.stdout.strip(), head


def step_calls(kernel: str, module: Any, weights: list[tuple[str, dict[str, torch.Tensor]]],
               xs: dict[str, torch.Tensor]) -> list[tuple[Callable[[dict[str, torch.Tensor]], Any], dict]]:
    """One decode step's linear calls in order, each bound to its weight, run by ``module`` (None: this checkout's
    build)."""
    calls = {name: call_for(kernel, _group(kernel, k), xs[name], module) for name, (_, k) in SHAPES.items()}
    return [(calls[name], w) for name, w in weights]


def step_weights(kernel: str, gen: torch.Generator) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Every linear of a step, each its own weight: the 30 layers' four, then the LM head."""
    layer = [name for name in SHAPES if name != "lm_head"]
    out = [(name, make_weight(kernel, *SHAPES[name], _group(kernel, SHAPES[name][1]), gen))
           for _ in range(LAYERS) for name in layer]
    n, k = SHAPES["lm_head"]
    return out + [("lm_head", make_weight(kernel, n, k, _group(kernel, k), gen))]


def one_pass(calls: list[tuple[Callable, dict]]) -> float:
    t0 = time.perf_counter()
    for fn, w in calls:
        fn(w)
    return time.perf_counter() - t0


def measure(kernel: str, before: Any, after: Any, rows: list[int], threads: list[int], rounds: int
            ) -> list[dict[str, Any]]:
    """Per (threads, rows): both builds' pass times, alternating which goes first, and the per-round ratios."""
    gen = torch.Generator().manual_seed(0)
    weights = step_weights(kernel, gen)
    mb = sum(nbytes(w) for _, w in weights) / 1e6
    cells = []
    for t in threads:
        torch.set_num_threads(t)
        for m in rows:
            xs = {name: torch.randn(m, k, generator=gen).bfloat16() for name, (_, k) in SHAPES.items()}
            sides = {"before": step_calls(kernel, before, weights, xs), "after": step_calls(kernel, after, weights, xs)}
            for calls in sides.values():
                one_pass(calls)  # warm-up: page faults, the builds' first calls
            times: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(rounds):
                for side in (("after", "before") if r % 2 == 0 else ("before", "after")):
                    times[side].append(one_pass(sides[side]))
            ratios = [b / a for b, a in zip(times["before"], times["after"])]
            cells.append({"kernel": kernel, "threads": t, "rows": m, "weight_mb": mb,
                          "before_ms": statistics.median(times["before"]) * 1e3,
                          "after_ms": statistics.median(times["after"]) * 1e3,
                          "speedup": statistics.median(ratios), "ratios": ratios})
            print(f"{kernel:12s} t{t} M{m}: before {cells[-1]['before_ms']:.2f} ms, after {cells[-1]['after_ms']:.2f} "
                  f"ms, {cells[-1]['speedup']:.3f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    return cells


def probe(threads: list[int]) -> dict[int, float]:
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        out[t] = read_bandwidth() / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit whose kernels this checkout's are timed against")
    ap.add_argument("--kernels", default="q4_0 i8,q4_1 i8,q8_0 i8", help="comma-separated, from " + ", ".join(KERNELS))
    ap.add_argument("--rows", default="1,2,5,8", help="activation rows per call (5: a verify of 4 drafts)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=str(RESULTS / "kernel_ab"))
    args = ap.parse_args()
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--kernels: unknown {unknown}; choose from {list(KERNELS)}")
    if args.rounds < 2:
        raise SystemExit(f"--rounds: at least 2 (got {args.rounds}): the order alternates between rounds")
    rows, threads = [int(v) for v in args.rows.split(",")], [int(v) for v in args.threads.split(",")]
    commit, head = before_and_head(args.before)
    load_start = os.getloadavg()[0]
    draft, note = run_conditions(load_start)
    probe_start = probe(threads)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = commit_sources(commit, Path(tmp))
        for kernel in kernels:
            name = module_name(kernel)
            cells += measure(kernel, module_from(name, sources), None, rows, threads, args.rounds)
    probe_end = probe(threads)
    bw = {t: max(probe_start[t], probe_end[t]) for t in threads}
    table = Table(f"This checkout ({head}) against {commit}: one decode step's linears", [
        "kernel", "threads", "rows", "weight MB", f"{commit} ms", f"{head} ms", "speedup", "per round (min-max)",
        "GB/s now", "% of probe"])
    for c in cells:
        gbs = c["weight_mb"] / c["after_ms"]
        table.rows.append([c["kernel"], c["threads"], c["rows"], round(c["weight_mb"], 1), round(c["before_ms"], 2),
                           round(c["after_ms"], 2), round(c["speedup"], 3),
                           f"{min(c['ratios']):.2f}-{max(c['ratios']):.2f}", round(gbs, 1),
                           round(100 * gbs / bw[c["threads"]])])
    headline = f"{head} vs {commit}, one step's linears: " + "; ".join(
        f"{c['kernel']} M={c['rows']} {c['threads']} thr {c['speedup']:.2f}x" for c in cells if c["rows"] in (1, 5))
    result = BenchResult(
        Path(args.out).name, f"Decode kernels: {head} against {commit}, same process",
        f"{note} `python benchmarks/kernel_ab.py --before {args.before} --kernels \"{args.kernels}\" --rows {args.rows} "
        f"--threads {args.threads} --rounds {args.rounds}`: {args.rounds} rounds, each timing one pass of both builds "
        f"over a step's linears (order alternating); ms = the median pass; speedup = the median of the per-round "
        f"ratios ({commit} / {head}). Read probe (best of start and end): "
        + ", ".join(f"{bw[t]:.1f} GB/s at {t} thread(s)" for t in threads) + ".",
        [table], headline,
        {"draft": draft, "machine": machine_info(load_start), "before": commit, "after": head, "probe_gb_s": bw,
         "cells": cells})
    publish(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
