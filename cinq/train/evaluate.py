"""Held-out quality of a model: perplexity per language on the corpus test split, KL to a teacher, and
exact-match accuracy on the held-out arithmetic problems, whole and step by step (greedy decoding with cinq's engine)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cinq.eval.perplexity import token_nll
from cinq.eval.tasks import accuracy, arithmetic_problems, step_accuracy, step_items
from cinq.train.data import TokenSplit
from cinq.train.generation import generate_naive, generate_with_engine
from cinq.train.losses import forward_kl
from cinq.train.tokenizer_train import load_tokenizer, special_ids

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
                    generator: str = "engine", model: Any = None) -> dict[str, Any]:
    """Greedy exact-match accuracy on ``n`` held-out problems; returns accuracy, timing and a few samples."""
    tok = load_tokenizer(model_dir)
    ids = special_ids(tok)
    problems = arithmetic_problems(n, seed=seed, split=split)
    items = step_items(problems)

    def complete(texts: list[str], max_tokens: int) -> list[str]:
        prompts = [[ids["bos"], *tok.encode(t, add_special_tokens=False).ids] for t in texts]
        if generator == "engine":
            outs = generate_with_engine(model_dir, prompts, max_tokens, 0.0, seed, stop=["\nQuestion"],
                                        dtype="bfloat16")
        else:
            outs = generate_naive(model, prompts, max_tokens, 0.0, seed, [ids["eos"]])
        return [tok.decode(o, skip_special_tokens=True) for o in outs]

    t0 = time.perf_counter()
    completions = complete([p.prompt() for p in problems], 96)
    step_completions = complete([it.prompt for it in items], 16)
    return {"accuracy": accuracy(problems, completions), "problems": n, "split": split, "seed": seed,
            "step_accuracy": step_accuracy(items, step_completions), "steps": len(items),
            "seconds": time.perf_counter() - t0,
            "samples": [{"prompt": p.prompt(), "completion": c, "answer": p.answer}
                        for p, c in zip(problems[:3], completions[:3])]}


def evaluate_folder(model_dir: str | Path, data_dir: str | Path, teacher: Any = None, n_arith: int = 300,
                    context_len: int = 512) -> dict[str, Any]:
    """Perplexities, arithmetic accuracy and (given a teacher model) KL to the teacher of a saved model."""
    from cinq.model.loader import load_model
    model = load_model(model_dir, dtype="float32")
    result: dict[str, Any] = {"model_dir": str(model_dir),
                              "parameters": sum(p.numel() for p in model.parameters())}
    result["perplexity"] = language_perplexities(model, data_dir, "test", context_len)
    if teacher is not None:
        result["kl_to_teacher"] = kl_to_teacher(model, teacher, data_dir)
    result["arithmetic"] = arithmetic_eval(model_dir, n_arith)
    return result
