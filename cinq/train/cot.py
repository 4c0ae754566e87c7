"""Chain-of-thought distillation data on the arithmetic tasks (Distilling step-by-step, Hsieh et al. 2023).

Each training problem gives two examples: the rationale task (``prompt() -> worked steps + Answer``, with the
teacher's own rationale when it reaches the right answer, the gold one otherwise) and the answer task
(``Question: ... \\nAnswer: <int>``, the answer alone). Rows pack examples up to ``seq_len + 1`` tokens;
the rationale mask selects the solution tokens for the distillation objective, the answer mask the answer
tokens for the cross-entropy of the answer task.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from cinq.tasks import arithmetic_problems, extract_answer
from cinq.train.data import window_rng
from cinq.train.generation import generate_naive, generate_with_engine

log = logging.getLogger(__name__)
_ANSWER_LINE = re.compile(r"Answer:\s*-?\d+")


def _cut_after_answer(text: str) -> str | None:
    m = _ANSWER_LINE.search(text)
    return text[:m.end()] if m else None


def build_cot_examples(distiller: Any, n: int, cache: Path) -> list[dict[str, Any]]:
    """Tokenized (prompt, rationale, answer-task) examples for ``n`` training problems (cached as JSON)."""
    if cache.is_file():
        return json.loads(cache.read_text())["examples"]
    job, tok, ids = distiller.job, distiller.tok, distiller.ids
    problems = arithmetic_problems(n, seed=job.seed + 100, split="train")
    rationales = [p.target() for p in problems]
    kept = 0
    if job.cot_rationales == "teacher":
        prompts = [[ids["bos"], *tok.encode(p.prompt(), add_special_tokens=False).ids] for p in problems]
        if job.generator == "engine":
            outs = generate_with_engine(distiller.teacher_dir, prompts, 96, 0.0, job.seed, stop=["\nQuestion"],
                                        dtype="bfloat16")
        else:
            outs = generate_naive(distiller.teacher, prompts, 96, 0.0, job.seed, [ids["eos"]])
        for i, (p, o) in enumerate(zip(problems, outs)):
            text = _cut_after_answer(tok.decode(o, skip_special_tokens=True))
            if text is not None and extract_answer(text) == p.answer:
                rationales[i] = text
                kept += 1
        log.info("CoT: the teacher's rationale was right for %d of %d problems", kept, len(problems))
    examples = []
    for p, r in zip(problems, rationales):
        examples.append({
            "prompt": [ids["bos"], *tok.encode(p.prompt(), add_special_tokens=False).ids],
            "rationale": [*tok.encode(r, add_special_tokens=False).ids, ids["eos"]],
            "answer_prompt": [ids["bos"], *tok.encode(f"Question: {p.question}\nAnswer:",
                                                      add_special_tokens=False).ids],
            "answer": [*tok.encode(f" {p.answer}", add_special_tokens=False).ids, ids["eos"]],
        })
    cache.write_text(json.dumps({"teacher_rationales_kept": kept, "examples": examples}) + "\n")
    return examples


def cot_batch(examples: list[dict[str, Any]], ids: dict[str, int], batch_size: int, seq_len: int, seed: int,
              step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, S+1], rationale mask [B, S], answer mask [B, S]) for ``step``, packed from random examples."""
    rng = window_rng(seed, step, 2)
    tokens = torch.full((batch_size, seq_len + 1), ids["pad"], dtype=torch.long)
    r_mask = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    a_mask = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    width = seq_len + 1
    for row in range(batch_size):
        pos = 0
        while pos < width:
            i = int(rng.integers(len(examples)))
            ex = examples[i]
            # The answer task is always another problem: right after its own rationale ("... Answer: N") the
            # answer could be copied from context instead of computed.
            j = int(rng.integers(len(examples) - 1)) if len(examples) > 1 else 0
            ans = examples[j + (j >= i) if len(examples) > 1 else i]
            parts = [(ex["prompt"], ex["rationale"], r_mask), (ans["answer_prompt"], ans["answer"], a_mask)]
            need = sum(len(a) + len(b) for a, b, _ in parts)
            if pos > 0 and pos + need > width:
                break  # the row is full; an example too long for an empty row is cut at the row's end instead
            for prompt, target, mask in parts:
                seq = (prompt + target)[:width - pos]
                tokens[row, pos:pos + len(seq)] = torch.tensor(seq)
                # Position p predicts token p + 1: the target tokens are predicted from len(prompt) - 1 on.
                start = pos + len(prompt) - 1
                end = min(start + len(target), seq_len)
                if start < end:
                    mask[row, start:end] = True
                pos += len(seq)
                if pos >= width:
                    break
    return tokens, r_mask, a_mask
