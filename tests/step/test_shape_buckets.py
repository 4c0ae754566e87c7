"""Bucketed step shapes: the linears of a step see one of a few dozen row counts (oneDNN caches one primitive per
shape, ~0.3-0.8 MB each, so unbounded shapes grew server memory by ~1 GiB), and padding changes no output."""

from __future__ import annotations

import random

import torch

from cinq import LLM, SamplingParams
from cinq.step.shape_buckets import EXACT_ROWS, MAX_PAD_ROWS, bucket_rows


def test_buckets_are_few_and_pad_little():
    sizes = {bucket_rows(n) for n in range(1, 4097)}
    assert len(sizes) <= EXACT_ROWS + 48  # exact sizes, then 4-8 per power of two up to 4096
    for n in range(1, 4097):
        b = bucket_rows(n)
        assert n <= b < n + MAX_PAD_ROWS and (n <= EXACT_ROWS and b == n or b - n <= n // 4)


def test_linears_see_only_bucketed_rows_and_outputs_do_not_change(tiny_llama):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(3, 60))] for _ in range(24)]
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    llm = LLM(tiny_llama, dtype="float32", num_kv_blocks=256, block_size=8, max_num_batched_tokens=300)
    rows: set[int] = set()
    hooks = [m.register_forward_pre_hook(lambda _m, args: rows.add(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
             for m in llm.model.modules() if isinstance(m, torch.nn.Linear) or "Linear" in type(m).__name__]
    batched = llm.generate(prompts, params)
    for h in hooks:
        h.remove()
    assert rows and rows <= {bucket_rows(n) for n in range(1, 4097)}, sorted(rows)
    alone = [llm.generate([p], params)[0] for p in prompts[:6]]
    for a, b in zip(alone, batched):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [sorted(d) for d in a.outputs[0].logprobs] == [sorted(d) for d in b.outputs[0].logprobs]
    assert llm.engine.kv.num_free_blocks == 256
