"""Weights in 2 MB pages (cinq.host_memory, cinq/engine/weight_arena.py) against the 4 KB pages of the heap they
were loaded into: the weight streams of a decode step alone, and the whole batch-1 decode of the real model.

Streams: SmolLM2-135M's 30 decoder layers' weights (random values, the real shapes) as bf16 and as Q4_0 blocks
for the int8-activation kernel, M = 1, every linear once per pass (60-200 MB: the stream comes from memory, as in a
step), in three placements held side by side in one process and timed in alternation: the heap (where the engine's
weights were), a 4 KB-page mapping and a 2 MB-page mapping. The read probe (cinq.plan.probe) in 4 KB and 2 MB
pages gives each thread count's ceiling.

Engine: batch-1 greedy decode of smollm2-135m-instruct (bf16, and the q4_0 file as int4) in child processes
(benchmarks/omp_wait_policy.py's measurement, cinq's default PASSIVE policy) with ``CINQ_HUGE_PAGES=0`` (the
heap, as before) and ``=1`` (packed), alternated --repeats times.

    python benchmarks/huge_pages.py                       # streams at 1 and 2 threads, then the engine pair
    python benchmarks/huge_pages.py --parts streams --passes 20
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # SmolLM2-135M: qkv, o, gate_up, down (N, K)
PLACEMENTS = ("heap", "4 KB pages", "2 MB pages")


def placed(weights: list[tuple[int, dict[str, Any]]], placement: str, keep: list[Any]) -> list[tuple[int, dict]]:
    """``weights`` copied into one mapping of ``placement`` (the heap: as made)."""
    import torch

    from cinq.host_memory import HUGE_PAGE_BYTES, huge_page_tensor
    if placement == "heap":
        return weights
    total = sum((t.numel() * t.element_size() + 63) // 64 * 64 for _, d in weights for t in d.values())
    if placement == "2 MB pages":
        arena = huge_page_tensor(total)
    else:
        mapping = mmap.mmap(-1, total + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        keep.append(mapping)
        arena = torch.frombuffer(mapping, dtype=torch.uint8)
    out, at = [], 0
    for k, d in weights:
        moved = {}
        for name, t in d.items():
            n = t.numel() * t.element_size()
            view = arena[at:at + n].view(t.dtype).view(t.shape)
            view.copy_(t)
            moved[name] = view
            at += (n + 63) // 64 * 64
        out.append((k, moved))
    return out


def streams(kernel: str, threads: int, passes: int) -> dict[str, Any]:
    """GB/s of one decode step's linears (30 layers) per placement: best and median pass."""
    import torch

    from benchmarks.decode_kernels import call_for, make_weight, module_name, nbytes
    from cinq.kernels import cpu_native
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    weights = [(k, make_weight(kernel, n, k, 32, gen)) for _ in range(30) for n, k in SHAPES]
    keep: list[Any] = []
    sets = {p: placed(weights, p, keep) for p in PLACEMENTS}
    mod = cpu_native.native_module(module_name(kernel))
    fns = {k: call_for(kernel, 32, torch.randn(1, k).bfloat16(), mod) for k in {k for _, k in SHAPES}}
    total = sum(nbytes(t) for _, t in weights)
    times: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    with torch.inference_mode():
        for _ in range(passes + 1):  # the first pass of each: warm-up, dropped
            for p, ws in sets.items():
                t0 = time.perf_counter()
                for k, t in ws:
                    fns[k](t)
                times[p].append(time.perf_counter() - t0)
    gbs = {p: {"best": total / min(v[1:]) / 1e9, "median": total / statistics.median(v[1:]) / 1e9}
           for p, v in times.items()}
    return {"kernel": kernel, "threads": threads, "mb": total / 1e6, "gb_s": gbs}


def probe(threads: int, mib: int = 256, repeats: int = 5) -> dict[str, float]:
    """GB/s of the read probe's sum (cinq.plan.probe.read_bandwidth, which takes the better of the two) over a
    buffer in 4 KB and in 2 MB pages."""
    import torch

    from cinq.host_memory import huge_page_tensor
    torch.set_num_threads(threads)
    n = mib * (1 << 20) // 4
    out = {}
    for label, make in (("4 KB pages", lambda: torch.empty(n)),
                        ("2 MB pages", lambda: huge_page_tensor(n * 4).view(torch.float32))):
        x = make()
        x.fill_(1.0)
        x.sum()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t)
        out[label] = n * 4 / best / 1e9
        del x
    return out


def engine(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Batch-1 decode rows, a child process each, CINQ_HUGE_PAGES off and on alternated."""
    from benchmarks.omp_wait_policy import measure_one
    child = argparse.Namespace(model=args.model, prompt_len=128, new_tokens=64, rounds=args.rounds,
                               child_timeout=900.0)
    rows = []
    for variant in args.variants.split(","):
        for threads in map(int, args.threads.split(",")):
            for _ in range(args.repeats):
                for on in ("0", "1"):
                    os.environ["CINQ_HUGE_PAGES"] = on
                    row = measure_one(child, "cinq", variant, threads, "PASSIVE")
                    row.update(variant=variant, threads=threads, huge_pages=on == "1")
                    print(f"cinq {variant} {threads} thr huge pages {on}: {row.get('tok_s')} tok/s", flush=True)
                    rows.append(row)
    os.environ.pop("CINQ_HUGE_PAGES", None)
    return rows


def report(data: dict[str, Any], load_at_start: float, command: str) -> Any:
    from cinq.bench.report import BenchResult, Table, machine_info, run_conditions
    _, conditions = run_conditions(load_at_start)
    tables, headline = [], []
    if data["streams"]:
        t = Table("one decode step's linears at M = 1 (SmolLM2-135M shapes x 30 layers), GB/s: best / median pass",
                  ["kernel", "threads", "MB", *PLACEMENTS, "2 MB / heap (median)"])
        for s in data["streams"]:
            g = s["gb_s"]
            ratio = g["2 MB pages"]["median"] / g["heap"]["median"]
            t.rows.append([s["kernel"], s["threads"], round(s["mb"], 1),
                           *[f"{g[p]['best']:.1f} / {g[p]['median']:.1f}" for p in PLACEMENTS], ratio])
            headline.append(f"{s['kernel']} {s['threads']} thr streams {ratio:.2f}x")
        tables.append(t)
        p = Table("read probe (cinq.plan.probe.read_bandwidth), GB/s", ["threads", "4 KB pages", "2 MB pages", "ratio"])
        for threads, v in data["probe"].items():
            p.rows.append([threads, v["4 KB pages"], v["2 MB pages"], v["2 MB pages"] / v["4 KB pages"]])
        tables.append(p)
    if data["engine"]:
        e = Table("batch-1 decode of smollm2-135m-instruct, tok/s (median over repeats; child processes alternated)",
                  ["variant", "threads", "heap (CINQ_HUGE_PAGES=0)", "2 MB pages", "ratio"])
        keys = dict.fromkeys((r["variant"], r["threads"]) for r in data["engine"])
        for variant, threads in keys:
            speeds = {on: [r["tok_s"] for r in data["engine"] if (r["variant"], r["threads"], r["huge_pages"])
                           == (variant, threads, on) and r.get("tok_s")] for on in (False, True)}
            off, on = (statistics.median(speeds[x]) if speeds[x] else None for x in (False, True))
            ratio = on / off if on and off else None
            e.rows.append([f"cinq {variant}", threads, off, on, ratio])
            if ratio:
                headline.append(f"engine {variant} {threads} thr {ratio:.2f}x")
        tables.append(e)
    setup = (f"{conditions} `{command}`. Streams: random weights of the real shapes, every placement held at once "
             f"and timed in alternation, {data['passes']} passes after a warm-up one. Engine: "
             f"benchmarks/omp_wait_policy.py's child measurement (prompt 128, 64 new tokens, {data['rounds']} "
             f"generations after a warm-up), OMP_WAIT_POLICY=PASSIVE, {data['repeats']} alternations.")
    return BenchResult("huge_pages", "Weights and KV caches in 2 MB pages", setup, tables,
                       "2 MB pages vs the heap's 4 KB: " + "; ".join(headline),
                       {**data, "machine": machine_info(load_at_start)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="streams,engine", help="streams, engine or both")
    ap.add_argument("--kernels", default="bf16,q4_0 i8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--variants", default="bf16,int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="huge_pages", help="result file name in benchmarks/results/")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    parts = args.parts.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    data: dict[str, Any] = {"streams": [], "probe": {}, "engine": [], "passes": args.passes, "rounds": args.rounds,
                            "repeats": args.repeats}
    if "streams" in parts:
        for n in threads:
            data["probe"][n] = probe(n)
            for kernel in args.kernels.split(","):
                data["streams"].append(streams(kernel, n, args.passes))
                print(data["streams"][-1], flush=True)
    if "engine" in parts:
        data["engine"] = engine(args)
    from cinq.bench.report import publish
    command = "python benchmarks/huge_pages.py " + " ".join(sys.argv[1:])
    publish(report(data, load_at_start, command.strip()), None if args.no_write else RESULTS / args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
