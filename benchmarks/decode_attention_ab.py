"""Batch-1 decode attention against an earlier commit's kernel, in one process: this checkout's ``paged_decode`` and
the one built from ``--before``'s sources attend one model's heads (``--heads``: SmolLM2-135M's 9 query heads of 64
over 3 kv heads, or Gemma 3 270M's 4 of 256 over one; a bf16 cache in 16-token pages) at a few context lengths, in
alternating order, round after round. Two placements:

* from memory: a separate cache per call, enough of them (>= 64 MB in all, in 2 MB pages as the engine's) that
  each call's K/V rows come from memory, as in a decode step, where a layer's rows were last read a step ago and
  the weights streamed since;
* in cache: one cache called over and over (its rows stay in L2): what a micro-benchmark of the kernel alone sees.

    python benchmarks/decode_attention_ab.py --before 1723494
    python benchmarks/decode_attention_ab.py --before 1723494 --heads gemma3 \
        --out benchmarks/results/decode_attention_ab_gemma3
    python benchmarks/decode_attention_ab.py --before HEAD~1 --contexts 320 --threads 1 --out /tmp/attn_ab
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch, as the engine does

import torch  # noqa: E402

from benchmarks.kernel_ab import before_and_head, commit_sources  # noqa: E402
from cinq.bench.report import BenchResult, Table, machine_info, publish, run_conditions  # noqa: E402
from cinq.host_memory import kv_cache_tensor  # noqa: E402
from cinq.kernels.cpu_native import module_from, native_module  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BLOCK = 16
HEADS = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256)}  # query heads, kv heads, head_dim of each model's attention
MEMORY_BYTES = 64 << 20  # caches cycled per pass "from memory": past any L3 this VM shows


def calls_per_us(module: Any, q: torch.Tensor, caches: list[torch.Tensor], tables: torch.Tensor,
                 lens: torch.Tensor, calls: int) -> float:
    """Microseconds a call, over ``calls`` calls cycling through ``caches``."""
    no_tree = torch.empty(0, dtype=torch.bool)
    scale = q.shape[-1] ** -0.5
    start = time.perf_counter()
    for i in range(calls):
        module.paged_decode(q, caches[i % len(caches)], tables, lens, scale, 1, no_tree)
    return (time.perf_counter() - start) / calls * 1e6


def measure(before: Any, after: Any, context: int, threads: int, rounds: int,
            memory_bytes: int = MEMORY_BYTES, heads: tuple[int, int, int] = HEADS["smollm2"]) -> list[dict[str, Any]]:
    """Both builds' time per call at ``context`` cached tokens, from memory and in cache: a cell per placement."""
    torch.set_num_threads(threads)
    hq, hkv, d = heads
    blocks = -(-context // BLOCK)
    per_cache = 2 * blocks * BLOCK * hkv * d * 2
    layers = max(1, memory_bytes // per_cache)
    pool = kv_cache_tensor((layers, 2, blocks, BLOCK, hkv, d), torch.bfloat16, "cpu")
    pool.normal_()
    tables = torch.arange(blocks, dtype=torch.int32)[None]
    lens = torch.tensor([context], dtype=torch.int32)
    q = torch.randn(1, hq, d).to(torch.bfloat16)
    no_tree = torch.empty(0, dtype=torch.bool)
    if not torch.equal(before.paged_decode(q, pool[0], tables, lens, d ** -0.5, 1, no_tree),
                       after.paged_decode(q, pool[0], tables, lens, d ** -0.5, 1, no_tree)):
        print(f"note: the builds' outputs differ at a context of {context}")
    cells = []
    for placement, caches in (("from memory", list(pool)), ("in cache", [pool[0]])):
        calls = max(len(caches), 200)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for name, module in (("before", before), ("after", after)):
            calls_per_us(module, q, caches, tables, lens, calls)  # warm-up
        for r in range(rounds):
            order = (("before", before), ("after", after)) if r % 2 == 0 else (("after", after), ("before", before))
            for name, module in order:
                times[name].append(calls_per_us(module, q, caches, tables, lens, calls))
        ratios = [b / a for b, a in zip(times["before"], times["after"])]
        cells.append({"context": context, "threads": threads, "placement": placement, "kv_kb": per_cache / 1e3,
                      "before_us": statistics.median(times["before"]), "after_us": statistics.median(times["after"]),
                      "speedup": statistics.median(ratios), "ratios": ratios})
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit whose paged_decode this checkout's is timed against")
    ap.add_argument("--contexts", default="160,320,1024,2048", help="cached tokens per call")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--heads", default="smollm2", choices=sorted(HEADS), help="whose attention heads")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=str(RESULTS / "decode_attention_ab"))
    args = ap.parse_args()
    contexts, threads = [int(v) for v in args.contexts.split(",")], [int(v) for v in args.threads.split(",")]
    if args.rounds < 2:
        raise SystemExit(f"--rounds: at least 2 (got {args.rounds}): the order alternates between rounds")
    commit, head = before_and_head(args.before)
    load_start = os.getloadavg()[0]
    draft, note = run_conditions(load_start)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        before = module_from("paged_decode", commit_sources(commit, Path(tmp)))
        after = native_module("paged_decode")
        if after is None:
            raise SystemExit("this checkout's paged_decode kernel did not build here")
        for t in threads:
            for context in contexts:
                cells += measure(before, after, context, t, args.rounds, heads=HEADS[args.heads])
    table = Table(f"This checkout ({head}) against {commit}: one batch-1 decode attention call, {args.heads}'s heads "
                  f"{HEADS[args.heads]}", [
        "context", "threads", "K/V KB", "rows", f"{commit} us", f"{head} us", "speedup", "per round (min-max)"])
    for c in cells:
        table.rows.append([c["context"], c["threads"], round(c["kv_kb"]), c["placement"], round(c["before_us"], 1),
                           round(c["after_us"], 1), round(c["speedup"], 2),
                           f"{min(c['ratios']):.2f}-{max(c['ratios']):.2f}"])
    headline = f"{head} vs {commit}, rows from memory: " + "; ".join(
        f"context {c['context']} {c['threads']} thr {c['speedup']:.2f}x" for c in cells
        if c["placement"] == "from memory")
    result = BenchResult(
        Path(args.out).name, f"Decode attention: {head} against {commit}, same process",
        f"{note} `python benchmarks/decode_attention_ab.py --before {args.before} --heads {args.heads} "
        f"--contexts {args.contexts} "
        f"--threads {args.threads} --rounds {args.rounds}`: {args.rounds} rounds, each timing both builds (order "
        f"alternating) over the same calls; us = the median round's time per call (the Python call included, ~2 us); "
        f"speedup = the median of the per-round ratios ({commit} / {head}).",
        [table], headline, {"draft": draft, "machine": machine_info(load_start), "before": commit, "after": head,
                            "cells": cells})
    publish(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
