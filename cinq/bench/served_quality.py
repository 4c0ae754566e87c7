"""Quality of a served configuration, for the stack and tune tables: held-out perplexity of the served weights,
mean KL to a reference model (the bf16 dense model) on the same text, and arithmetic accuracy of what the served
engine answers (its whole configuration: quantized weights, attention backend, speculative decoding), through
cinq's one arithmetic evaluation (``cinq.eval.arithmetic``) with its standard errors."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cinq.config import EngineConfig
from cinq.option_fields import bounded, check_bounds


@dataclass(slots=True)
class QualitySettings:
    """How much is scored: perplexity tokens of the held-out text, arithmetic problems (test split)."""

    ppl_tokens: int = bounded(2048, ge=2)
    context_len: int = bounded(256, ge=1)
    n_problems: int = bounded(24, ge=0)
    seed: int = 0

    def validate(self) -> None:
        check_bounds(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ServedQuality:
    """Perplexity (and KL / top-1 agreement to the reference) on ``ppl_tokens`` tokens; arithmetic accuracy
    with its binomial SE on ``n_problems`` problems (None when 0 were asked)."""

    perplexity: float
    kl: float | None
    top1: float | None
    accuracy: float | None
    accuracy_se: float | None
    n_problems: int
    ppl_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def held_out_ids(model: str, settings: QualitySettings) -> list[int]:
    """The first ``ppl_tokens`` tokens of the shipped held-out text, by the model's tokenizer."""
    from cinq.assets.text import resolve_text_path
    from cinq.eval.perplexity import encode_text
    from cinq.model.tokenizer import Tokenizer
    ids = encode_text(Tokenizer.from_pretrained(model), resolve_text_path("held-out").read_text(encoding="utf-8"))
    return ids[:settings.ppl_tokens]


def reference_scores(model: str, ids: list[int], settings: QualitySettings) -> Any:
    """The reference's log-probs (the dense model in bf16, through cinq's forward) for the KL column."""
    from cinq.eval.text_scores import base_scores
    from cinq.model.loader import load_model
    return base_scores(load_model(model, dtype="bfloat16"), ids, settings.context_len, len(ids))


def engine_quality(config: EngineConfig, ids: list[int], settings: QualitySettings, base: Any = None
                   ) -> ServedQuality:
    """Quality of the engine configuration ``config``: its weights' perplexity (dtype and attention backend as
    served) and the arithmetic answers of an engine built from the whole configuration."""
    from cinq.eval.arithmetic import evaluate_arithmetic
    from cinq.eval.generation import EngineGenerator
    from cinq.model.loader import load_model
    model = load_model(config.model, dtype=config.dtype, attention_backend=config.attention_backend or "sdpa")
    arith = None
    if settings.n_problems:
        served = {"attention_backend": config.attention_backend, "speculative_config": config.speculative_config,
                  "enable_prefix_caching": config.enable_prefix_caching, "seed": 0}
        gen = EngineGenerator(config.model, dtype=config.dtype, engine_args=served)
        arith = evaluate_arithmetic(config.model, n=settings.n_problems, seed=settings.seed, generator=gen)
    return _quality(model, ids, settings, base, arith)


def hf_quality(hf_model: Any, folder: str, ids: list[int], settings: QualitySettings, base: Any = None
               ) -> ServedQuality:
    """The same scores for a transformers model (its own forward and ``generate``)."""
    from cinq.bench.hf_baseline import HFLogits, HFTextGenerator
    from cinq.eval.arithmetic import evaluate_arithmetic
    from cinq.model.config import ModelConfig
    from cinq.model.tokenizer import Tokenizer
    arith = None
    if settings.n_problems:
        eos = ModelConfig.from_pretrained(folder).eos_token_ids
        tok = Tokenizer.from_pretrained(folder, eos)
        gen = HFTextGenerator(hf_model, tok, list(dict.fromkeys(tok.eos_token_ids + eos)))
        arith = evaluate_arithmetic(folder, n=settings.n_problems, seed=settings.seed, generator=gen)
    return _quality(HFLogits(hf_model), ids, settings, base, arith)


def _quality(model: Any, ids: list[int], settings: QualitySettings, base: Any, arith: Any) -> ServedQuality:
    from cinq.eval.text_scores import score_text
    scores = score_text(model, ids, settings.context_len, base)
    return ServedQuality(scores.perplexity, scores.kl, scores.top1, arith.accuracy if arith else None,
                         arith.accuracy_se if arith else None, settings.n_problems, len(ids))
