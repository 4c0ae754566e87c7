"""The report of benchmarks/step_breakdown.py: its JSON and markdown (per model and thread count, the phases, the
clean step, kernel and host time, op counts, before / after / compiled), and the goals it reads off a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _goals(runs: list[dict[str, Any]]) -> list[str]:
    """The issue's goals and the thread-count question, read off this run's 'after' numbers."""
    after = {(r["model"], r["threads"]): r["after"] for r in runs}
    lines = ["## Goals (this checkout, this run)", "", "| goal | measured | |", "|---|---|---|"]
    tiny = after.get(("cinq-tiny", 1))
    if tiny:
        lines.append(f"| cinq-tiny bf16 batch 1 <= 1 ms / step | {tiny['step_ms_median']:.2f} ms "
                     f"wall, {tiny['cpu_ms_median']:.2f} ms CPU (roofline at the measured bandwidth "
                     f"{tiny['roofline_ms']:.2f} ms) | {'met' if tiny['step_ms_median'] <= 1 else 'missed'} |")
    for t in sorted({r["threads"] for r in runs}):
        dense = after.get(("llama-110m", t))
        for name, what in (("llama-110m-int4", "LM head int4 (cinq quantize --lm-head)"),
                           ("llama-110m-int4-bf16-head", "LM head bf16")):
            int4 = after.get((name, t))
            if dense and int4:
                wall = dense["step_ms_median"] / int4["step_ms_median"]
                cpu = dense["cpu_ms_median"] / int4["cpu_ms_median"]
                lines.append(f"| int4 >= 2.5x bf16, ~110M, {t} thread(s), {what} | {wall:.2f}x wall, {cpu:.2f}x "
                             f"CPU | {'met' if min(wall, cpu) >= 2.5 else 'missed'} |")
    lines += ["", "| model | 1 thread ms / step (wall, CPU) | 2 threads ms / step (wall, CPU) |", "|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in runs):
        one, two = after.get((model, 1)), after.get((model, 2))
        if one and two:
            lines.append(f"| {model} | {one['step_ms_median']:.2f}, {one['cpu_ms_median']:.2f} | "
                         f"{two['step_ms_median']:.2f}, {two['cpu_ms_median']:.2f} |")
    return lines + [
        "", "Reading these numbers: the machine is shared (2 cores, load average above 4 means other jobs hold the "
        "cores), so wall times are dominated by waiting; CPU ms leave the waits out but not the memory traffic of "
        "the other jobs. The roofline row divides the weight bytes by a streaming read of 256 MiB from memory; "
        "cinq-tiny's 22 MB could stay in a quiet machine's 32 MiB L3 and go faster than that. What the changes "
        "remove is per-step dispatch (ATen ops, exact); the weight stream (the qkv / o / MLP / LM-head rows) is "
        "what is left of a step.", ""]


def write(result: dict[str, Any], out: Path, compiled: dict[str, Any]) -> None:
    """``out``.json and ``out``.md of a run (``compiled``: the compilation config its 'compiled' columns ran)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    batch, prompt_len = result.get("batch", 1), result.get("prompt_len", 32)
    lines = [f"# Batch-{batch} decode step breakdown (before / after, same run)", "",
             f"`python benchmarks/step_breakdown.py`: greedy batch {batch} after a {prompt_len}-token prompt, bf16, "
             f"medians over "
             f"repeats; 'before' is commit {result['baseline']} ('none': not measured) run back to back with this "
             "checkout ('after', or 'eager' without a 'before'; "
             f"'compiled': this checkout's compiled decode step, `{json.dumps(compiled)}`), alternating "
             "subprocesses. The clean step and the kernel time run the fused decode step (cinq/model/decode_layers.py) "
             "where it applies ('fused steps' > 0); the phases time the Python layers it replaces (it has none of its "
             "own). Phase times are process CPU ms from an instrumented run (timers add a little; CPU time "
             "leaves out the time other jobs on this shared machine take the cores; not measured for the compiled "
             "step, whose graph the timers would break); 'clean step' is a run without instrumentation, wall and "
             "CPU. Kernel time: the self time (wall) of the native kernels and ATen's compute ops on the stepping "
             "thread under the torch profiler (a team's parts on other threads overlap it); host time: a clean run's wall minus the kernel time of the profiled run right after it, the "
             "median over 7 such pairs of 10 steps (meaningful on a quiet machine only: under load both include "
             "waits for a core). ATen ops and host syncs are per decode step "
             "(exact counts; the ops include those the native kernels dispatch); profiled ops: ATen and native op "
             "calls the profiler saw per step.", ""]
    for run in result["runs"]:
        labels = [k for k in ("before", "after", "compiled") if k in run]
        cols = [run[k] for k in labels]
        lines += [f"## {run['model']}, {run['threads']} torch thread(s)", "",
                  "load average during the runs (1 min): " + ", ".join(f"{x[0]:.2f}" for c in cols
                                                                       for x in c["loadavg"]), "",
                  "| phase (ms / step) | " + " | ".join("eager" if k == "after" and "before" not in run else k
                                                        for k in labels) + " |", "|---|" + "---:|" * len(labels)]

        def row(name: str, key: str, fmt: str, cols: list[dict[str, Any]] = cols) -> str:
            vals = [c.get(key, float("nan")) for c in cols]
            return f"| {name} | " + " | ".join("" if v != v or v == -1 else f"{v:{fmt}}" for v in vals) + " |"
        for p in cols[0]["phases_ms"]:  # the phases in step order, then "other"
            lines.append(f"| {p} | " + " | ".join("" if c["phases_ms"].get(p, float("nan")) != c["phases_ms"].get(
                p, float("nan")) else f"{c['phases_ms'][p]:.3f}" for c in cols) + " |")
        lines += [row("**instrumented step (CPU)**", "instrumented_step_ms_median", ".3f"),
                  row("**clean step (wall)**", "step_ms_median", ".3f"),
                  row("**clean step (CPU)**", "cpu_ms_median", ".3f"),
                  row("kernel time (ms)", "kernel_ms", ".3f"),
                  row("**host time (ms)**", "host_ms", ".3f"),
                  row("ATen ops / step", "aten_ops", "d"), row("profiled ops / step", "profiled_ops", ".0f"),
                  row("host syncs / step", "host_syncs", "d"), row("fused decode steps", "fused_steps", "d"),
                  row("weights + buffers (MB)", "weight_mb", ".1f"),
                  row("measured read bandwidth (GB/s)", "read_bandwidth_gb_s", ".1f"),
                  row("roofline at that bandwidth (ms)", "roofline_ms", ".3f"), ""]
        a = run["after"]
        for label in ("before", "compiled"):
            if label in run:
                o = run[label]
                x, y = (o, a) if label == "before" else (a, o)  # the speed-up of the later version
                lines += [f"**{'after vs before' if label == 'before' else 'compiled vs eager'}: "
                          f"{x['step_ms_median'] / y['step_ms_median']:.2f}x wall, "
                          f"{x['cpu_ms_median'] / y['cpu_ms_median']:.2f}x CPU**, host time {x['host_ms']:.3f} -> "
                          f"{y['host_ms']:.3f} ms; greedy tokens identical: "
                          f"{o['first_tokens'] == a['first_tokens']}", ""]
    lines += _goals(result["runs"])
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')}")
