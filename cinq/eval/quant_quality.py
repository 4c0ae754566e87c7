"""Quantization quality, per model folder: perplexity AND reasoning accuracy, one row each, the first row the
baseline of the deltas (rendering, findings and plot: cinq.eval.quality_report).

Perplexity alone hides what low-bit weights lose on multi-step reasoning (arXiv 2505.11574), so every row also
carries exact-match accuracy on held-out arithmetic word problems with worked steps (cinq.eval.arithmetic), with
standard errors, the KL and top-1 agreement of its next-token distributions against the baseline's, its
checkpoint bytes and its batch-1 decode speed. Each folder is loaded the way the engine loads it (the
quantization method comes from its config.json), so the numbers are those of the served model.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cinq.eval.generation import EngineGenerator, GenerateFn, NaiveGenerator
from cinq.eval.quality_report import ModelQuality, QualityReport
from cinq.eval.text_scores import BaseScores, base_scores, score_text

log = logging.getLogger(__name__)

# generator(model folder) -> GenerateFn for that folder; "engine" and "naive" name the two built in.
GeneratorFactory = Callable[[Path], GenerateFn]
LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

__all__ = ["ModelQuality", "QualityReport", "EvalSettings", "baseline_scores", "compare_to_base", "describe_folder",
           "evaluate_model", "quality_report"]


@dataclass(slots=True)
class EvalSettings:
    """What every row is evaluated with (part of the resume cache key: a change re-evaluates)."""

    task: str = "arithmetic"
    n_problems: int = 100  # 0: no reasoning task
    seed: int = 0
    split: str = "test"
    dtype: str = "bfloat16"
    context_len: int = 256
    max_new_tokens: int = 96
    kl_tokens: int = 4096  # tokens of the perplexity text scored for KL / top-1 against the baseline
    decode_tokens: int = 64  # batch-1 decode timing: new tokens per run (0: not measured)
    decode_repeats: int = 3
    # Dequantize weight-only quantized layers once at load (cinq.layers.quantization.kernels.dequantized_at_load)
    # for every pass. Same function, dense speed: the CPU int4 / int8 kernels are built for decode-sized batches
    # and run the perplexity windows and batched answers with float32 activations 25-100x slower. The batch-1
    # speed column is then the dense one.
    dequantize: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.dequantize:  # left out when off, so the cached rows of earlier studies keep their keys
            del d["dequantize"]
        return d


def describe_folder(path: Path) -> tuple[str, int | None, int]:
    """(method, bits, tensor bytes) of a model folder."""
    method, bits, _group = _quant_of(Path(path))
    return method, bits, checkpoint_bytes(Path(path))[1]


# GGUF linear names (blk.N.<name>.weight) of the decoder linears, and the bits of its block types.
GGUF_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_GGUF_BITS = {"Q2_K": 2, "Q3_K": 3, "Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6,
              "Q8_0": 8}


def _gguf_linears(path: Path) -> list[Any] | None:
    """The decoder linears' tensor-table entries of a GGUF file (None: ``path`` is not one)."""
    from cinq.model.gguf.file import find_gguf_file, read_gguf
    file = find_gguf_file(path)
    if file is None:
        return None
    return [t for t in read_gguf(file).tensors.values() if t.name.split(".")[-2] in GGUF_LINEARS]


def _quant_of(path: Path) -> tuple[str, int | None, int | None]:
    linears = _gguf_linears(path)
    if linears is not None:  # a GGUF file: its decoder linears' most common block type
        kinds = [t.type_name for t in linears]
        kind = max(set(kinds), key=kinds.count)
        if kind not in _GGUF_BITS:
            return f"gguf ({kind})", None, None
        return f"gguf ({kind})", _GGUF_BITS[kind], linears[kinds.index(kind)].block_values
    cfg = json.loads((path / "config.json").read_text())
    qc = cfg.get("quantization_config")
    if not qc:
        return "float", None, None
    from cinq.quant.config import QuantConfig
    q = QuantConfig.from_hf(qc)
    return f"{q.method} ({q.format})", q.bits, q.group_size


def checkpoint_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the decoder linears' tensors, bytes of all tensors) as stored in the folder's safetensors, or in
    the GGUF file ``path`` names (its quantized blocks as they are: scales and minima included)."""
    from safetensors import safe_open

    from cinq.model.loader import checkpoint_files
    linears = _gguf_linears(path)
    if linears is not None:
        from cinq.model.gguf.file import find_gguf_file, read_gguf
        every = read_gguf(find_gguf_file(path)).tensors.values()  # type: ignore[arg-type]
        return sum(t.nbytes for t in linears), sum(t.nbytes for t in every)
    linear = total = 0
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                nbytes = math.prod(sl.get_shape()) * _dtype_bytes(sl.get_dtype())
                total += nbytes
                if any(f".{s}." in name for s in LINEAR_SUFFIXES):
                    linear += nbytes
    return linear, total


def _dtype_bytes(name: str) -> int:
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1,
            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}.get(name, 4)


def compare_to_base(base: Any, model: Any, token_ids: Sequence[int], context_len: int = 256,
                    max_tokens: int = 8192) -> tuple[float, float]:
    """(mean KL(base || model) per token, top-1 agreement) over the first ``max_tokens`` predictions of
    ``token_ids``: how far a quantized model's next-token distributions moved, which perplexity averages away.
    (The study scores them in its perplexity pass instead: cinq.eval.text_scores.)"""
    ids = list(token_ids)
    scores = score_text(model, ids, context_len, base_scores(base, ids, context_len, max_tokens))
    return float(scores.kl or 0.0), float(scores.top1 or 0.0)


def _generator(kind: str | GeneratorFactory, path: Path, dtype: str) -> GenerateFn:
    if callable(kind):
        return kind(path)
    if kind == "engine":
        return EngineGenerator(path, dtype=dtype)
    return NaiveGenerator.from_folder(path, dtype=dtype)


def _loading(settings: EvalSettings) -> AbstractContextManager[Any]:
    """The context models are loaded in: weight-only layers dequantized at load when ``settings.dequantize``."""
    if not settings.dequantize:
        return nullcontext()
    from cinq.layers.quantization.kernels import dequantized_at_load
    return dequantized_at_load()


def _load(path: Path, settings: EvalSettings) -> Any:
    """The model of ``path`` for the perplexity pass (see ``_loading``)."""
    from cinq.model.loader import load_model
    with _loading(settings):
        return load_model(path, dtype=settings.dtype)


def baseline_scores(path: str | Path, ppl_text: str, settings: EvalSettings) -> BaseScores | None:
    """The baseline's log-probs for the KL / top-1 columns (None without text or KL tokens)."""
    if not ppl_text or settings.kl_tokens <= 0:
        return None
    from cinq.eval.perplexity import encode_text
    from cinq.model.loader import load_model
    from cinq.model.tokenizer import Tokenizer
    ids = encode_text(Tokenizer.from_pretrained(path), ppl_text)
    return base_scores(load_model(path, dtype=settings.dtype), ids, settings.context_len, settings.kl_tokens)


def evaluate_model(path: str | Path, ppl_text: str, settings: EvalSettings, label: str | None = None,
                   base: BaseScores | None = None, generator: str | GeneratorFactory = "engine") -> ModelQuality:
    """Perplexity of ``ppl_text`` and arithmetic accuracy for one model folder; with ``base`` (the baseline's
    ``baseline_scores``), also its KL and top-1 agreement against it; with the engine, its batch-1 decode
    speed and kernels."""
    from cinq.eval.perplexity import encode_text
    from cinq.eval.task_set import evaluate_task, first_prompt
    from cinq.model.tokenizer import Tokenizer
    start = time.perf_counter()
    path = Path(path)
    method, bits, group = _quant_of(path)
    linear_bytes, nbytes = checkpoint_bytes(path)
    row = ModelQuality(label or path.name, str(path), method, bits, nbytes, None, None, settings.n_problems,
                       group_size=group, linear_bytes=linear_bytes)
    tok = Tokenizer.from_pretrained(path)
    if ppl_text:
        scores = score_text(_load(path, settings), encode_text(tok, ppl_text), settings.context_len, base)
        row.perplexity, row.kl_vs_base, row.top1_vs_base = scores.perplexity, scores.kl, scores.top1
    if settings.n_problems > 0 or settings.decode_tokens > 0:
        with _loading(settings):
            gen = _generator(generator, path, settings.dtype)
        if settings.n_problems > 0:
            r = evaluate_task(path, settings.task, settings.n_problems, settings.seed, settings.split,
                              generator=gen, max_new_tokens=settings.max_new_tokens)
            row.accuracy, row.accuracy_se, row.step_accuracy = r.accuracy, r.accuracy_se, r.step_accuracy
            row.step_accuracy_se, row.n_steps, row.gen_tokens_per_s = r.step_accuracy_se, r.n_steps, r.tokens_per_s
            row.correct, row.step_hits, row.step_counts = r.correct, r.step_hits, r.step_counts
        if isinstance(gen, EngineGenerator):
            row.kernels = gen.kernels()
            if settings.decode_tokens > 0:
                prompt = first_prompt(settings.task, settings.seed, settings.split)
                row.decode_tokens_per_s = gen.decode_tokens_per_s(tok.encode(prompt), settings.decode_tokens,
                                                                  settings.decode_repeats)
        del gen
    row.eval_seconds = time.perf_counter() - start
    return row


def quality_report(models: Sequence[str | Path] | Mapping[str, str | Path], ppl_text: str = "",
                   ppl_source: str = "", n_problems: int = 100, seed: int = 0, split: str = "test",
                   dtype: str = "bfloat16", context_len: int = 256, max_new_tokens: int = 96,
                   generator: str | GeneratorFactory = "engine", task: str = "arithmetic",
                   decode_tokens: int = 64) -> QualityReport:
    """Evaluate every folder (the first is the baseline of the deltas) on the same text and problems of
    ``task`` (any of cinq.eval.task_set.ALL_TASKS). (`cinq eval --variants` and benchmarks/quant.py make the
    folders and cache the rows: cinq.eval.quant_study.)"""
    from cinq.eval.task_set import check_task
    check_task(task)
    settings = EvalSettings(task, n_problems, seed, split, dtype, context_len, max_new_tokens,
                            decode_tokens=decode_tokens)
    items = list(models.items()) if isinstance(models, Mapping) else [(Path(p).name, p) for p in models]
    base = baseline_scores(items[0][1], ppl_text, settings) if len(items) > 1 else None
    rows = []
    for i, (label, path) in enumerate(items):
        log.info("evaluating %s (%s)", label, path)
        rows.append(evaluate_model(path, ppl_text, settings, label, base if i else None, generator))
    if base is not None:
        rows[0].kl_vs_base, rows[0].top1_vs_base = 0.0, 1.0
    return QualityReport(rows, ppl_source, task)
