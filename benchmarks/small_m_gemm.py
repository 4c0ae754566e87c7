"""Skinny bf16 GEMM benchmark: cinq's native small-M kernel (cinq/kernels/cpu/small_m_gemm.cpp) against torch's
bf16 ``F.linear`` (oneDNN) and against the kernel as it was at a git revision, all in the same run.

Section ``gemm``: y[M, N] = x[M, K] @ w[N, K]^T for cinq-tiny's weight shapes (merged qkv_proj, o_proj,
merged gate_up_proj, down_proj, lm_head) and M = 1..8 rows; microseconds per call (min over ``--repeats``
rounds, the candidates interleaved in each round so machine load hits them alike), ratios, and the weight
stream rate (weight bytes / time) of the current kernel.

Section ``forward``: one sequence's target forward (no LM head) on cinq-tiny with q = 1..8 rows, i.e. what a
speculative verify of k = q - 1 drafts costs: torch only (every linear through oneDNN), the ``--before``
revision's kernel with its row cutoff, and the current kernel with today's (``cpu_native.small_m_rows()``).

    python benchmarks/small_m_gemm.py                  # writes benchmarks/results/small_m_gemm.md
    python benchmarks/small_m_gemm.py --before HEAD~1  # compare against another revision's kernel
    python benchmarks/small_m_gemm.py --quick          # fewer rounds, smoke run

``--before`` defaults to HEAD (the last commit's kernel); a revision whose kernel equals the working tree's is
still timed (the two columns then measure the noise). Threads: torch's default (``--threads`` to change).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch: spinning OpenMP workers distort every timing on a shared machine

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cinq.kernels import cpu_native  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
KERNEL = "cinq/kernels/cpu/small_m_gemm.cpp"
HIDDEN, INTERMEDIATE, VOCAB, Q_SIZE, KV_SIZE = 384, 1024, 8192, 384, 128  # cinq-tiny (6 heads, 2 kv heads, D 64)
SHAPES = {  # name -> (K, N)
    "qkv_proj": (HIDDEN, Q_SIZE + 2 * KV_SIZE),
    "o_proj": (Q_SIZE, HIDDEN),
    "gate_up_proj": (HIDDEN, 2 * INTERMEDIATE),
    "down_proj": (INTERMEDIATE, HIDDEN),
    "lm_head": (HIDDEN, VOCAB),
}
ROWS = range(1, 9)
STREAM_BYTES = 16 << 20


def load_revision_kernel(rev: str) -> tuple[Any | None, int]:
    """The small-M extension built from ``rev``'s sources (its kernel and the headers it includes, as
    benchmarks/kernel_ab.py extracts them), and the most rows it takes; (None, 0) when that revision has no such
    file."""
    import tempfile

    from benchmarks.kernel_ab import commit_sources

    with tempfile.TemporaryDirectory(prefix="small-m-rev-") as tmp:  # module_from builds from its own copy
        try:
            sources = commit_sources(rev, Path(tmp))
        except subprocess.CalledProcessError:
            return None, 0
        if not (sources / Path(KERNEL).name).exists():
            return None, 0
        mod = cpu_native.module_from("small_m_gemm", sources)
    return mod, kernel_rows(mod)


def kernel_rows(mod: Any) -> int:
    """The most rows ``mod.small_m_linear`` takes, found by asking it."""
    max_rows = 0
    w = torch.zeros(16, 32, dtype=torch.bfloat16)
    for m in ROWS:
        try:
            mod.small_m_linear(torch.zeros(m, 32, dtype=torch.bfloat16), w, torch.empty(0))
            max_rows = m
        except RuntimeError:
            break
    return max_rows


def time_us(fn: Callable[[], Any], budget_s: float) -> float:
    """Mean microseconds per call over a batch of calls sized to take about ``budget_s``."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    n = max(3, int(budget_s / once))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def ratio(a: float | None, b: float) -> str:
    """``a / b`` as a table cell ("" when there is no ``a``)."""
    return "" if a is None else f"{a / b:.2f}x"


def race(fns: dict[str, Callable[[], Any]], repeats: int, budget_s: float) -> dict[str, float]:
    """Min over ``repeats`` interleaved rounds of each candidate's time per call (us); each round starts with the
    next candidate, so none always runs right after the same other one."""
    best = {k: float("inf") for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            best[k] = min(best[k], time_us(fns[k], budget_s))
    return best


def gemm_reading(times: dict[tuple[str, int], dict[str, float]]) -> str:
    """The per-shape table's conclusion, computed from its times ({(weight, M): {candidate: us}}): how each path's
    time per call grows from one row to the most rows measured, and where each stands against torch."""
    ms = sorted({m for _, m in times})
    lo, hi = ms[0], ms[-1]
    names = sorted({w for w, _ in times})

    def growth(key: str) -> str:
        g = [times[(w, hi)][key] / times[(w, lo)][key] for w in names if (w, hi) in times and (w, lo) in times]
        return f"{min(g):.2f}-{max(g):.2f}x"

    def vs_torch(key: str, m: int) -> str:
        r = [times[(w, m)]["torch"] / times[(w, m)][key] for w in names if (w, m) in times]
        return f"{min(r):.2f}-{max(r):.2f}x"
    return (f"Reading it (computed from this run): from M = {lo} to {hi} rows the time per call grows "
            f"{growth('now')} for 'now', {growth('vector')} for 'vector only' and {growth('torch')} for torch "
            f"(over the {len(names)} weights). Against torch, 'now' is {vs_torch('now', lo)} faster at M = {lo} and "
            f"{vs_torch('now', hi)} at M = {hi}; 'vector only' {vs_torch('vector', lo)} and {vs_torch('vector', hi)}. "
            "'now GB/s' is the weight stream rate (each weight read from L3 or memory, as in a forward); single "
            "timings swing by tens of percent on a shared machine: compare within a row.")


def gemm_section(before: Any | None, before_rows: int, repeats: int) -> list[str]:
    """The per-shape table (markdown lines, printed as it goes) and its computed reading."""
    after = cpu_native.native_module("small_m_gemm")
    after_rows = kernel_rows(after)
    g = torch.Generator().manual_seed(0)
    lines = ["| weight | K | N | M | torch (us) | before (us) | now (us) | vector only (us) | torch / now | "
             "before / now | torch / vector only | now GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print(lines[0])
    none = torch.empty(0)
    times: dict[tuple[str, int], dict[str, float]] = {}
    for name, (k, n) in SHAPES.items():
        # A forward streams ~22 MB of weights, more than this CPU's L2: cycling through copies of one weight
        # (>= STREAM_BYTES in all) times it read from L3/memory as it is there, not warm from the last call.
        copies = [(torch.randn(n, k, generator=g) * 0.05).bfloat16()
                  for _ in range(-(-STREAM_BYTES // (n * k * 2)))]
        for m in ROWS:
            if m > after_rows:
                continue
            x = torch.randn(m, k, generator=g).bfloat16()
            ws = itertools.cycle(copies)
            fns: dict[str, Callable[[], Any]] = {"torch": lambda: F.linear(x, next(ws)),
                                                  "now": lambda: after.small_m_linear(x, next(ws), none),
                                                  "vector": lambda: after.small_m_linear(x, next(ws), none, 1)}
            if before is not None and m <= before_rows:
                fns["before"] = lambda: before.small_m_linear(x, next(ws), none)
            with torch.inference_mode():
                t = race(fns, repeats, 0.01)
            times[(name, m)] = t
            b = t.get("before")
            row = (f"| {name} | {k} | {n} | {m} | {t['torch']:.1f} | {'' if b is None else f'{b:.1f}'} | "
                   f"{t['now']:.1f} | {t['vector']:.1f} | {t['torch'] / t['now']:.2f}x | {ratio(b, t['now'])} | "
                   f"{t['torch'] / t['vector']:.2f}x | {n * k * 2 / t['now'] / 1e3:.1f} |")
            lines.append(row)
            print(row, flush=True)
    return lines + ["", gemm_reading(times)]


class VectorOnly:
    """The current kernel held to its AVX512-BF16 path: what a CPU without AMX runs."""

    def __init__(self, mod: Any) -> None:
        self.mod = mod

    def small_m_linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.mod.small_m_linear(x, w, bias, 1)


def forward_section(before: Any | None, before_rows: int, repeats: int) -> list[str]:
    """cinq-tiny's target forward for one sequence of q rows under each GEMM configuration (markdown lines)."""
    from cinq import LLM
    from cinq.step.batch_inputs import build_batch
    from cinq.step.scheduler_output import ScheduledSeq

    llm = LLM(None, engine_core="inproc", dtype="bfloat16", kv_cache_memory=0.5)  # reaches the runner
    runner = llm.engine.executor.runner
    now_mod, now_rows = cpu_native.native_module("small_m_gemm"), cpu_native.small_m_rows()
    configs: dict[str, tuple[Any, int]] = {"torch only": (now_mod, 0), "now": (now_mod, now_rows),
                                           "vector only": (VectorOnly(now_mod), now_mod.fast_rows(1))}
    if before is not None:
        configs["before"] = (before, before_rows)

    def run_with(cfg: tuple[Any, int], batch: Any) -> Callable[[], Any]:
        def go() -> Any:
            cpu_native._modules["small_m_gemm"], cpu_native._small_m_rows = cfg
            return runner.model(batch.input_ids, batch.positions, batch.meta)
        return go

    lines = ["| rows | torch only (ms) | before (ms) | now (ms) | vector only (ms) | before / now | torch only / now |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    print(lines[0])
    try:
        for q in ROWS:
            seqs = [ScheduledSeq("x", [5] * q, 100, list(range(20)), q)]
            b = build_batch(seqs, runner.block_size, runner.pad_block_ids, runner.device)
            with torch.inference_mode():
                t = race({k: run_with(c, b) for k, c in configs.items()}, repeats, 0.02)
            tb = t.get("before")
            row = (f"| {q} | {t['torch only'] / 1e3:.2f} | {'' if tb is None else f'{tb / 1e3:.2f}'} | "
                   f"{t['now'] / 1e3:.2f} | {t['vector only'] / 1e3:.2f} | {ratio(tb, t['now'])} | "
                   f"{t['torch only'] / t['now']:.2f}x |")
            lines.append(row)
            print(row, flush=True)
    finally:
        cpu_native._modules["small_m_gemm"], cpu_native._small_m_rows = now_mod, now_rows
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD", help="git revision whose kernel is the 'before' column")
    ap.add_argument("--sections", default="gemm,forward")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "small_m_gemm.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    before, before_rows = load_revision_kernel(args.before)
    now_mod = cpu_native.native_module("small_m_gemm")
    if now_mod is None:
        raise SystemExit("the native small-M kernel is unavailable here (no compiler or no AVX512-BF16)")
    sections = args.sections.split(",")
    load = os.getloadavg()[0]
    rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip() or args.before
    out = ["# Skinny bf16 GEMM (native small-M kernel)", "",
           "Produced by `python benchmarks/small_m_gemm.py`; see its docstring. "
           f"{torch.get_num_threads()} threads, min over {repeats} interleaved rounds; 'before' = the kernel at "
           f"`{args.before}` ({rev}, M <= {before_rows}), 'now' = the working tree's "
           f"(AMX {'on' if now_mod.has_amx() else 'off'}; M <= {cpu_native.small_m_rows()} in the engine), "
           "'vector only' = the working tree's AVX512-BF16 path (what a CPU without AMX runs), "
           "'torch' = bf16 `F.linear` (oneDNN). Machine load average at the start: "
           f"{load:.2f} on {os.cpu_count()} cores (other jobs share them: read ratios, not absolute times).", ""]
    if "gemm" in sections:
        out += ["## Per weight: y[M, N] = x[M, K] @ w[N, K]^T, cinq-tiny shapes", ""]
        out += gemm_section(before, before_rows, repeats) + [""]
    if "forward" in sections:
        out += ["## cinq-tiny target forward, one sequence of M rows (no LM head)", "",
                "torch only: every linear through oneDNN; before / now / vector only: the native kernel up to its "
                "row cutoff, oneDNN past it.", ""]
        out += forward_section(before, before_rows, repeats) + [""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
