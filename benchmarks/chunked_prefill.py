"""Chunked-prefill token budget (``max_num_batched_tokens``, vLLM's ``--max-num-batched-tokens``) against the
latency of the long prompts and of the requests decoding beside them.

A few requests with short prompts and long outputs start decoding at once; long prompts (1024-1536 tokens) then
arrive one after another while they decode. Every engine step spends one token budget: decodes first, then
prefill chunks (``engine/scheduler.py``). A small budget cuts a long prompt into many chunks, so each step stays
short and the decoding requests' inter-token latency (ITL) stays low, but the long prompt needs many steps to its
first token (TTFT); a large budget prefills it in one or two heavy steps, which every decoding request waits
through. One fresh engine per budget (``rate_run``, arrival times given), the same requests and times each."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.workload import BenchRequest, TokenWindows, text_tokens
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class ChunkedPrefillOptions:
    """Budgets to compare, the decoding requests, the long prompts and when they arrive."""

    budgets: tuple[int, ...] = (64, 128, 256, 512, 2048)
    num_decoding: int = 8
    decode_prompt_len: int = 32
    decode_output_len: int = 192
    num_long: int = 4
    long_prompt_len: tuple[int, int] = (1024, 1536)  # uniform, inclusive
    long_output_len: int = 8
    first_long_s: float = 0.2  # the first long prompt's arrival after the decoding requests'
    long_interval_s: float = 0.8  # between long prompts
    repeats: int = 3  # sweeps over the budgets (the second in reverse order); latency samples pooled over them
    text: str = "held-out"
    seed: int = 0

    def validate(self) -> None:
        if not self.budgets or min(self.budgets) < 1:
            raise InvalidParameterError(f"budgets must be >= 1, got {list(self.budgets)}", "budgets")
        if min(self.budgets) <= self.num_decoding:
            raise InvalidParameterError(f"every budget must exceed num_decoding ({self.num_decoding}) so that a "
                                        f"step has room for a prefill chunk, got {min(self.budgets)}", "budgets")
        for name in ("num_decoding", "decode_prompt_len", "num_long", "long_output_len", "repeats"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}", name)
        if self.decode_output_len < 2:
            raise InvalidParameterError(f"decode_output_len must be >= 2 (ITL needs two tokens), got "
                                        f"{self.decode_output_len}", "decode_output_len")
        lo, hi = self.long_prompt_len
        if not 1 <= lo <= hi:
            raise InvalidParameterError(f"long_prompt_len must satisfy 1 <= low <= high, got [{lo}, {hi}]",
                                        "long_prompt_len")
        if self.first_long_s < 0 or self.long_interval_s < 0:
            raise InvalidParameterError("first_long_s and long_interval_s must be >= 0", "long_interval_s")


@dataclass(slots=True)
class ChunkedWorkload:
    """The requests in arrival order, their arrival times, and which are the decoding ones and the long ones."""

    requests: list[BenchRequest]
    offsets: list[float]
    decoding: list[int]
    long: list[int]


def chunked_workload(tokenizer: Any, options: ChunkedPrefillOptions) -> ChunkedWorkload:
    """Decoding requests at time 0, then the long prompts at ``first_long_s`` + i * ``long_interval_s``; prompts are
    consecutive windows of the shipped text (no two share a prefix-cache block)."""
    options.validate()
    rng = random.Random(options.seed)
    text = TokenWindows(text_tokens(tokenizer, options.text), start=options.seed * 7919)
    requests = [BenchRequest(text.take(options.decode_prompt_len), options.decode_output_len)
                for _ in range(options.num_decoding)]
    offsets = [0.0] * options.num_decoding
    for i in range(options.num_long):
        requests.append(BenchRequest(text.take(rng.randint(*options.long_prompt_len)), options.long_output_len))
        offsets.append(options.first_long_s + i * options.long_interval_s)
    n = options.num_decoding
    return ChunkedWorkload(requests, offsets, list(range(n)), list(range(n, len(requests))))


def run_chunked_prefill(config: EngineConfig, options: ChunkedPrefillOptions, progress: bool = True) -> BenchResult:
    """Serve the workload once per budget (see the module docstring)."""
    from cinq.bench.latency_stats import percentile
    from cinq.bench.rate_run import build_engine, run_at_rate
    from cinq.config import resolve_model
    from cinq.model.tokenizer import Tokenizer
    options.validate()
    config = dataclasses.replace(config, model=str(resolve_model(config.model)), speculative_config=None,
                                 seed=config.seed if config.seed is not None else 0)
    work = chunked_workload(Tokenizer.from_pretrained(config.tokenizer or config.model), options)
    longest = max(len(r.prompt) + r.output_len for r in work.requests)
    if config.max_model_len is not None and longest > config.max_model_len:
        raise InvalidParameterError(f"a long prompt and its output need {longest} tokens, over max_model_len "
                                    f"{config.max_model_len}", "long_prompt_len")
    bar = progress_bar(len(options.budgets) * options.repeats, "chunked-prefill", progress, unit="run")
    samples: dict[int, dict[str, list[float]]] = {b: {"ttft": [], "itl": [], "seconds": [], "running": []}
                                                  for b in options.budgets}
    prompt_tokens = sum(len(r.prompt) for r in work.requests)
    output_tokens = sum(r.output_len for r in work.requests)
    for rep in range(options.repeats):  # the machine drifts: every other sweep runs the budgets the other way
        for budget in options.budgets if rep % 2 == 0 else options.budgets[::-1]:
            engine = build_engine(dataclasses.replace(config, max_num_batched_tokens=budget),
                                  warmup_prompt_len=options.long_prompt_len[1])
            run = run_at_rate(engine, work.requests, float("nan"), offsets=work.offsets)
            del engine
            s = samples[budget]
            s["ttft"] += [1000 * run.ttft_s[i] for i in work.long]
            s["itl"] += run.itl_ms(work.decoding)
            s["seconds"].append(run.seconds)
            s["running"].append(run.mean_running)
            bar.update(1)
    bar.close()
    rows = []
    for budget, s in samples.items():
        seconds = sum(s["seconds"]) / len(s["seconds"])
        rows.append({"budget": budget, "ttft_long_p50_ms": percentile(s["ttft"], 50),
                     "ttft_long_p99_ms": percentile(s["ttft"], 99), "itl_p50_ms": percentile(s["itl"], 50),
                     "itl_p90_ms": percentile(s["itl"], 90), "itl_p99_ms": percentile(s["itl"], 99),
                     "itl_max_ms": max(s["itl"]), "output_tok_s": output_tokens / seconds,
                     "total_tok_s": (prompt_tokens + output_tokens) / seconds, "seconds": s["seconds"],
                     "mean_running": sum(s["running"]) / len(s["running"]), "itl_samples": len(s["itl"]),
                     "ttft_samples": len(s["ttft"])})
    data = {"config": {"model": model_label(config.model), "dtype": config.dtype, "device": config.device},
            "options": dataclasses.asdict(options),
            "workload": {"long_prompt_tokens": [len(work.requests[i].prompt) for i in work.long],
                         "offsets_s": work.offsets},
            "machine": machine_info(), "rows": rows}
    return chunked_prefill_result(data)


def chunked_prefill_result(data: dict[str, Any]) -> BenchResult:
    """The table, the headline, the reading and the plot of one run's ``data``."""
    rows, o, m = data["rows"], data["options"], data["machine"]
    table = Table("Token budget per step vs TTFT of the long prompts and ITL of the decoding requests",
                  ["max_num_batched_tokens", "TTFT long p50 / p99 ms", "ITL p50 / p90 / p99 / max ms",
                   "output tok/s", "total tok/s (prompt + output)", "seconds per run"])
    for r in rows:
        table.rows.append([r["budget"], f"{r['ttft_long_p50_ms']:.0f} / {r['ttft_long_p99_ms']:.0f}",
                           f"{r['itl_p50_ms']:.1f} / {r['itl_p90_ms']:.1f} / {r['itl_p99_ms']:.1f} / "
                           f"{r['itl_max_ms']:.0f}", r["output_tok_s"], r["total_tok_s"],
                           " / ".join(f"{x:.1f}" for x in r["seconds"])])
    small, large = rows[0], rows[-1]
    headline = (f"max_num_batched_tokens {small['budget']} vs {large['budget']}: ITL p99 "
                f"{small['itl_p99_ms'] / large['itl_p99_ms']:.2f}x, long-prompt TTFT p50 "
                f"{small['ttft_long_p50_ms'] / large['ttft_long_p50_ms']:.2f}x, total tok/s "
                f"{small['total_tok_s'] / large['total_tok_s']:.2f}x")
    lens = data["workload"]["long_prompt_tokens"]
    setup = (f"Model {data['config']['model']} ({data['config']['dtype']}, {data['config']['device']}). "
             f"{o['num_decoding']} requests with {o['decode_prompt_len']}-token prompts decode "
             f"{o['decode_output_len']} tokens each from time 0; {o['num_long']} long prompts ({min(lens)}-"
             f"{max(lens)} tokens, {o['long_output_len']} output tokens each) arrive from {o['first_long_s']} s, "
             f"one every {o['long_interval_s']} s, while they decode. Prompts are consecutive windows of the "
             f"shipped `{o['text']}` text (no shared prefix); greedy, ignore_eos; one fresh engine per budget and run "
             f"(warmed up with one {o['long_prompt_len'][1]}-token prompt), the same requests and arrival times each; "
             f"{o['repeats']} sweeps over the budgets (alternating order), latency samples pooled over them, "
             f"throughput from their mean time. TTFT of the long prompts from their arrival; ITL over every "
             f"gap between successive tokens of the decoding requests. CPU threads {m['threads']} of {m['cpus']}; "
             f"load average at end {m['loadavg_at_end']} (a shared machine).")
    best = min(rows, key=lambda r: r["itl_p99_ms"])
    reading = (f"Reading (from this run's numbers): the decoding requests' ITL p99 goes from "
               f"{small['itl_p99_ms']:.1f} ms at a budget of {small['budget']} to {large['itl_p99_ms']:.1f} ms at "
               f"{large['budget']} (max {small['itl_max_ms']:.0f} vs {large['itl_max_ms']:.0f} ms: the step that "
               f"prefills a whole long prompt), while the long prompts' TTFT p50 goes from "
               f"{small['ttft_long_p50_ms']:.0f} to {large['ttft_long_p50_ms']:.0f} ms; the lowest ITL p99 is at "
               f"{best['budget']}.")

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        budgets = [str(r["budget"]) for r in rows]
        ax1.plot(budgets, [r["itl_p99_ms"] for r in rows], "o-", label="ITL p99 (decoding)")
        ax1.plot(budgets, [r["itl_p50_ms"] for r in rows], "o--", label="ITL p50 (decoding)")
        ax1.plot(budgets, [r["ttft_long_p50_ms"] for r in rows], "s-", label="TTFT p50 (long prompts)")
        ax1.set_yscale("log")
        ax1.set_xlabel("max_num_batched_tokens")
        ax1.set_ylabel("ms")
        ax1.legend()
        ax2.bar(budgets, [r["total_tok_s"] for r in rows])
        ax2.set_xlabel("max_num_batched_tokens")
        ax2.set_title("total tokens/s (prompt + output)")

    return BenchResult("chunked-prefill", "Chunked-prefill token budget vs TTFT and ITL", setup, [table], headline,
                       data, notes=[reading], plot=plot)
