"""The search of ``cinq tune``: prune the space with the plan (``prune``), then measure the kept candidates,
cheapest roofline first, up to ``max_trials``: a short run at the SLO's request rate (TPOT / TTFT p99), one at
rate = inf (tokens/s, hence the cost), and the served quality (arithmetic accuracy, KL to the bf16 dense model;
once per weights + speculation pair, which the batch sizes do not change). The cheapest measured candidate that
meets every bound wins."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.bench.served_quality import QualitySettings
from cinq.config import EngineConfig
from cinq.option_fields import bounded, check_bounds
from cinq.tune.space import Candidate, SearchSpace


@dataclass(slots=True)
class SLO:
    """The bounds a configuration must meet (None: not asked)."""

    tpot_p99_ms: float | None = bounded(None, gt=0)
    ttft_p99_ms: float | None = bounded(None, gt=0)
    min_accuracy: float | None = bounded(None, ge=0, le=1)  # arithmetic accuracy
    max_kl: float | None = bounded(None, gt=0)  # mean KL(bf16 dense || served) per token

    def validate(self) -> None:
        check_bounds(self)

    def misses(self, at_rate: dict[str, Any], quality: dict[str, Any]) -> list[str]:
        """The bounds a measured candidate misses (empty: it meets the SLO)."""
        out = []
        if self.tpot_p99_ms is not None and not at_rate["tpot_p99_ms"] <= self.tpot_p99_ms:
            out.append(f"TPOT p99 {at_rate['tpot_p99_ms']:.1f} > {self.tpot_p99_ms:g} ms")
        if self.ttft_p99_ms is not None and not at_rate["ttft_p99_ms"] <= self.ttft_p99_ms:
            out.append(f"TTFT p99 {at_rate['ttft_p99_ms']:.0f} > {self.ttft_p99_ms:g} ms")
        if self.min_accuracy is not None and not (quality["accuracy"] or 0) >= self.min_accuracy:
            out.append(f"accuracy {quality['accuracy']:.2f} < {self.min_accuracy:g}")
        if self.max_kl is not None and not (quality["kl"] if quality["kl"] is not None else math.inf) <= self.max_kl:
            out.append(f"KL {quality['kl']:.4f} > {self.max_kl:g}")
        return out


@dataclass(slots=True)
class TuneOptions:
    """The space, the SLO, the workload, the rate the SLO is asked at, and what decides."""

    space: SearchSpace = field(default_factory=SearchSpace)
    slo: SLO = field(default_factory=SLO)
    workload: str = "mixed:24"
    request_rate: float = bounded(2.0, gt=0)
    price_per_hour: float = 1.0
    device: str = "this-cpu"  # cinq plan's device table (memory, bandwidth, FLOP/s) for pruning
    speculative_method: str = "eagle"
    speculative_model: str | None = "cinq-tiny-eagle"
    speculative_extra: dict[str, Any] = field(default_factory=dict)  # further speculative_config fields
    max_trials: int = bounded(6, ge=1)
    quality: QualitySettings = field(default_factory=lambda: QualitySettings(ppl_tokens=1024, n_problems=16))
    variants_dir: str | None = None
    seed: int = 0

    def validate(self) -> None:
        self.space.validate()
        self.slo.validate()
        self.quality.validate()
        check_bounds(self)


def candidate_config(base: EngineConfig, c: Candidate, model: str, options: TuneOptions) -> EngineConfig:
    """The engine configuration of candidate ``c`` served from ``model`` (its weights' folder)."""
    spec = None
    if c.spec_k:
        spec = {**options.speculative_extra, "method": options.speculative_method, "num_speculative_tokens": c.spec_k}
        if options.speculative_model:
            spec["model"] = options.speculative_model
    blocks = None if c.kv_tokens is None else -(-c.kv_tokens // base.block_size)
    return dataclasses.replace(base, model=model, speculative_config=spec, max_num_seqs=c.max_num_seqs,
                               max_num_batched_tokens=c.max_num_batched_tokens, num_kv_blocks=blocks)


def run_tune(config: EngineConfig, options: TuneOptions, log: Any = None) -> dict[str, Any]:
    """The search (see the module docstring): every verdict, every measured row, and the chosen one (None when
    nothing measured meets the SLO) with its EngineConfig."""
    from cinq.bench.served_quality import engine_quality, held_out_ids, reference_scores
    from cinq.cache import cache_dir
    from cinq.config import resolve_model
    from cinq.model.config import ModelConfig
    from cinq.model.tokenizer import Tokenizer
    from cinq.plan.devices import custom_device, get_device
    from cinq.plan.cost import dollars_per_million_tokens
    from cinq.quant.variant_folder import variant_folder
    from cinq.tune.prune import measurement_order, prune
    from cinq.tune.workload_file import read_workload
    options.validate()
    say = log or (lambda _msg: None)
    config = dataclasses.replace(config, model=str(resolve_model(config.model)),
                                 seed=config.seed if config.seed is not None else 0)
    mcfg = ModelConfig.from_pretrained(config.model)
    requests = read_workload(options.workload, Tokenizer.from_pretrained(config.tokenizer or config.model),
                             options.seed)
    context = max(len(r.prompt) + r.output_len for r in requests)
    max_len = config.max_model_len or mcfg.max_position_embeddings
    device = custom_device(get_device(options.device, "device"), price_per_hour=options.price_per_hour)
    verdicts = prune(options.space.candidates(), mcfg, device, config.dtype, max_len, context,
                     options.slo.tpot_p99_ms)
    kept = measurement_order(verdicts)
    say(f"cinq tune: {len(verdicts)} candidates, {len(kept)} kept by the plan; measuring up to {options.max_trials}")
    root = Path(options.variants_dir) if options.variants_dir else cache_dir() / "variants"
    ids = held_out_ids(config.model, options.quality)
    base = reference_scores(config.model, ids, options.quality)
    folders: dict[str, str] = {"none": config.model}
    qualities: dict[tuple[str, int], dict[str, Any]] = {}
    rows = []
    for i, v in enumerate(kept[:options.max_trials]):
        c = v.candidate
        if c.quant not in folders:
            from cinq.quant.variants import one_variant
            folders[c.quant] = str(variant_folder(config.model, one_variant(c.quant), root))
        cfg = candidate_config(config, c, folders[c.quant], options)
        say(f"  [{i + 1}/{min(len(kept), options.max_trials)}] {c.label}")
        at_rate = _measure(cfg, requests, options.request_rate, options.seed)
        at_inf = _measure(cfg, requests, math.inf, options.seed)
        key = (c.quant, c.spec_k)
        if key not in qualities:
            qualities[key] = engine_quality(cfg, ids, options.quality, base).to_dict()
        quality = qualities[key]
        misses = options.slo.misses(at_rate, quality)
        rows.append({"label": c.label, "candidate": c.to_dict(), "roofline_tpot_ms": v.roofline_tpot_ms,
                     "roofline_cost": v.roofline_cost, "rate": at_rate, "inf": at_inf, "quality": quality,
                     "cost_per_m_tokens": dollars_per_million_tokens(at_inf["tok_s"], options.price_per_hour),
                     "meets_slo": not misses, "misses": misses, "engine_config": cfg})
    ok = [r for r in rows if r["meets_slo"] and r["cost_per_m_tokens"] is not None]
    chosen = min(ok, key=lambda r: r["cost_per_m_tokens"]) if ok else None
    return {"verdicts": [v.to_dict() for v in verdicts], "rows": rows, "chosen": chosen,
            "workload": {"spec": options.workload, "requests": len(requests),
                         "prompt_tokens": sum(len(r.prompt) for r in requests),
                         "output_tokens": sum(r.output_len for r in requests)},
            "device": dataclasses.asdict(device)}


def _measure(config: EngineConfig, requests: list[Any], rate: float, seed: int) -> dict[str, Any]:
    """One rate run on a fresh offline engine (no prefix cache carried over), its core where the offline ``LLM``
    puts it (engine/protocol.py); the engine is shut down after."""
    from cinq.bench.rate_run import build_engine, run_at_rate
    from cinq.engine.protocol import default_offline_engine_core
    engine = build_engine(config, engine_core=default_offline_engine_core())
    try:
        return run_at_rate(engine, requests, rate, seed).summary()
    finally:
        engine.shutdown()
