"""Prefix caching, measured (issue 17): the shared-prefix and chat-replay workloads (``prefix_workload``) with
automatic prefix caching on and off in the same run (off is the baseline), then the hit rate as the KV budget
(``num_kv_blocks``) shrinks below what the workload needs to keep everything, so that blocks get evicted.

TTFT is the engine's own (first token time - arrival, from ``RequestMetrics``); the hit rate is the engine's
prefix-cache counters (``EngineStats.prefix_cache_hits / prefix_cache_queries``) over the measured requests.
The goal of the issue: with caching on, TTFT >= 5x lower and throughput >= 2x on the shared-prefix workload."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from cinq.bench.drive import run_until_done
from cinq.bench.latency_stats import summarize_ms
from cinq.bench.prefix_workload import (WORKLOADS, PrefixWorkloadOptions, build_prefix_workload, footprint_blocks,
                                        min_blocks)
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.workload import BenchRequest, text_tokens
from cinq.config import EngineConfig
from cinq.option_fields import bounded_each, check_bounds

GOAL_TTFT = 5.0  # x lower TTFT (p50) with caching on
GOAL_THROUGHPUT = 2.0  # x output tokens/s with caching on


@dataclass(slots=True)
class PrefixOptions:
    """The workloads, the text they are cut from and the KV budgets of the eviction sweep (fractions of the
    blocks each workload needs to keep everything; never fewer than its longest request needs)."""

    workload: PrefixWorkloadOptions = field(default_factory=PrefixWorkloadOptions)
    text: str = "held-out"
    kv_fractions: tuple[float, ...] = bounded_each((1.0, 0.5, 0.25, 0.125), gt=0, le=16)
    seed: int = 0

    def validate(self) -> None:
        check_bounds(self)


def run_prefix(config: EngineConfig, options: PrefixOptions, progress: bool = True) -> BenchResult:
    """Caching off (baseline) and on, both workloads; then the eviction sweep with caching on."""
    load_at_start = os.getloadavg()[0]
    from cinq.engine.engine import LLMEngine
    options.validate()
    off_cfg = dataclasses.replace(config, enable_prefix_caching=False)
    engine = LLMEngine(off_cfg)
    options.workload.validate(engine.max_model_len)
    work = build_prefix_workload(text_tokens(engine.tokenizer, options.text), options.workload, options.seed)
    bs = engine.config.block_size
    sweep_points = {name: _budgets(work.rounds(name), bs, options.kv_fractions) for name in WORKLOADS}
    total = 2 * sum(_count(work.rounds(n)) for n in WORKLOADS) + sum(
        _count(work.rounds(n)) * len(points) for n, points in sweep_points.items())
    bar = progress_bar(total, "prefix", progress)
    modes: dict[str, dict[str, Any]] = {"off": {}, "on": {}}
    for mode in ("off", "on"):
        if mode == "on":
            del engine  # one engine's KV cache at a time
            engine = LLMEngine(dataclasses.replace(config, enable_prefix_caching=True))
        _run_rounds(engine, [work.warmup], None)
        for name in WORKLOADS:
            bar.set_description(f"prefix: {name}, caching {mode}")
            modes[mode][name] = _run_rounds(engine, work.rounds(name), bar)
    del engine
    sweep = []
    for name, points in sweep_points.items():
        for fraction, blocks in points:
            bar.set_description(f"prefix: {name}, {blocks} KV blocks")
            eng = LLMEngine(dataclasses.replace(config, enable_prefix_caching=True, num_kv_blocks=blocks))
            sweep.append({"workload": name, "kv_fraction": fraction, "num_kv_blocks": blocks,
                          **_run_rounds(eng, work.rounds(name), bar)})
            del eng
    bar.close()
    ratios = {name: {"ttft_p50_off_over_on": _div(modes["off"][name]["ttft_ms"]["median"],
                                                  modes["on"][name]["ttft_ms"]["median"]),
                     "ttft_p99_off_over_on": _div(modes["off"][name]["ttft_ms"]["p99"],
                                                  modes["on"][name]["ttft_ms"]["p99"]),
                     "throughput_on_over_off": _div(modes["on"][name]["output_throughput"],
                                                    modes["off"][name]["output_throughput"])}
              for name in WORKLOADS}
    shared = ratios["shared_prefix"]
    goal_met = shared["ttft_p50_off_over_on"] >= GOAL_TTFT and shared["throughput_on_over_off"] >= GOAL_THROUGHPUT
    data = {"config": {"model": model_label(config.model), "dtype": config.dtype,
                       "block_size": bs, "max_num_batched_tokens": config.max_num_batched_tokens,
                       "max_num_seqs": config.max_num_seqs},
            "options": {**dataclasses.asdict(options.workload), "text": options.text,
                        "kv_fractions": list(options.kv_fractions), "seed": options.seed},
            "footprint_blocks": {n: footprint_blocks(work.rounds(n), bs) for n in WORKLOADS},
            "machine": machine_info(load_at_start), "caching_off": modes["off"], "caching_on": modes["on"],
            "ratios": ratios,
            "goal": {"ttft_p50_x": GOAL_TTFT, "throughput_x": GOAL_THROUGHPUT, "met": goal_met},
            "eviction_sweep": sweep}
    return _result(data)


def _count(rounds: list[list[BenchRequest]]) -> int:
    return sum(len(r) for r in rounds)


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _budgets(rounds: list[list[BenchRequest]], block_size: int, fractions: tuple[float, ...]
             ) -> list[tuple[float, int]]:
    """(fraction, num_kv_blocks) per sweep point, the block count raised to what the longest request needs."""
    full, least = footprint_blocks(rounds, block_size), min_blocks(rounds, block_size)
    return [(f, max(least, int(round(f * full)))) for f in fractions]


def _run_rounds(engine: Any, rounds: list[list[BenchRequest]], bar: Any) -> dict[str, Any]:
    """Send each round's requests together and run them to the end before the next round; TTFT per request,
    throughput over the whole workload, the engine's prefix-cache counters over it."""
    from cinq.sampling_params import OutputKind, SamplingParams
    before = engine.get_stats()
    ttfts: list[float] = []
    out_tokens = prompt_tokens = 0
    start = time.perf_counter()
    for round_ in rounds:
        ids = []
        for r in round_:
            rid = f"p{len(ttfts) + len(ids)}-{time.perf_counter_ns()}"
            engine.add_request(rid, r.prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                             ignore_eos=True, output_kind=OutputKind.FINAL_ONLY))
            ids.append(rid)
            prompt_tokens += len(r.prompt)
        outs = run_until_done(engine, bar)
        for rid in ids:
            m = outs[rid].metrics
            ttfts.append(m.first_token_time - m.arrival_time)
            out_tokens += len(outs[rid].outputs[0].token_ids)
    duration = time.perf_counter() - start
    after = engine.get_stats()
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    return {"requests": len(ttfts), "prompt_tokens": prompt_tokens, "output_tokens": out_tokens,
            "prompt_tokens_computed": after.prompt_tokens - before.prompt_tokens, "duration_s": duration,
            "ttft_ms": summarize_ms(ttfts), "output_throughput": out_tokens / duration,
            "request_throughput": len(ttfts) / duration,
            "total_token_throughput": (prompt_tokens + out_tokens) / duration,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits, "hit_rate": hits / queries if queries else 0.0,
            "num_preemptions": after.num_preemptions - before.num_preemptions}


def _result(data: dict[str, Any]) -> BenchResult:
    cols = ["workload", "prefix caching", "TTFT p50 (ms)", "TTFT p99 (ms)", "req/s", "out tok/s", "hit rate (%)",
            "prompt tokens computed"]
    table = Table("Prefix caching on vs off (same workload, same run)", cols)
    for name in WORKLOADS:
        for mode, label in (("caching_off", "off (baseline)"), ("caching_on", "on")):
            r = data[mode][name]
            table.rows.append([name, label, r["ttft_ms"]["median"], r["ttft_ms"]["p99"], r["request_throughput"],
                               r["output_throughput"], 100 * r["hit_rate"],
                               f"{r['prompt_tokens_computed']} of {r['prompt_tokens']}"])
        q = data["ratios"][name]
        table.rows.append([name, "off / on (TTFT), on / off (tok/s)", q["ttft_p50_off_over_on"],
                           q["ttft_p99_off_over_on"], "", q["throughput_on_over_off"], "", ""])
    sweep = Table("Eviction: hit rate as the KV budget shrinks (caching on)",
                  ["workload", "num_kv_blocks", "of footprint (%)", "hit rate (%)", "TTFT p50 (ms)", "out tok/s",
                   "preemptions"])
    for s in data["eviction_sweep"]:
        foot = data["footprint_blocks"][s["workload"]]
        sweep.rows.append([s["workload"], s["num_kv_blocks"], 100 * s["num_kv_blocks"] / foot, 100 * s["hit_rate"],
                           s["ttft_ms"]["median"], s["output_throughput"], s["num_preemptions"]])
    o, c, m = data["options"], data["config"], data["machine"]
    setup = (f"Model {c['model']} ({c['dtype']}), block size {c['block_size']}, token budget "
             f"{c['max_num_batched_tokens']} per step. Prompts cut from the `{o['text']}` text with the model's "
             f"tokenizer. **shared_prefix**: a {o['prefix_len']}-token prefix shared by {o['num_requests']} requests, "
             f"each adding {o['suffix_len']} tokens of its own, all queued at once. **chat_replay**: "
             f"{o['num_conversations']} recorded conversations of {o['num_turns']} turns ({o['turn_len']}-token user "
             f"messages, {o['reply_len']}-token recorded replies), turn t of every conversation sent once turn t-1 "
             f"has finished. Every request generates {o['output_len']} tokens (greedy, ignore_eos). TTFT = first "
             f"token - arrival, in the engine. Footprint: KV blocks that hold the whole workload without eviction "
             f"(shared_prefix {data['footprint_blocks']['shared_prefix']}, chat_replay "
             f"{data['footprint_blocks']['chat_replay']}). CPU threads {m['threads']}; load average at end "
             f"{m['loadavg_at_end']}.")
    q = data["ratios"]["shared_prefix"]
    verdict = "met" if data["goal"]["met"] else "not met"
    headline = (f"shared prefix, caching on vs off: TTFT p50 {q['ttft_p50_off_over_on']:.1f}x lower, p99 "
                f"{q['ttft_p99_off_over_on']:.1f}x lower, throughput {q['throughput_on_over_off']:.2f}x; goal "
                f"(TTFT >= {GOAL_TTFT:g}x lower, throughput >= {GOAL_THROUGHPUT:g}x) {verdict}")

    def plot(fig: Any) -> None:
        ax1, ax2, ax3 = fig.subplots(1, 3)
        x = range(len(WORKLOADS))
        for i, (mode, label) in enumerate((("caching_off", "caching off"), ("caching_on", "caching on"))):
            xs = [j + 0.4 * i for j in x]
            ax1.bar(xs, [data[mode][n]["ttft_ms"]["median"] for n in WORKLOADS], width=0.4, label=label)
            ax2.bar(xs, [data[mode][n]["output_throughput"] for n in WORKLOADS], width=0.4, label=label)
        for ax, title in ((ax1, "TTFT p50 (ms)"), (ax2, "output tokens/s")):
            ax.set_xticks([j + 0.2 for j in x], list(WORKLOADS))
            ax.set_title(title)
            ax.legend()
        ax1.set_yscale("log")  # off and on differ by an order of magnitude
        for name in WORKLOADS:
            pts = [s for s in data["eviction_sweep"] if s["workload"] == name]
            foot = data["footprint_blocks"][name]
            ax3.plot([100 * s["num_kv_blocks"] / foot for s in pts], [100 * s["hit_rate"] for s in pts], "o-",
                     label=name)
        ax3.set_xlabel("num_kv_blocks, % of the workload's footprint")
        ax3.set_ylabel("hit rate (%)")
        ax3.set_title("hit rate as the KV budget shrinks")
        ax3.legend()
        ax3.grid(alpha=.3)

    notes = ["Reading the sweep: in shared_prefix every request is queued at once, so some running request always "
             "holds the prefix and a smaller budget costs queueing and preemption (TTFT, tokens/s), not hits; in "
             "chat_replay a conversation's history sits in freed blocks between its turns, which a smaller budget "
             "evicts (LRU), so its hit rate falls."]
    return BenchResult("prefix", "Prefix caching on vs off (same workload, same run)", setup, [table, sweep],
                       headline, data, notes, plot)
