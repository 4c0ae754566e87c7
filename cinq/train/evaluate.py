"""Held-out quality of a model: perplexity per language on the corpus test split, KL to a teacher, and
exact-match accuracy on the held-out arithmetic problems, whole and step by step (greedy decoding with cinq's
engine; the benchmark itself is cinq.eval.arithmetic)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cinq.eval.arithmetic import evaluate_arithmetic
from cinq.eval.perplexity import token_nll
from cinq.train.data import TokenSplit
from cinq.train.losses import forward_kl

LANG_ORDER = ("en", "de", "es", "it", "ru", "pl", "cs", "zh", "code", "math")


def language_perplexities(model: Any, data_dir: str | Path, split: str = "test", context_len: int = 512,
                          max_tokens: int | None = None) -> dict[str, float]:
    """Perplexity of each language's (and code's, and arithmetic's) documents, concatenated, under ``model``."""
    data = TokenSplit.load(data_dir, split)
    langs = [lang for lang in LANG_ORDER if lang in data.languages()]
    langs += [lang for lang in data.languages() if lang not in langs]
    out: dict[str, float] = {}
    total_nll, total_n = 0.0, 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for lang in langs:
            ids = data.stream(lang=lang, max_tokens=max_tokens)
            if len(ids) >= 2:
                nll, n = token_nll(model, ids, context_len=context_len, batch_size=8)
                out[lang] = math.exp(nll / n)
                total_nll, total_n = total_nll + nll, total_n + n
    # Pooled over every token of the split (weighted by tokens, unlike a mean of the per-language values).
    out["all"] = math.exp(total_nll / max(total_n, 1))
    return out


@torch.no_grad()
def kl_to_teacher(student: Any, teacher: Any, data_dir: str | Path, split: str = "test", seq_len: int = 256,
                  max_windows: int = 32) -> float:
    """Mean forward KL(teacher || student) per token over ``max_windows`` windows spread evenly over the split
    (which is laid out source by source: its first windows would all be English)."""
    data = TokenSplit.load(data_dir, split)
    tokens = data.tokens
    count = max(1, min(max_windows, len(tokens) // seq_len))
    starts = np.linspace(0, len(tokens) - seq_len, count).astype(np.int64)
    windows = torch.as_tensor(np.stack([np.asarray(tokens[s:s + seq_len], dtype=np.int64) for s in starts]))
    kls = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for b in range(0, len(windows), 8):
            x = windows[b:b + 8]
            kls.append(float(forward_kl(student.compute_logits(student(x)), teacher.compute_logits(teacher(x)))))
    return sum(kls) / len(kls)


def arithmetic_eval(model_dir: str | Path, n: int = 300, seed: int = 0, split: str = "test",
                    generator: str = "engine", model: Any = None, task: str = "arithmetic") -> dict[str, Any]:
    """Greedy exact-match accuracy on ``n`` held-out problems, whole and per step, with standard errors (the one
    implementation: cinq.eval.arithmetic); returns accuracy, timing and a few samples as a JSON-ready dict.
    ``generator`` "naive" decodes ``model`` (a loaded module) without the engine."""
    r = evaluate_arithmetic(model_dir, task=task, n=n, seed=seed, split=split, generator=generator,
                            dtype="bfloat16" if generator == "engine" else "float32", model=model)
    return {"accuracy": r.accuracy, "accuracy_se": r.accuracy_se, "problems": n, "split": split, "seed": seed,
            "task": task, "step_accuracy": r.step_accuracy, "step_accuracy_se": r.step_accuracy_se,
            "steps": r.n_steps, "seconds": r.seconds, "samples": r.samples}


def evaluate_folder(model_dir: str | Path, data_dir: str | Path, teacher: Any = None, n_arith: int = 300,
                    context_len: int = 512, n_arith_easy: int = 1000) -> dict[str, Any]:
    """Perplexities, arithmetic accuracy (the corpus level on ``n_arith`` problems, the easy level on
    ``n_arith_easy``; 0 skips it) and (given a teacher model) KL to the teacher of a saved model."""
    from cinq.model.loader import load_model
    model = load_model(model_dir, dtype="float32")
    result: dict[str, Any] = {"model_dir": str(model_dir),
                              "parameters": sum(p.numel() for p in model.parameters())}
    result["perplexity"] = language_perplexities(model, data_dir, "test", context_len)
    if teacher is not None:
        result["kl_to_teacher"] = kl_to_teacher(model, teacher, data_dir)
    result["arithmetic"] = arithmetic_eval(model_dir, n_arith)
    if n_arith_easy:
        # The level the shipped teacher is trained to solve (and the quantization study judges).
        result["arithmetic_easy"] = arithmetic_eval(model_dir, n_arith_easy, task="arithmetic-easy")
    return result
