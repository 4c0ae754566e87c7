"""Offline throughput: cinq's engine against Hugging Face transformers ``generate`` on the same model and the
same requests, in one run.

All requests are queued at once (random token ids, ignore_eos, greedy). transformers runs batched with left
padding at its best batch size among a few (probed on a prefix of the requests), each batch generating up to its
longest requested output; only requested tokens count. Also measured: cinq's batch-1 decode tokens/s against the
memory roofline (weight bytes / measured read bandwidth), and KV-cache waste (reserved but unused slots /
reserved, averaged over engine steps) against a naive reservation of max_model_len slots per request."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import Any

from cinq.bench.drive import run_until_done
from cinq.bench.hf_baseline import hf_available, hf_generate_batched, load_hf_model
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.workload import BenchRequest, random_requests
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds


@dataclass(slots=True)
class ThroughputOptions:
    """The workload and the baseline's settings."""

    num_requests: int = bounded(128, ge=1)
    input_lens: tuple[int, int] = (32, 512)
    output_lens: tuple[int, int] = (32, 256)
    seed: int = 0
    baseline: bool = True
    hf_batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    hf_probe_requests: int = 32  # requests each probe runs before transformers' full run at the best size
    decode_tokens: int = bounded(256, ge=2)  # batch-1 decode length for the roofline comparison
    low_token: int = 0  # random prompts draw ids from [low_token, vocab) (e.g. past a byte tokenizer's specials)

    def validate(self) -> None:
        check_bounds(self)
        if not self.hf_batch_sizes or min(self.hf_batch_sizes) < 1:
            raise InvalidParameterError(f"hf_batch_sizes must be positive, got {list(self.hf_batch_sizes)}",
                                        "hf_batch_sizes")


def run_throughput(config: EngineConfig, options: ThroughputOptions, progress: bool = True) -> BenchResult:
    """Measure cinq and (unless ``options.baseline`` is off) transformers on the same requests."""
    load_at_start = os.getloadavg()[0]
    from cinq.engine.engine import LLMEngine
    options.validate()
    engine = LLMEngine(config)
    reqs = random_requests(options.num_requests, engine.vocab_size, options.input_lens, options.output_lens,
                           options.seed, options.low_token)
    ours = _run_cinq(engine, reqs, progress)
    b1 = _batch1_decode(engine, options.decode_tokens, options.seed)
    hf, probes, missing = None, [], None
    if options.baseline and not hf_available():
        missing = "transformers is not installed (pip install transformers): no baseline"
    elif options.baseline:
        model = load_hf_model(engine.config.model, engine.config.dtype)
        bar = progress_bar(len(options.hf_batch_sizes) + 1, "transformers", progress, unit="run")
        for b in options.hf_batch_sizes:
            probes.append(hf_generate_batched(model, reqs[:max(options.hf_probe_requests, b)], b))
            bar.update(1)
        best = max(probes, key=lambda r: r["tok_s"])["batch_size"]
        hf = hf_generate_batched(model, reqs, best)
        bar.update(1)
        bar.close()
    ratio = ours["tok_s"] / hf["tok_s"] if hf else None
    data = {"config": {"model": model_label(engine.config.model), "dtype": engine.config.dtype,
                       "block_size": engine.config.block_size, "max_num_seqs": engine.config.max_num_seqs,
                       "max_num_batched_tokens": engine.config.max_num_batched_tokens},
            "workload": {"num_requests": len(reqs), "prompt_len": list(options.input_lens),
                         "output_len": list(options.output_lens), "seed": options.seed,
                         "prompt_tokens": sum(len(r.prompt) for r in reqs),
                         "output_tokens": sum(r.output_len for r in reqs)},
            "machine": machine_info(load_at_start), "cinq": ours, "hf_probes": probes, "hf": hf, "batch1": b1,
            "ratio_cinq_over_hf": ratio}
    return _result(data, missing)


def _run_cinq(engine: Any, reqs: list[BenchRequest], progress: bool) -> dict[str, Any]:
    from cinq.sampling_params import OutputKind, SamplingParams
    for i, r in enumerate(reqs):
        engine.add_request(f"t{i}", r.prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                             ignore_eos=True, output_kind=OutputKind.FINAL_ONLY))
    max_len = engine.max_model_len
    waste_paged: list[float] = []
    waste_naive: list[float] = []
    steps_before = engine.get_stats().num_steps

    def sample_waste(eng: Any) -> None:
        st = eng.get_stats()  # what the core publishes: no reaching into its scheduler
        if st.num_running and st.kv_slots_held:
            waste_paged.append(1 - st.kv_tokens_held / st.kv_slots_held)
            waste_naive.append(1 - st.kv_tokens_held / (st.num_running * max_len))

    bar = progress_bar(len(reqs), "cinq", progress)
    t0 = time.perf_counter()
    outs = run_until_done(engine, bar, sample_waste)
    elapsed = time.perf_counter() - t0
    bar.close()
    gen = sum(len(o.outputs[0].token_ids) for o in outs.values())
    expected = sum(r.output_len for r in reqs)
    if gen != expected:
        raise RuntimeError(f"cinq generated {gen} tokens, the workload asked for {expected}")
    return {"tokens": gen, "seconds": elapsed, "tok_s": gen / elapsed,
            "steps": engine.get_stats().num_steps - steps_before,
            "kv_waste_paged": sum(waste_paged) / max(len(waste_paged), 1),
            "kv_waste_naive_max_len": sum(waste_naive) / max(len(waste_naive), 1), "max_model_len": max_len}


def _batch1_decode(engine: Any, new_tokens: int, seed: int) -> dict[str, Any]:
    from cinq.plan.probe import read_bandwidth
    from cinq.sampling_params import SamplingParams
    rng = random.Random(seed + 1)
    new_tokens = min(new_tokens, engine.max_model_len - 32)
    engine.add_request("batch1", [rng.randrange(engine.vocab_size) for _ in range(32)],
                       SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    engine.step()  # prefill + first token
    t0 = time.perf_counter()
    n = 0
    while engine.has_unfinished_requests():
        engine.step()
        n += 1
    elapsed = time.perf_counter() - t0
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bw = read_bandwidth()
    roofline = bw / weight_bytes
    return {"tok_s": n / elapsed, "weight_bytes": weight_bytes, "read_bandwidth_gb_s": bw / 1e9,
            "roofline_tok_s": roofline, "fraction_of_roofline": (n / elapsed) / roofline}


def _result(data: dict[str, Any], missing: str | None) -> BenchResult:
    c, h, b1, w = data["cinq"], data["hf"], data["batch1"], data["workload"]
    rows: list[list[Any]] = [["cinq", c["tok_s"], c["seconds"], f"continuous batching, {c['steps']} steps"]]
    if h:
        probes = ", ".join(f"b{p['batch_size']}={p['tok_s']:.1f}" for p in data["hf_probes"])
        rows.append(["HF transformers generate (baseline)", h["tok_s"], h["seconds"],
                     f"best batch size {h['batch_size']} (probes: {probes})"])
        rows.append(["cinq / HF", data["ratio_cinq_over_hf"], "", "ratio of output tok/s"])
    m = data["machine"]
    setup = (f"Model {data['config']['model']} ({data['config']['dtype']}); {w['num_requests']} requests queued at "
             f"once, prompts uniform in {w['prompt_len']} tokens, outputs uniform in {w['output_len']} "
             f"(ignore_eos, greedy): {w['prompt_tokens']} prompt + {w['output_tokens']} output tokens. "
             f"CPU threads {m['threads']}; load average at end {m['loadavg_at_end']}.")
    headline = (f"cinq / HF transformers = {data['ratio_cinq_over_hf']:.2f}x output tokens/s" if h
                else f"cinq: {c['tok_s']:.1f} output tokens/s; {missing or 'baseline skipped (--no-baseline)'}")
    tables = [
        Table("Offline throughput", ["engine", "output tok/s", "seconds", "notes"], rows),
        Table("Batch-1 decode", ["measure", "value"], [
            ["cinq tok/s", b1["tok_s"]], ["weights (MB)", b1["weight_bytes"] / 1e6],
            ["measured read bandwidth (GB/s)", b1["read_bandwidth_gb_s"]],
            ["roofline tok/s (bandwidth / weight bytes)", b1["roofline_tok_s"]],
            ["fraction of roofline (%)", 100 * b1["fraction_of_roofline"]]]),
        Table("KV memory waste (reserved but unused / reserved, mean over steps)", ["layout", "waste (%)"], [
            [f"cinq paged (block {data['config']['block_size']})", 100 * c["kv_waste_paged"]],
            [f"naive per-request max_model_len ({c['max_model_len']}) reservation",
             100 * c["kv_waste_naive_max_len"]]]),
    ]

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        names = ["cinq"] + [f"HF b{p['batch_size']}" for p in data["hf_probes"]] + (["HF best"] if h else [])
        values = [c["tok_s"]] + [p["tok_s"] for p in data["hf_probes"]] + ([h["tok_s"]] if h else [])
        ax1.bar(names, values, color=["tab:blue"] + ["tab:gray"] * (len(names) - 1))
        ax1.set_ylabel("output tokens/s")
        ax1.set_title("throughput (HF probes run a prefix of the requests)")
        ax2.bar(["cinq paged", "naive max_len"], [100 * c["kv_waste_paged"], 100 * c["kv_waste_naive_max_len"]])
        ax2.set_ylabel("KV waste (%)")
        ax2.set_title("KV cache waste")

    return BenchResult("throughput", "Offline throughput: cinq vs HF transformers (same model, same requests, "
                       "one run)", setup, tables, headline, data, plot=plot)
