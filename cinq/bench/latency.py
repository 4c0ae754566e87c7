"""Batch-1 latency: time to first token, per-token decode latency (mean / median / p99) and decode tokens/s at a
few prompt lengths, cinq against Hugging Face transformers ``generate`` and (optionally) llama.cpp on the same
weights, on the same prompt token ids, in one run.

The one implementation behind ``cinq bench latency`` and ``benchmarks/latency.py``. Every round runs every engine
once per setting in an order rotated each round (the machine is shared: drift hits every engine alike); a first
round warms every engine up and is not kept. Decode tok/s = 1 / the median decode step of a generation (a
descheduled step moves a mean, not this), then the median over generations; TTFT and per-token samples are also
pooled into mean / median / p99. The engines are in latency_engines.py, the tables in latency_report.py."""

from __future__ import annotations

import os
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.bench.latency_engines import (BASELINES, VARIANTS, CinqRunner, TimedEngine, build_engines, check_names,
                                        llama_cpp_version)
from cinq.bench.latency_report import latency_result
from cinq.bench.latency_stats import summarize_ms
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, machine_info, model_label
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, bounded_each, check_bounds


@dataclass(slots=True)
class LatencyOptions:
    """Prompt lengths, tokens generated per request, requests per length and round, rounds (after one warm-up
    round), the baselines (``hf``, ``llama.cpp``), cinq's precision variants (empty: the engine as configured, or
    bf16 when llama.cpp is a baseline: it runs GGUF types only), torch / llama.cpp thread counts to sweep (empty:
    as configured) and where quantized / GGUF copies are kept (default: the cinq cache)."""

    input_lens: tuple[int, ...] = bounded_each((128, 1024), ge=1)
    output_len: int = bounded(128, ge=2)
    num_iters: int = bounded(3, ge=1)
    seed: int = 0
    baselines: tuple[str, ...] = ("hf",)
    variants: tuple[str, ...] = ()
    threads_list: tuple[int, ...] = ()
    rounds: int = bounded(1, ge=1)
    work_dir: Path | None = None

    def validate(self) -> None:
        """InvalidParameterError naming the first field out of range."""
        check_bounds(self)
        if self.threads_list and min(self.threads_list) < 1:
            raise InvalidParameterError(f"threads_list must be positive, got {list(self.threads_list)}",
                                        "threads_list")
        check_names(self.baselines, BASELINES, "baselines")
        check_names(self.variants, VARIANTS, "variants")

    def check_length(self, max_model_len: int) -> None:
        """InvalidParameterError unless the longest prompt plus the output fits ``max_model_len``."""
        longest = max(self.input_lens) + self.output_len
        if longest > max_model_len:
            raise InvalidParameterError(
                f"input_len {max(self.input_lens)} + output_len {self.output_len} = {longest} exceeds "
                f"max_model_len {max_model_len}", "input_lens")


def run_latency(config: EngineConfig, options: LatencyOptions, progress: bool = True) -> BenchResult:
    """Measure every engine of ``options`` at each prompt length and thread count."""
    options.validate()
    load_at_start = os.getloadavg()[0]  # before this run loads the cores: quiet or draft (results_table reads it)
    if config.max_model_len is not None:
        options.check_length(config.max_model_len)  # before any engine is built or model quantized
    from cinq.cache import cache_dir
    work = options.work_dir or cache_dir() / "bench-latency"
    work.mkdir(parents=True, exist_ok=True)
    n_ctx = max(options.input_lens) + options.output_len + 16
    engines, missing = build_engines(config, options.variants, options.baselines, options.threads_list, n_ctx, work)
    first = next(e.runner for e in engines if isinstance(e.runner, CinqRunner)).engine
    options.check_length(first.max_model_len)
    data = {"config": {"model": model_label(config.model), "dtype": config.dtype},
            "options": {"input_lens": list(options.input_lens), "output_len": options.output_len,
                        "num_iters": options.num_iters, "seed": options.seed, "baselines": list(options.baselines),
                        "variants": list(options.variants), "threads_list": list(options.threads_list)},
            "rows": measure(engines, latency_prompts(options, first.vocab_size), options, progress),
            "missing": missing, "new_tokens": options.output_len, "rounds": options.rounds,
            "llama_cpp_absent": next((m.split(": ", 1)[1] for m in missing if m.startswith("llama.cpp")), None),
            "machine": {**machine_info(load_at_start), "llama_cpp": llama_cpp_version(),
                        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}}
    for row in data["rows"]:
        row["model"] = data["config"]["model"]
    return latency_result(data)


def latency_prompts(options: LatencyOptions, vocab: int) -> dict[int, list[list[int]]]:
    """``num_iters`` random prompts per length, the same for every engine and round. Ids from 300 up where the
    vocabulary allows: the byte tokenizers' specials (bos, eos ...) sit below."""
    rng = random.Random(options.seed)
    low = 300 if vocab > 600 else 0
    return {n: [[rng.randrange(low, vocab) for _ in range(n)] for _ in range(options.num_iters)]
            for n in options.input_lens}


def measure(engines: list[TimedEngine], prompts: dict[int, list[list[int]]], options: LatencyOptions,
            progress: bool) -> list[dict[str, Any]]:
    """Round 0 (warm-up, one prompt per length) then ``options.rounds`` rounds, each engine's order rotated every
    round; one summary row per (prompt length, threads, engine), in the engines' order."""
    import torch
    threads_before = torch.get_num_threads()
    total = len(engines) * len(prompts) * (1 + options.rounds * options.num_iters)
    bar = progress_bar(total, "latency", progress, unit="run")
    samples: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    try:
        for rnd in range(options.rounds + 1):
            rot = rnd % len(engines)
            for n, group in prompts.items():
                for e in engines[rot:] + engines[:rot]:
                    if e.threads is not None:
                        torch.set_num_threads(e.threads)
                    for prompt in group[:1] if rnd == 0 else group:
                        times = e.runner.run(prompt, options.output_len)
                        bar.update(1)
                        if rnd:
                            key = (n, e.threads or torch.get_num_threads(), e.name)
                            samples.setdefault(key, []).append({"ttft": times.ttft_s, "gaps": times.gaps_s,
                                                                "tokens": times.tokens,
                                                                "loadavg": os.getloadavg()[0]})
    finally:
        torch.set_num_threads(threads_before)
        bar.close()
    vs = {e.name: e.vs for e in engines}
    order = list(dict.fromkeys(e.name for e in engines))
    rows = [_row(n, t, name, gens, vs[name]) for (n, t, name), gens in samples.items()]
    rows.sort(key=lambda r: (r["prompt_len"], r["threads"], order.index(r["engine"])))
    by_key = {(r["prompt_len"], r["threads"], r["engine"]): r for r in rows}
    for r in rows:
        base = by_key.get((r["prompt_len"], r["threads"], r["vs"]))
        r["ratio"] = r["tok_s"] / base["tok_s"] if base else None
        r["ttft_ratio"] = base["prefill_s"] / r["prefill_s"] if base else None
    return rows


def _row(n: int, threads: int, name: str, gens: list[dict[str, Any]], vs: str | None) -> dict[str, Any]:
    steps = [statistics.median(g["gaps"]) for g in gens]
    return {"prompt_len": n, "threads": threads, "engine": name, "vs": vs,
            "tok_s": statistics.median(1 / s for s in steps), "tok_s_runs": [1 / s for s in steps],
            "tok_s_mean_runs": [len(g["gaps"]) / sum(g["gaps"]) for g in gens],
            "ms_step": 1000 * statistics.median(steps), "prefill_s": statistics.median(g["ttft"] for g in gens),
            "ttft_ms": summarize_ms([g["ttft"] for g in gens]),
            "tpot_ms": summarize_ms([gap for g in gens for gap in g["gaps"]]),
            "loadavg_1m": [g["loadavg"] for g in gens], "first_tokens": gens[0]["tokens"][:8]}
