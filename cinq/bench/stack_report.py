"""The tables, headline and figure of ``cinq bench stack`` from its measured rows (``stack.run_stack``)."""

from __future__ import annotations

import math
from typing import Any

from cinq.bench.report import BenchResult, Table

MIB = 2 ** 20


def pair(a: float | None, b: float | None) -> str:
    """"p50 / p99" in whole milliseconds (n/a when not measured)."""
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a:.0f} / {b:.0f}"


def _acc(q: dict[str, Any]) -> str:
    if q.get("accuracy") is None:
        return "n/a"
    return f"{100 * q['accuracy']:.0f} ± {100 * q['accuracy_se']:.0f}"


def stack_result(data: dict[str, Any]) -> BenchResult:
    """The report: a speed table (both rates), a memory / quality / cost table, the headline (last row over the
    first) and bars of tokens/s and cost."""
    o, w, m = data["options"], data["workload"], data["machine"]
    rate = o["request_rate"]
    speed = Table(f"Speed: rate = inf and rate = {rate:g} req/s (ratios to the first row)",
                  ["configuration", "adds", "tok/s (inf)", "x first", "TTFT p50 / p99 ms (inf)",
                   "TPOT p50 / p99 ms (inf)", f"tok/s ({rate:g}/s)", f"TTFT p50 / p99 ms ({rate:g}/s)",
                   f"TPOT p50 / p99 ms ({rate:g}/s)", "tau", "prefix hit %"])
    cost = Table(f"Memory, quality and cost (price {o['price_per_hour']:g} $/h)",
                 ["configuration", "weights MiB", "peak KV MiB", "peak memory x first", "KV waste %",
                  "held-out ppl", "KL to bf16", "arith acc % ± SE", "$ / M output tokens", "cost x first"])
    for r in data["rows"]:
        if "inf" not in r:
            speed.rows.append([r["label"], r["missing"]] + [None] * 9)
            continue
        inf, at = r["inf"], r.get("rate") or {}
        speed.rows.append([r["label"], r["adds"], inf["tok_s"], r["tok_s_ratio"],
                           pair(inf["ttft_p50_ms"], inf["ttft_p99_ms"]), pair(inf["tpot_p50_ms"], inf["tpot_p99_ms"]),
                           at.get("tok_s"), pair(at.get("ttft_p50_ms"), at.get("ttft_p99_ms")),
                           pair(at.get("tpot_p50_ms"), at.get("tpot_p99_ms")), inf["tau"],
                           100 * inf["prefix_cache_hit_rate"]])
        q = r["quality"]
        cost.rows.append([r["label"], inf["weight_bytes"] / MIB, inf["peak_kv_bytes"] / MIB, r["memory_ratio"],
                          100 * inf["kv_waste"], q["perplexity"],
                          None if q["kl"] is None else f"{q['kl']:.4f}", _acc(q), r["cost_per_m_tokens"],
                          r["cost_ratio"]])
    measured = [r for r in data["rows"] if "inf" in r]
    first, last = measured[0], measured[-1]
    headline = (f"{last['label']} / {first['label']}: {last['tok_s_ratio']:.2f}x output tokens/s at rate = inf, "
                f"{last['memory_ratio']:.2f}x peak memory, cost "
                + (f"{last['cost_ratio']:.2f}x" if last.get("cost_ratio") else "n/a") + " per output token")
    q = o["quality"]
    setup = (f"Model {data['config']['model']} ({data['config']['dtype']}, {data['config']['device']}), measured "
             f"with this checkout's shipped assets (a retrained model gives other numbers: rerun the command). "
             f"Workload: {o['workload']['num_requests']} requests ({w['counts']}), {w['prompt_tokens']} prompt "
             f"tokens of which {w['shared_prefix_tokens']} repeat an earlier request's prefix, "
             f"{w['output_tokens']} output tokens (greedy, ignore_eos, {o['workload']['output_len'][0]}-"
             f"{o['workload']['output_len'][1]} each), arriving all at once (inf) or as a Poisson process of "
             f"{rate:g} req/s, in process, a fresh engine per rate. TTFT counts from a request's scheduled "
             f"arrival; TPOT = (last - first token time) / (tokens - 1). Peak memory = weights (+ speculative "
             f"heads) + the most KV blocks live requests held at once (HF: its padded static batches of "
             f"{o['hf_batch_size']}); KV waste = held KV slots without a computed token (HF: padding and tokens "
             f"past a request's own length). Quality: perplexity and KL to the bf16 dense model on the first "
             f"{q['ppl_tokens']} held-out tokens (context {q['context_len']}); arithmetic accuracy of the served "
             f"configuration on {q['n_problems']} test problems (binomial SE). Cost = price / tokens per hour at "
             f"rate = inf. CPU threads {m['threads']} of {m['cpus']}; load average at end {m['loadavg_at_end']} "
             f"(a shared machine: single runs, no repeats).")

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        labels = [r["label"].replace("+ ", "+\n") for r in measured]
        ax1.bar(range(len(measured)), [r["inf"]["tok_s"] for r in measured])
        ax1.set_xticks(range(len(measured)), labels, fontsize=6)
        ax1.set_title("output tokens/s (rate = inf)")
        ax2.bar(range(len(measured)), [r["cost_per_m_tokens"] or 0 for r in measured], color="tab:orange")
        ax2.set_xticks(range(len(measured)), labels, fontsize=6)
        ax2.set_title(f"$ per million output tokens at {o['price_per_hour']:g} $/h")

    notes = ["The distilled-student row serves without speculation: the EAGLE head was trained on the teacher's "
             "features. The transformers row has no server (static batched generate at rate = inf): its latency "
             "columns are n/a."]
    return BenchResult("stack", "Every technique stacked: one model, one mixed workload, one row per configuration",
                       setup, [speed, cost], headline, data, notes, plot=plot)
