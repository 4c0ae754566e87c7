"""Offline throughput: cinq's engine against Hugging Face transformers ``generate`` on the same model and the
same requests, in one run.

All requests are queued at once (random token ids, ignore_eos, greedy). cinq runs them as configured or in each
of ``variants`` (the latency benchmark's: a GGUF model's own ``file``, ``bf16``, ...; cinq/bench/latency_engines.py).
transformers runs batched with left padding at its best batch size among a few (probed on a prefix of the
requests; a probe that ran every request is its full run), each batch generating up to its longest requested
output; only requested tokens count. A GGUF model's baseline runs its dense folder (the file dequantized,
cinq/export/hf_folder.py): the same numbers cinq serves. Also measured: each cinq run against the compute
roofline (cinq/bench/throughput_roofline.py), cinq's batch-1 decode tokens/s against the memory roofline (weight
bytes / measured read bandwidth), and KV-cache waste (reserved but unused slots / reserved, averaged over engine
steps) against a naive reservation of max_model_len slots per request."""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.bench.drive import run_until_done
from cinq.bench.hf_baseline import hf_available, hf_generate_batched, load_hf_model
from cinq.bench.latency_engines import VARIANTS, check_names, dense_folder, variant_config
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, machine_info, model_label
from cinq.bench.throughput_report import throughput_result
from cinq.bench.throughput_roofline import peak_flops, workload_flops
from cinq.bench.workload import BenchRequest, random_requests
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds


def peak_dtype() -> str:
    """The dtype of the compute peak a run is held against: bf16 where torch's bf16 GEMM has bf16 instructions
    (AVX512-BF16 / AMX; there it ran ~2x fp32 on a Zen 4, and an fp32 peak put cinq at "176%" of it), float32 where
    it is emulated (AVX2), since that is the reachable peak there."""
    from cinq.kernels.cpu_native import bf16_gemm_is_emulated
    return "float32" if bf16_gemm_is_emulated() else "bfloat16"


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
    variants: tuple[str, ...] = ()  # cinq precisions (latency_engines.VARIANTS); empty: the engine as configured
    work_dir: Path | None = None  # where variants and a GGUF model's dense folder are cached (default: cinq's cache)

    def validate(self) -> None:
        check_bounds(self)
        if not self.hf_batch_sizes or min(self.hf_batch_sizes) < 1:
            raise InvalidParameterError(f"hf_batch_sizes must be positive, got {list(self.hf_batch_sizes)}",
                                        "hf_batch_sizes")
        check_names(self.variants, VARIANTS, "variants")


def run_throughput(config: EngineConfig, options: ThroughputOptions, progress: bool = True) -> BenchResult:
    """Measure cinq (each variant) and (unless ``options.baseline`` is off) transformers on the same requests."""
    load_at_start = os.getloadavg()[0]
    from cinq.cache import cache_dir
    from cinq.engine.engine import LLMEngine
    options.validate()
    work = options.work_dir or cache_dir() / "bench-latency"  # the latency benchmark's: one dense copy of a file
    work.mkdir(parents=True, exist_ok=True)
    named = [(f"cinq {v}", variant_config(config, v, work)) for v in options.variants] or [("cinq", config)]
    runs: list[dict[str, Any]] = []
    for name, cfg in named:
        engine = LLMEngine(cfg)
        reqs = random_requests(options.num_requests, engine.vocab_size, options.input_lens, options.output_lens,
                               options.seed, options.low_token)
        runs.append({"engine": name, "model": model_label(cfg.model), **_run_cinq(engine, reqs, progress)})
        if len(runs) == 1:
            b1 = _batch1_decode(engine, options.decode_tokens, options.seed)
            model_cfg, first = engine.model_config, engine.config
        engine.shutdown()
        del engine
        gc.collect()  # one engine's weights and KV cache at a time
    flops = workload_flops(model_cfg, reqs)
    dtype = peak_dtype()
    peak = peak_flops(dtype)
    for run in runs:
        run["flop_s"] = flops.total / run["seconds"]
        run["fraction_of_peak"] = run["flop_s"] / peak
    hf, probes, missing = None, [], None
    if options.baseline and not hf_available():
        missing = "transformers is not installed (pip install transformers): no baseline"
    elif options.baseline:
        hf, probes = _run_hf(dense_folder(config, work), first.dtype, reqs, options, progress)
    for run in runs:
        run["ratio_over_hf"] = run["tok_s"] / hf["tok_s"] if hf else None
    data = {"config": {"model": model_label(first.model), "dtype": first.dtype,
                       "block_size": first.block_size, "max_num_seqs": first.max_num_seqs,
                       "max_num_batched_tokens": first.max_num_batched_tokens},
            "workload": {"num_requests": len(reqs), "prompt_len": list(options.input_lens),
                         "output_len": list(options.output_lens), "seed": options.seed,
                         "prompt_tokens": sum(len(r.prompt) for r in reqs),
                         "output_tokens": sum(r.output_len for r in reqs)},
            "machine": machine_info(load_at_start), "cinq": runs[0], "variants": runs, "hf_probes": probes,
            "hf": hf, "hf_model": model_label(str(dense_folder(config, work))) if hf else None, "batch1": b1,
            "roofline": {"flops": dataclasses.asdict(flops), "total_flops": flops.total, "peak_flop_s": peak,
                         "peak_dtype": dtype},
            "ratio_cinq_over_hf": runs[0]["ratio_over_hf"]}
    return throughput_result(data, missing)


def _run_hf(folder: Path, dtype: str, reqs: list[BenchRequest], options: ThroughputOptions, progress: bool
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """transformers' probes and its run of every request at the best batch size (the best probe itself when it
    ran them all)."""
    model = load_hf_model(str(folder), dtype)
    bar = progress_bar(len(options.hf_batch_sizes) + 1, "transformers", progress, unit="run")
    probes = []
    for b in options.hf_batch_sizes:
        probes.append(hf_generate_batched(model, reqs[:max(options.hf_probe_requests, b)], b))
        bar.update(1)
    best = max(probes, key=lambda r: r["tok_s"])
    hf = best if best["tokens"] == sum(r.output_len for r in reqs) else hf_generate_batched(model, reqs,
                                                                                           best["batch_size"])
    bar.update(1)
    bar.close()
    return hf, probes


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
    from cinq.engine.token_times import time_greedy_request
    from cinq.plan.probe import read_bandwidth
    rng = random.Random(seed + 1)
    new_tokens = min(new_tokens, engine.max_model_len - 32)
    tok_s = time_greedy_request(engine, [rng.randrange(engine.vocab_size) for _ in range(32)],
                                new_tokens).decode_tokens_per_s
    # what a step streams (a GGUF layer keeps its blocks as buffers; an untied embedding table is not read)
    weight_bytes = engine.info.step_read_bytes or engine.info.weight_bytes
    bw = read_bandwidth()
    roofline = bw / weight_bytes
    return {"tok_s": tok_s, "weight_bytes": weight_bytes, "read_bandwidth_gb_s": bw / 1e9,
            "roofline_tok_s": roofline, "fraction_of_roofline": tok_s / roofline}
