"""``cinq bench stack``: every technique of cinq stacked on one model and one workload, one row per
configuration, each adding one technique to the row above (the flash-attention row excepted on a CPU: the rows
after it keep the default backend, see ``stack_rows``):

  HF transformers -> cinq paged KV + continuous batching -> + prefix caching -> + flash attention backend
  -> + int4 GPTQ -> + EAGLE speculation (adaptive) -> + the distilled student instead of the teacher

Every row serves the same mixed workload (``mixed_workload``: multilingual chat, code and arithmetic behind
shared prefixes) at a fixed request rate and at rate = inf, in process (``rate_run``), and is scored for quality
as served (``served_quality``). Ratios are to the first row, measured in the same run. transformers has no
server: its row is batched ``generate`` at rate = inf (static batches, left padding), its latency columns n/a."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.bench.mixed_workload import MixedOptions, mixed_workload, run_head
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, machine_info, model_label
from cinq.bench.served_quality import QualitySettings
from cinq.config import EngineConfig
from cinq.option_fields import bounded, check_bounds

EAGLE = {"method": "eagle", "model": "cinq-tiny-eagle", "num_speculative_tokens": 3, "adaptive": True}


@dataclass(slots=True)
class StackOptions:
    """The workload, the fixed rate, quality sizes, the machine price and what the later rows add."""

    workload: MixedOptions = field(default_factory=MixedOptions)
    request_rate: float = 2.0
    quality: QualitySettings = field(default_factory=QualitySettings)
    price_per_hour: float = bounded(1.0, ge=0)
    hf_batch_size: int = bounded(16, ge=1)
    flash_backend: str | None = None  # None: triton on CUDA, flash-torch elsewhere
    quant: str = "gptq:4/128"  # cinq.quant.variants grammar, one entry
    speculative_config: dict[str, Any] | None = field(default_factory=lambda: dict(EAGLE))
    student: str = "cinq-tiny-student"
    variants_dir: str | None = None  # None: the cinq cache
    baseline: bool = True  # the transformers row

    def validate(self) -> None:
        self.workload.validate()
        self.quality.validate()
        from cinq.bench.rate_run import check_fixed_rate
        check_fixed_rate(self.request_rate)
        check_bounds(self)


@dataclass(slots=True)
class StackRow:
    """One configuration: its label, the technique it adds and its engine config (None: transformers)."""

    label: str
    adds: str
    config: EngineConfig | None


def stack_rows(base: EngineConfig, options: StackOptions, progress: bool = False) -> list[StackRow]:
    """The configurations, each adding one technique; quantized folders are made (or found) on the way."""
    from cinq.cache import cache_dir
    from cinq.config import resolve_model
    from cinq.quant.variants import one_variant
    from cinq.quant.variant_folder import variant_folder
    spec = one_variant(options.quant)
    root = Path(options.variants_dir) if options.variants_dir else cache_dir() / "variants"
    flash = options.flash_backend or ("triton" if base.device.startswith("cuda") else "flash-torch")
    paged = dataclasses.replace(base, enable_prefix_caching=False, attention_backend=None, speculative_config=None)
    prefix = dataclasses.replace(paged, enable_prefix_caching=True)
    fast = dataclasses.replace(prefix, attention_backend=flash)
    # Later rows keep the engine's default backend unless one was asked for: on a CPU the default (sdpa: SDPA's
    # fused prefill + the native paged decode) is the fast path, while flash-torch (FlashAttention-2 written in
    # PyTorch ops) saves memory and costs time there, and would hide what the later techniques add.
    keep = dataclasses.replace(prefix, attention_backend=options.flash_backend)
    quant = dataclasses.replace(keep, model=str(variant_folder(base.model, spec, root, progress=progress)))
    only = "" if keep.attention_backend == flash else " (this row; later rows keep the default backend)"
    rows = [StackRow("cinq paged + continuous batching", "paged KV cache, continuous batching", paged),
            StackRow("+ prefix caching", "automatic prefix caching", prefix),
            StackRow(f"+ {flash} attention", f"attention backend {flash}{only}", fast),
            StackRow(f"+ int{spec.bits} {spec.method.upper()}", f"weights {spec.label}", quant)]
    last = quant
    if options.speculative_config:
        last = dataclasses.replace(quant, speculative_config=options.speculative_config)
        sc = options.speculative_config
        rows.append(StackRow(f"+ {sc['method'].upper()} speculation" + (" (adaptive)" if sc.get("adaptive") else ""),
                             f"{sc['method']} k={sc.get('num_speculative_tokens')}", last))
    if options.student:
        student = variant_folder(resolve_model(options.student, "student"), spec, root, progress=progress)
        # the speculative heads were trained on the teacher's features: the student serves without them
        rows.append(StackRow("+ distilled student", f"{Path(options.student).name} ({spec.label}), no "
                             "speculation", dataclasses.replace(last, model=str(student), speculative_config=None)))
    if options.baseline:
        rows.insert(0, StackRow("HF transformers", "baseline: generate, static batches", None))
    return rows


def run_stack(config: EngineConfig, options: StackOptions, progress: bool = True) -> BenchResult:
    """Measure every row of ``stack_rows`` (see the module docstring)."""
    load_at_start = os.getloadavg()[0]
    from cinq.bench.served_quality import held_out_ids, reference_scores
    from cinq.config import resolve_model
    from cinq.model.tokenizer import Tokenizer
    options.validate()
    config = dataclasses.replace(config, model=str(resolve_model(config.model)),
                                 seed=config.seed if config.seed is not None else 0)
    rows = stack_rows(config, options, progress)
    if config.max_model_len is not None:  # prompts leave room for their outputs
        options.workload = dataclasses.replace(options.workload, max_prompt_tokens=min(
            options.workload.max_prompt_tokens or config.max_model_len,
            config.max_model_len - options.workload.output_len[1]))
    work = mixed_workload(Tokenizer.from_pretrained(config.tokenizer or config.model), options.workload)
    ids = held_out_ids(config.model, options.quality)
    base = reference_scores(config.model, ids, options.quality)
    bar = progress_bar(len(rows), "stack", progress, unit="config")
    measured = []
    for row in rows:
        t0 = time.perf_counter()
        m = _measure_hf(config, row, work, ids, base, options) if row.config is None else \
            _measure_engine(row, work, ids, base, options)
        m["seconds_total"] = time.perf_counter() - t0
        measured.append(m)
        bar.update(1)
    bar.close()
    data = {**run_head(config, options, work), "machine": machine_info(load_at_start), "rows": measured}
    data["workload"]["shared_prefix_tokens"] = work.prefix_tokens_shared()
    _ratios(data["rows"], options.price_per_hour)
    from cinq.bench.stack_report import stack_result
    return stack_result(data)


def _measure_engine(row: StackRow, work: Any, ids: list[int], base: Any, options: StackOptions) -> dict[str, Any]:
    from cinq.bench.rate_run import build_engine, run_at_rate
    from cinq.bench.served_quality import engine_quality
    assert row.config is not None
    runs = {}
    for name, rate in (("inf", math.inf), ("rate", options.request_rate)):
        engine = build_engine(row.config)  # a fresh engine per rate: no prefix cache carried over
        runs[name] = run_at_rate(engine, work.requests, rate, options.workload.seed).summary()
        del engine
    quality = engine_quality(row.config, ids, options.quality, base)
    cfg = {k: v for k, v in dataclasses.asdict(row.config).items() if k != "parallel_config"}
    cfg["model"] = _label(row.config.model, options)
    return {"label": row.label, "adds": row.adds, "engine_config": cfg, "inf": runs["inf"],
            "rate": runs["rate"], "quality": quality.to_dict()}


def _measure_hf(config: EngineConfig, row: StackRow, work: Any, ids: list[int], base: Any,
                options: StackOptions) -> dict[str, Any]:
    from cinq.bench.hf_baseline import hf_available, hf_generate_batched, hf_padded_kv_slots, load_hf_model
    from cinq.bench.rate_run import module_bytes
    from cinq.bench.served_quality import hf_quality
    from cinq.model.config import ModelConfig
    from cinq.plan.memory import Precision, kv_bytes_per_token
    if not hf_available():
        return {"label": row.label, "adds": row.adds, "missing": "transformers is not installed"}
    model = load_hf_model(config.model, config.dtype, config.device)
    hf_generate_batched(model, work.requests[:1], 1)  # warm-up
    r = hf_generate_batched(model, work.requests, options.hf_batch_size)
    peak_positions, waste = hf_padded_kv_slots(work.requests, options.hf_batch_size)
    per_token = kv_bytes_per_token(ModelConfig.from_pretrained(config.model), Precision.from_name(config.dtype))
    nan = float("nan")
    inf = {"rate": math.inf, "num_requests": len(work.requests), "output_tokens": r["tokens"],
           "seconds": r["seconds"], "tok_s": r["tok_s"], "ttft_p50_ms": nan, "ttft_p99_ms": nan,
           "tpot_p50_ms": nan, "tpot_p99_ms": nan, "peak_kv_bytes": peak_positions * per_token,
           "kv_waste": waste, "tau": None, "prefix_cache_hit_rate": 0.0, "weight_bytes": module_bytes(model)}
    quality = hf_quality(model, config.model, ids, options.quality, base)
    return {"label": row.label, "adds": row.adds, "engine_config": {"model": model_label(config.model),
                                                                    "dtype": config.dtype,
                                                                    "hf_batch_size": options.hf_batch_size},
            "inf": inf, "rate": None, "quality": quality.to_dict()}


def _ratios(rows: list[dict[str, Any]], price: float) -> None:
    """Cost per million output tokens at rate = inf, and every row's ratios to the first measured row."""
    from cinq.plan.cost import dollars_per_million_tokens
    for r in rows:
        if "inf" in r:
            r["cost_per_m_tokens"] = dollars_per_million_tokens(r["inf"]["tok_s"], price)
            r["peak_memory_bytes"] = r["inf"]["weight_bytes"] + r["inf"]["peak_kv_bytes"]
    first = next((r for r in rows if "inf" in r), None)
    for r in rows:
        if first is None or "inf" not in r:
            continue
        r["tok_s_ratio"] = r["inf"]["tok_s"] / first["inf"]["tok_s"]
        r["memory_ratio"] = r["peak_memory_bytes"] / first["peak_memory_bytes"]
        c0, c = first.get("cost_per_m_tokens"), r.get("cost_per_m_tokens")
        r["cost_ratio"] = c / c0 if c and c0 else None


def _label(model: str, options: StackOptions) -> str:
    """A model as the report names it: a quantized variant as ``<variants>/NAME`` (no machine's path)."""
    from cinq.cache import cache_dir
    root = Path(options.variants_dir) if options.variants_dir else cache_dir() / "variants"
    if Path(model).resolve().parent == root.resolve():
        return "<variants>/" + Path(model).name
    return model_label(model)
