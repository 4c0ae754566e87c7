"""The report of benchmarks/decode_kernels.py: its markdown from a run's data (the stream rates per kernel, shape,
thread count and rows against the read probe, one decode step's linears, the conclusions computed from the cells,
and a comparison with an earlier results file)."""

from __future__ import annotations

import os
from typing import Any

from benchmarks.decode_kernels_grid import KERNELS, LAYERS, ROWS, SHAPES, THREADS
from cinq.bench.report import run_conditions

TARGET = 0.8  # the share of the read probe a kernel must stream at to count as at the roofline


def step_times(data: dict[str, Any]) -> list[str]:
    """Markdown lines: one decode step's linears (the 4 decoder shapes x 30 layers + the LM head) at M = 1 per
    kernel, from the cells' microseconds per call, and the ratio to bf16 and to int4 g64 measured in this run."""
    cells = [c for c in data["cells"] if "gb_s" in c and c["m"] == 1]
    if not cells:  # --rows without 1
        return []
    kernels = data.get("kernels", KERNELS)
    lines = ["## One decode step's linears at M = 1 (computed: 30 x the decoder shapes + the LM head)", "",
             "| kernel | threads | weight MB | ms | vs bf16 | vs int4 g64 |", "|---|---|---:|---:|---:|---:|"]
    for th in THREADS:
        tot: dict[str, tuple[float, float]] = {}
        for kernel in kernels:
            mine = {c["shape"]: c for c in cells if c["kernel"] == kernel and c["threads"] == th}
            if set(mine) != set(SHAPES):
                continue
            us = sum(c["us_per_call"] * (1 if s == "lm_head" else LAYERS) for s, c in mine.items())
            mb = sum(c["bytes"] * (1 if s == "lm_head" else LAYERS) for s, c in mine.items()) / 1e6
            tot[kernel] = (us / 1e3, mb)
        for kernel, (ms, mb) in tot.items():
            vs = {b: (f"{tot[b][0] / ms:.2f}x" if b in tot else "-") for b in ("bf16", "int4 g64")}
            lines.append(f"| {kernel} | {th} | {mb:.1f} | {ms:.2f} | {vs['bf16']} | {vs['int4 g64']} |")
    return lines + ["", "'vs X' = X's time / this kernel's time (above 1: faster than X). All kernels' LM head "
                        "included as that kernel (a real model may keep it bf16).", ""]


def conclusions(data: dict[str, Any]) -> list[str]:
    """Findings computed from the cells (nothing typed in advance)."""
    rows = tuple(sorted(data.get("rows", ROWS)))
    cells = [c for c in data["cells"] if "gb_s" in c]
    first = rows[0]  # 1 unless --rows left it out
    out = []
    for kernel in data.get("kernels", KERNELS):
        mine = [c for c in cells if c["kernel"] == kernel]
        if not mine:
            continue
        reach = [m for m in rows if all(c["ratio"] >= TARGET for c in mine if c["m"] == m)]
        r1 = [c["ratio"] for c in mine if c["m"] == first]
        per_m = {m: sum(c["ratio"] for c in mine if c["m"] == m) / max(1, sum(c["m"] == m for c in mine))
                 for m in rows}
        scale = []
        for c in mine:
            if c["threads"] == 2:
                one = next(o for o in mine if o["threads"] == 1 and o["shape"] == c["shape"] and o["m"] == c["m"])
                scale.append(c["gb_s"] / one["gb_s"])
        slower = sum(s < 1.0 for s in scale)
        at = f"at M = {', '.join(map(str, reach))}" if reach else "at no M"
        # GB/s falling with M while the bytes stay the same: the arithmetic (M multiply-adds per weight), not the
        # stream, bounds those cells
        fall = per_m[rows[-1]] / per_m[rows[0]]
        out.append(f"- **{kernel}**: >= {TARGET:.0%} of the probe in every shape and thread count {at}; at M = {first} "
                   f"{min(r1):.0%}-{max(r1):.0%}. Mean ratio by M: " +
                   ", ".join(f"{m}: {v:.0%}" for m, v in per_m.items()) +
                   f" (M = {rows[-1]} streams at {fall:.2f}x the rate of M = {first}: "
                   f"{'compute-bound there' if fall < 0.7 else 'still stream-bound'}). 2 threads / 1 thread: "
                   f"{min(scale):.2f}x-{max(scale):.2f}x ({slower} of {len(scale)} cells slower at 2 threads).")
    bf = [c for c in cells if c["kernel"] == "bf16" and c["torch_gb_s"]]
    if bf:
        sp = [c["gb_s"] / c["torch_gb_s"] for c in bf]
        out.append(f"- bf16 kernel vs oneDNN's bf16 `F.linear` (what this CPU ran before): {min(sp):.1f}x-"
                   f"{max(sp):.1f}x faster (median {sorted(sp)[len(sp) // 2]:.1f}x).")
    return out


def before_after(data: dict[str, Any]) -> list[str]:
    """Markdown lines: this run's cells against the same cells of ``data["before"]`` (an earlier results file, e.g.
    the one committed before a kernel change): GB/s ratio, and each kernel's cost of M rows over its cost of 1 row
    (what a speculative verify step pays) before and after. Empty without a before file."""
    before = data.get("before")
    if not before:
        return []
    old = {(c["kernel"], c["shape"], c["threads"], c["m"]): c for c in before["cells"] if "gb_s" in c}
    lines = [f"## Against {before['file']} ({before['date']}, load average {before['load_start']:.2f} at its start)",
             "", "GB/s after / before (above 1: faster now), and the cost of an M-row call over a 1-row call "
             "(us per call ratio), before -> after.", "",
             "| kernel | threads | shape | M=1 speed | M=2 speed | M=8 speed | M=2 / M=1 cost | M=8 / M=1 cost |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    new = {(c["kernel"], c["shape"], c["threads"], c["m"]): c for c in data["cells"] if "gb_s" in c}
    for (kernel, shape, th, m), c in new.items():
        if m != 1 or any((kernel, shape, th, r) not in old or (kernel, shape, th, r) not in new for r in (1, 2, 8)):
            continue
        speed = [new[(kernel, shape, th, r)]["gb_s"] / old[(kernel, shape, th, r)]["gb_s"] for r in (1, 2, 8)]
        cost = [f"{old[(kernel, shape, th, r)]['us_per_call'] / old[(kernel, shape, th, 1)]['us_per_call']:.2f} -> "
                f"{new[(kernel, shape, th, r)]['us_per_call'] / c['us_per_call']:.2f}" for r in (2, 8)]
        lines.append(f"| {kernel} | {th} | {shape} | " + " | ".join(f"{v:.2f}x" for v in speed) + " | "
                     + " | ".join(cost) + " |")
    return lines + [""]


def render(data: dict[str, Any]) -> str:
    """The markdown of a run: ``data`` as decode_kernels.py writes it to its .json."""
    rows = tuple(data.get("rows", ROWS))
    cells = [c for c in data["cells"] if "gb_s" in c]
    probes = data["probe_gb_s"]
    lines = ["# Decode kernels at the memory roofline", "",
             f"Produced by `python benchmarks/decode_kernels.py` ({data['date']}, {data['cpu']}, "
             f"{data['repeats']} passes per cell, best taken). {run_conditions(data['load_start'])[1]} Load average "
             f"{data['load_end']:.2f} at the end on {os.cpu_count()} cores. Read probe "
             "(`cinq.plan.probe.read_bandwidth`, best of the start and end readings): "
             + ", ".join(f"{v:.1f} GB/s at {t} thread(s)" for t, v in probes.items()) + ".", "",
             "Cost of one empty parallel region at 2 threads (waking torch's OpenMP workers): " +
             ", ".join(f"{k} {v:.1f} us" for k, v in data["region_us"].items()) + ".", "",
             "Per-call overhead of the bf16 kernel on a 64 x 64 weight (us, 1 thread): " +
             ", ".join(f"{k} {v:.1f}" for k, v in data["dispatch_us"].items()) + ".", "",
             "## Conclusions (computed from this run)", ""] + conclusions(data) + [""] + step_times(data) \
        + before_after(data)
    for th in THREADS:
        lines += [f"## {th} thread(s): GB/s of weight bytes streamed (ratio to the {float(probes[str(th)]):.1f} "
                  "GB/s probe)", "",
                  "| kernel | shape (N x K) | " + " | ".join(f"M={m}" for m in rows) + " |",
                  "|---|---|" + "---:|" * len(rows)]
        for kernel in data.get("kernels", KERNELS):
            for shape, (n, k) in SHAPES.items():
                row = [c for c in cells if c["kernel"] == kernel and c["shape"] == shape and c["threads"] == th]
                if not row:
                    lines.append(f"| {kernel} | {shape} {n}x{k} | " + " | ".join("n/a" for _ in rows) + " |")
                    continue
                by_m = {c["m"]: c for c in row}
                lines.append(f"| {kernel} | {shape} {n}x{k} | " + " | ".join(
                    f"{by_m[m]['gb_s']:.1f} ({by_m[m]['ratio']:.0%})" for m in rows) + " |")
        bf = [c for c in cells if c["kernel"] == "bf16" and c["threads"] == th and c["torch_gb_s"]]
        if bf:
            lines += ["", f"oneDNN bf16 `F.linear`, same weights, {th} thread(s) (GB/s):", "",
                      "| shape | " + " | ".join(f"M={m}" for m in rows) + " |", "|---|" + "---:|" * len(rows)]
            for shape in SHAPES:
                by_m = {c["m"]: c for c in bf if c["shape"] == shape}
                lines.append(f"| {shape} | " + " | ".join(f"{by_m[m]['torch_gb_s']:.1f}" for m in rows) + " |")
        lines.append("")
    lines += ["Weight bytes count the codes and the float32 scales (and mins) a call reads; 'n/a': the group does "
              "not divide K (576 is not a multiple of 128).", ""]
    return "\n".join(lines)
