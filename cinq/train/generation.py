"""Batched generation for distillation and evaluation.

``generate_with_engine`` runs a saved model folder through cinq's own serving engine (paged KV cache,
continuous batching): sequence-level KD data, on-policy samples (from a snapshot of the student), and the
arithmetic benchmark all use it. ``generate_naive`` is the fallback that needs only the training-mode forward
(no KV cache: every step recomputes the whole prefix), for models that live only in memory and for tests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch


def generate_with_engine(model_dir: str | Path, prompts: list[list[int]], max_tokens: int, temperature: float = 1.0,
                         seed: int = 0, top_p: float = 1.0, stop: list[str] | None = None, dtype: str = "float32",
                         max_num_seqs: int = 64) -> list[list[int]]:
    """Completion token ids (eos included when reached) for each prompt; request ``i`` samples with seed
    ``seed + i`` so results do not depend on batching."""
    from cinq import LLM, SamplingParams

    longest = max(len(p) for p in prompts) + max_tokens
    blocks = max_num_seqs * math.ceil(longest / 16) + 16
    llm = LLM(str(model_dir), dtype=dtype, max_num_seqs=max_num_seqs, num_kv_blocks=blocks,
              max_model_len=max(longest, 16), enable_prefix_caching=False)
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed + i,
                             stop=stop, skip_special_tokens=False) for i in range(len(prompts))]
    outs = llm.generate([list(p) for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


@torch.no_grad()
def generate_naive(model: Any, prompts: list[list[int]], max_tokens: int, temperature: float = 1.0, seed: int = 0,
                   eos_ids: list[int] | None = None, batch_size: int = 16) -> list[list[int]]:
    """Completion token ids per prompt by plain sampling (greedy at temperature 0) over the training-mode
    forward; prompts of equal length are batched together, so no padding or attention mask is needed."""
    eos = set(eos_ids or [])
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[len(p)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    was_training = model.training
    model.eval()
    for length in sorted(by_len):
        idx = by_len[length]
        for b in range(0, len(idx), batch_size):
            rows = idx[b:b + batch_size]
            seq = torch.tensor([prompts[i] for i in rows], dtype=torch.long, device=device)
            done = torch.zeros(len(rows), dtype=torch.bool)
            for _ in range(max_tokens):
                logits = model.compute_logits(model(seq)[:, -1])
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    probs = torch.softmax(logits.float() / temperature, -1).cpu()
                    nxt = torch.multinomial(probs, 1, generator=gen).squeeze(-1).to(device)
                for r, tok in enumerate(nxt.tolist()):
                    if not done[r]:
                        out[rows[r]].append(tok)
                        done[r] = tok in eos
                if bool(done.all()):
                    break
                seq = torch.cat([seq, nxt[:, None]], dim=1)
    model.train(was_training)
    return out
