"""Batch-1 latency: time to first token, per-token decode latency (mean / median / p99) and decode tokens/s at
a few prompt lengths, cinq's engine against Hugging Face transformers ``generate`` (batch 1, its own KV cache)
on the same model and the same prompts, in one run."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from cinq.bench.hf_baseline import hf_available, hf_token_times, load_hf_model
from cinq.bench.latency_stats import summarize_ms
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class LatencyOptions:
    """Prompt lengths to measure, tokens generated per request, repetitions (their samples pooled)."""

    input_lens: tuple[int, ...] = (128, 1024)
    output_len: int = 128
    num_iters: int = 3
    seed: int = 0
    baseline: bool = True

    def validate(self, max_model_len: int) -> None:
        if not self.input_lens or min(self.input_lens) < 1:
            raise InvalidParameterError(f"input_lens must be positive, got {list(self.input_lens)}", "input_lens")
        if self.output_len < 2:
            raise InvalidParameterError(f"output_len must be >= 2, got {self.output_len}", "output_len")
        if self.num_iters < 1:
            raise InvalidParameterError(f"num_iters must be >= 1, got {self.num_iters}", "num_iters")
        longest = max(self.input_lens) + self.output_len
        if longest > max_model_len:
            raise InvalidParameterError(
                f"input_len {max(self.input_lens)} + output_len {self.output_len} = {longest} exceeds "
                f"max_model_len {max_model_len}", "input_lens")


def run_latency(config: EngineConfig, options: LatencyOptions, progress: bool = True) -> BenchResult:
    """Measure cinq and (unless ``options.baseline`` is off) transformers at each prompt length."""
    from cinq.engine.engine import LLMEngine
    engine = LLMEngine(config)
    options.validate(engine.max_model_len)
    rng = random.Random(options.seed)
    prompts = {n: [[rng.randrange(engine.vocab_size) for _ in range(n)] for _ in range(options.num_iters)]
               for n in options.input_lens}
    _cinq_token_times(engine, [rng.randrange(engine.vocab_size) for _ in range(16)], 4)  # warm-up
    missing = None
    model = None
    if options.baseline and hf_available():
        model = load_hf_model(engine.config.model, engine.config.dtype)
        hf_token_times(model, prompts[options.input_lens[0]][0][:16], 4)  # warm-up
    elif options.baseline:
        missing = "transformers is not installed (pip install transformers): no baseline"
    runs = len(options.input_lens) * options.num_iters * (2 if model is not None else 1)
    bar = progress_bar(runs, "latency", progress, unit="run")
    rows = []
    for n in options.input_lens:
        row: dict[str, Any] = {"input_len": n}
        for name, measure in (("cinq", lambda p: _cinq_token_times(engine, p, options.output_len)),
                              ("hf", lambda p: hf_token_times(model, p, options.output_len))):
            if name == "hf" and model is None:
                row[name] = None
                continue
            ttfts, gaps = [], []
            for prompt in prompts[n]:
                ttft, per_token = measure(prompt)
                ttfts.append(ttft)
                gaps += per_token
                bar.update(1)
            row[name] = _summary(ttfts, gaps)
        if row["hf"]:
            row["decode_speedup"] = row["cinq"]["decode_tok_s"] / row["hf"]["decode_tok_s"]
            row["ttft_speedup"] = row["hf"]["ttft_ms"]["median"] / row["cinq"]["ttft_ms"]["median"]
        rows.append(row)
    bar.close()
    data = {"config": {"model": model_label(engine.config.model), "dtype": engine.config.dtype},
            "options": {"input_lens": list(options.input_lens), "output_len": options.output_len,
                        "num_iters": options.num_iters, "seed": options.seed},
            "machine": machine_info(), "rows": rows}
    return _result(data, missing)


def _cinq_token_times(engine: Any, prompt: list[int], new_tokens: int) -> tuple[float, list[float]]:
    """(time to first token, gaps between later tokens) in seconds, one request alone in the engine."""
    from cinq.sampling_params import SamplingParams
    engine.add_request(f"lat-{time.perf_counter_ns()}", prompt,
                       SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    start = time.perf_counter()
    times: list[float] = []
    while engine.has_unfinished_requests():
        if engine.step():  # one output per step that produced a token for the request
            times.append(time.perf_counter())
    return times[0] - start, [b - a for a, b in zip(times, times[1:])]


def _summary(ttfts: list[float], gaps: list[float]) -> dict[str, Any]:
    per_token = summarize_ms(gaps)
    return {"ttft_ms": summarize_ms(ttfts), "tpot_ms": per_token, "decode_tok_s": 1000 / per_token["mean"]}


def _result(data: dict[str, Any], missing: str | None) -> BenchResult:
    table = Table("Batch-1 latency", ["prompt tokens", "engine", "TTFT median (ms)", "TTFT p99 (ms)",
                                      "per-token mean (ms)", "per-token median (ms)", "per-token p99 (ms)",
                                      "decode tok/s"])
    for row in data["rows"]:
        for name, label in (("cinq", "cinq"), ("hf", "HF transformers generate (baseline)")):
            s = row[name]
            if s is None:
                continue
            table.rows.append([row["input_len"], label, s["ttft_ms"]["median"], s["ttft_ms"]["p99"],
                               s["tpot_ms"]["mean"], s["tpot_ms"]["median"], s["tpot_ms"]["p99"], s["decode_tok_s"]])
        if row["hf"]:
            table.rows.append([row["input_len"], "cinq / HF", row["ttft_speedup"], "", "", "", "",
                               row["decode_speedup"]])
    o, m = data["options"], data["machine"]
    setup = (f"Model {data['config']['model']} ({data['config']['dtype']}); one request at a time, random "
             f"token-id prompts of {o['input_lens']} tokens, {o['output_len']} new tokens (greedy, ignore_eos), "
             f"{o['num_iters']} requests per length, samples pooled. The cinq / HF row: TTFT and decode tokens/s "
             f"ratios (higher is better for cinq). CPU threads {m['threads']}; load average at end "
             f"{m['loadavg_at_end']}.")
    with_hf = [r for r in data["rows"] if r["hf"]]
    if with_hf:
        headline = "cinq / HF transformers decode tokens/s at batch 1: " + ", ".join(
            f"{r['decode_speedup']:.2f}x (prompt {r['input_len']})" for r in with_hf)
    else:
        headline = ("cinq batch-1 decode: " + ", ".join(f"{r['cinq']['decode_tok_s']:.1f} tok/s (prompt "
                                                         f"{r['input_len']})" for r in data["rows"])
                    + f"; {missing or 'baseline skipped (--no-baseline)'}")

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        lens = [r["input_len"] for r in data["rows"]]
        x = range(len(lens))
        for i, (name, label) in enumerate((("cinq", "cinq"), ("hf", "HF transformers"))):
            if not all(r[name] for r in data["rows"]):
                continue
            xs = [j + 0.4 * i for j in x]
            ax1.bar(xs, [r[name]["tpot_ms"]["median"] for r in data["rows"]], width=0.4, label=label)
            ax2.bar(xs, [r[name]["ttft_ms"]["median"] for r in data["rows"]], width=0.4, label=label)
        for ax, title in ((ax1, "per-token latency, median (ms)"), (ax2, "time to first token, median (ms)")):
            ax.set_xticks([j + 0.2 for j in x], [f"prompt {n}" for n in lens])
            ax.set_title(title)
            ax.legend()

    return BenchResult("latency", "Batch-1 latency: cinq vs HF transformers (same model, same prompts, one run)",
                       setup, [table], headline, data, plot=plot)
