"""The batch-1 latency report from its JSON (``data``): one table (a row per model, prompt length, threads and
engine, each with its ratio to the engine it is paired with), the headline ratios, the goals against llama.cpp and
the plot. Kept apart from the measurement so that ``benchmarks/latency.py --render`` rebuilds a committed report
from its JSON without measuring."""

from __future__ import annotations

from typing import Any

from cinq.bench.report import BenchResult, Table

COLUMNS = ["model", "prompt", "threads", "engine", "decode tok/s", "ms/step (median)", "TTFT median (ms)",
           "per-token p99 (ms)", "ratio", "vs", "extra ms/step", "load (1 min)"]
# (engine, its pair, the goal's words): checked whenever both were measured
GOALS = (("cinq bf16", "llama.cpp bf16", "bf16 >= 1.0x llama.cpp bf16"),
         ("cinq int4", "llama.cpp q4_0", "int4 >= 1.0x q4_0"))


def latency_result(data: dict[str, Any]) -> BenchResult:
    """``data`` (rows as latency.measure makes them, with their model) as a report."""
    rows = data["rows"]
    by_key = {(r["model"], r["prompt_len"], r["threads"], r["engine"]): r for r in rows}
    table = Table("Batch-1 latency", COLUMNS)
    for r in rows:
        base = by_key.get((r["model"], r["prompt_len"], r["threads"], r["vs"]))
        table.rows.append([r["model"], r["prompt_len"], r["threads"], r["engine"], r["tok_s"], r["ms_step"],
                           1000 * r["prefill_s"], r.get("tpot_ms", {}).get("p99"), r["ratio"],
                           r["vs"] if base else ("absent" if r["vs"] else ""),
                           f"{r['ms_step'] - base['ms_step']:+.2f}" if base else "",
                           ", ".join(f"{v:.1f}" for v in r["loadavg_1m"])])
    missing = data.get("missing")
    if missing is None:  # a report written before the fold: only llama.cpp could be absent
        missing = [f"llama.cpp baseline ABSENT: {data['llama_cpp_absent']}"] if data.get("llama_cpp_absent") else []
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    title = "Batch-1 latency: " + " vs ".join(["cinq", *dict.fromkeys(_family(e) for e in engines
                                                                      if _family(e) != "cinq")])
    setup = (f"{data['new_tokens']} new tokens (greedy, end of text ignored) after random prompt ids, the same "
             f"for every engine; {data['rounds']} interleaved round(s) after a warm-up round, every engine once per "
             "setting per round in an order rotated each round. Decode tok/s = 1000 / the median ms per decode "
             "step of a generation, median over generations; TTFT = prompt in to first token out. ratio: this "
             "row's decode tok/s over the row named in vs (same model, prompt and threads, same run; cinq int8 - "
             "llama.cpp q8_0, int4 - q4_0); extra ms/step: this row's minus that row's. Load average recorded at "
             "each generation.")
    headline = "; ".join([_ratios(rows, e) for e in engines if any(r["engine"] == e and r["ratio"] is not None
                                                                  for r in rows)] or
                         [_speeds(rows, e) for e in engines if e.startswith("cinq")])
    headline = "; ".join([headline] + missing)
    notes = [f"- goal {words}: {_goal(rows, engine, pair)}" for engine, pair, words in GOALS
             if any(r["engine"] == engine and r["vs"] == pair and r["ratio"] is not None for r in rows)]
    m = data["machine"]
    notes.append(f"Machine: {m['cpu']}, torch {m['torch']}, llama-cpp-python {m.get('llama_cpp') or 'absent'}, "
                 f"OMP_WAIT_POLICY={m.get('omp_wait_policy')} for every engine (one process).")

    def plot(fig: Any) -> None:
        settings = list(dict.fromkeys((r["model"], r["prompt_len"], r["threads"]) for r in rows))
        axes = fig.subplots(1, 2)
        width = 0.8 / len(engines)
        for i, engine in enumerate(engines):
            xs, steps, ttfts = [], [], []
            for j, s in enumerate(settings):
                r = by_key.get((*s, engine))
                if r is not None:
                    xs.append(j + i * width)
                    steps.append(r["ms_step"])
                    ttfts.append(1000 * r["prefill_s"])
            axes[0].bar(xs, steps, width=width, label=engine)
            axes[1].bar(xs, ttfts, width=width, label=engine)
        for ax, what in zip(axes, ("ms per decode step, median", "time to first token, median (ms)")):
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(settings))],
                          [f"{mo}\np{n} t{t}" for mo, n, t in settings], fontsize=7)
            ax.set_title(what)
            ax.legend(fontsize=7)

    return BenchResult("latency", title, setup, [table], headline, data, notes, plot)


def _family(engine: str) -> str:
    return engine.split(" ")[0]


def _where(r: dict[str, Any]) -> str:
    return f"prompt {r['prompt_len']}, {r['threads']} thr"


def _ratios(rows: list[dict[str, Any]], engine: str) -> str:
    mine = [r for r in rows if r["engine"] == engine and r["ratio"] is not None]
    if len(mine) <= 4:
        values = ", ".join(f"{r['ratio']:.2f}x ({_where(r)})" for r in mine)
    else:
        ratios = [r["ratio"] for r in mine]
        values = f"{min(ratios):.2f}x to {max(ratios):.2f}x over {len(mine)} settings"
    return f"{engine} / {mine[0]['vs']} decode tok/s: {values}"


def _speeds(rows: list[dict[str, Any]], engine: str) -> str:
    return f"{engine} decode: " + ", ".join(f"{r['tok_s']:.1f} tok/s ({_where(r)})" for r in rows
                                            if r["engine"] == engine)


def _goal(rows: list[dict[str, Any]], engine: str, pair: str) -> str:
    ratios = [r["ratio"] for r in rows if r["engine"] == engine and r["vs"] == pair and r["ratio"] is not None]
    verdict = "met" if min(ratios) >= 1.0 else "**missed**"
    return f"{verdict} ({min(ratios):.2f}x to {max(ratios):.2f}x over {len(ratios)} settings)"
