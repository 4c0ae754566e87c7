"""`cinq plan`'s output: aligned text tables for a terminal, markdown for results files, JSON for programs.
Both table forms come from one list of sections (title, header, rows), so they always say the same."""

from __future__ import annotations

import dataclasses
from typing import Any

from cinq.plan.memory import GIB
from cinq.plan.planner import Plan, Throughput
from cinq.markdown_table import markdown_table

Section = tuple[str, list[str], list[list[str]]]


def size(n: float) -> str:
    """Bytes in binary units, as memory is counted (KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def dollars(x: float | None) -> str:
    return "-" if x is None else f"${x:.3f}" if x < 1 else f"${x:.2f}"


def _numeric(cell: str) -> bool:
    return cell.replace(",", "").replace(".", "").replace("$", "").replace("%", "").lstrip("+-").isdigit()


def format_table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    """A table as markdown (pipes) or as aligned text (columns of numbers right-aligned)."""
    if markdown:
        return markdown_table(header, rows, "l" * len(header))
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    right = [all(_numeric(c) or c in ("", "-") for c in col) for col in zip(*rows)] if rows else []

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def render_sections(title: str, sections: list[Section], notes: list[str], markdown: bool) -> str:
    """Title, each section's table, then the notes."""
    out = [f"## {title}" if markdown else title]
    for name, header, rows in sections:
        out += ["", f"### {name}\n" if markdown else f"{name}:", format_table(header, rows, markdown)]
    if notes:
        out += [""] + [f"- {n}" if markdown else f"* {n}" for n in notes]
    return "\n".join(out) + "\n"


def _speed_row(label: str, t: Throughput) -> list[str]:
    return [label, f"{t.tokens_per_s:,.1f}", f"{t.step_ms:.2f}", t.bound, f"{t.comm_ms:.2f}",
            dollars(t.dollars_per_million)]


def plan_sections(plan: Plan) -> tuple[str, list[Section], list[str]]:
    """The plan as (title, sections, notes)."""
    s, m, d, tp = plan.settings, plan.memory, plan.device, plan.tensor_parallel_size
    title = (f"cinq plan: {plan.model} ({plan.num_params / 1e9:.2f}B parameters) on {tp} x {d.name}, "
             f"{plan.precision.name}" + (f" (group {plan.precision.group_size})" if plan.precision.quantized else "")
             + f", max_model_len {s.max_model_len}"
             + (f", context {s.context_len}" if s.context_len is not None else "") + f", concurrency {s.concurrency}")
    memory_rows = [
        ["card memory", size(d.memory_gib * GIB), f"usable {size(m.usable)}: x {s.gpu_memory_utilization} "
                                                 f"gpu_memory_utilization, less {d.reserved_gib} GiB reserved"],
        ["weights", size(m.weights), f"whole model {plan.weight_bytes_total / 1e9:.2f} GB "
                                     f"({size(plan.weight_bytes_total)}), / {tp} cards"],
        ["activations", size(m.activations), f"one step of {s.max_num_batched_tokens} tokens (estimate)"],
        ["KV cache", size(max(0, m.kv_budget)), f"{m.kv_tokens:,} tokens" if m.kv_budget > 0 else
         f"short by {size(-m.kv_budget)}"],
        ["KV per token", size(m.kv_per_token), f"whole model {size(plan.kv_bytes_per_token_total)}"],
        ["KV per sequence", size(m.kv_per_sequence), f"at {s.max_model_len} tokens"],
    ]
    if m.fits:
        fit = [["fits", "yes", f"at tensor_parallel_size {tp}"],
               ["max concurrent sequences", f"{m.max_num_sequences:,}", f"of {s.max_model_len} tokens each"]]
    else:
        fit = [["fits", "no", f"at tensor_parallel_size {tp}"]]
    need = plan.min_tensor_parallel_size
    fit.append(["minimum tensor_parallel_size", str(need) if need else "-",
                "" if need else ("no degree up to 64 fits" if d.link_gbs else "no interconnect: one device only")])
    sections: list[Section] = [("memory per card", ["item", "size", "note"], memory_rows),
                               ("fit", ["question", "answer", "note"], fit)]
    speed_header = ["decode at context " + str(s.decode_context), "tok/s", "ms/step", "bound", "all-reduce ms",
                    "$/1M tokens"]
    if plan.batch1 is not None and plan.at_concurrency is not None:
        label = f"batch {plan.at_concurrency.batch}" + (
            f" (concurrency {s.concurrency}, capped)" if plan.at_concurrency.batch < s.concurrency else "")
        rows = [_speed_row("batch 1", plan.batch1), _speed_row(label, plan.at_concurrency)]
        cross, weights_only = plan.crossover_batch, plan.crossover_batch_weights_only
        rows.append(["compute-bound from batch", str(cross) if cross else "never", "", "", "",
                     f"at context {s.decode_context}" if cross else "KV reads grow as fast as FLOPs"])
        rows.append(["compute-bound from batch", str(weights_only) if weights_only else "never", "", "", "",
                     "weights only (short contexts)"])
        rows.append([f"prefill of {s.decode_context} tokens", f"{plan.prefill_tokens_per_s:,.0f}",
                     f"{plan.prefill_ttft_s * 1e3:.1f}", "", "", "TTFT of one prompt alone"])
        sections.append(("roofline speed (all cards together)", speed_header, rows))
    if plan.tp_sweep:
        rows = []
        for r in plan.tp_sweep:
            b1, bc = r.batch1, r.at_concurrency
            rows.append([str(r.tensor_parallel_size), "yes" if r.fits else "no", f"{r.max_num_sequences:,}",
                         f"{b1.tokens_per_s:,.1f}" if b1 else "-", dollars(b1.dollars_per_million) if b1 else "-",
                         str(bc.batch) if bc else "-", f"{bc.tokens_per_s:,.1f}" if bc else "-",
                         dollars(bc.dollars_per_million) if bc else "-"])
        sections.append(("tensor parallelism", ["tp", "fits", "max seqs", "batch-1 tok/s", "$/1M", "batch",
                                                "tok/s", "$/1M"], rows))
    notes = [f"roofline: bandwidth {d.bandwidth_gbs:g} GB/s, {d.tflops:g} bf16 TFLOP/s per card; real engines reach "
             f"a fraction of it (`cinq plan --calibrate` shows cinq's on this machine)",
             f"price ${d.price_per_hour:g}/h per card is an illustrative default: give yours with --price-per-hour"]
    if d.link_gbs is not None and len(plan.tp_sweep) > 1:
        notes.append(f"tensor parallelism: 2 ring all-reduces per layer of the step's hidden states, "
                     f"{d.link_gbs:g} GB/s per direction + {d.link_latency_us:g} us each, not overlapped")
    return title, sections, notes


def render_plan(plan: Plan, markdown: bool = False) -> str:
    """The plan as text tables (or markdown)."""
    return render_sections(*plan_sections(plan), markdown=markdown)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_jsonable(x) for x in obj]
    return obj


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict (bytes as integers, speeds in tokens/s, times in ms or s as named)."""
    out = _jsonable(plan)
    out["memory"] |= {"fits": plan.memory.fits, "kv_tokens": plan.memory.kv_tokens}
    out["precision"]["quantized"] = plan.precision.quantized
    return out
