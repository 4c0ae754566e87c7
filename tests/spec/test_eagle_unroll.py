"""The unrolled head (training-time test, offline acceptance) equals drafting chains one token at a time over the
paged KV cache, as served: the mask, the feature shift and the positions are the serving ones."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels.metadata import AttentionMetadata
from cinq.spec.eagle import new_eagle_head
from cinq.spec.eagle_unroll import unroll, unroll_mask, valid_rows
from tests.spec.random_target import random_target


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # float32 through different kernels (SDPA with a mask, the paged decode kernel): ~4e-6 seen; a wrong mask,
    # shift or position is off by O(1)
    return float((a - b).abs().max() / b.abs().max()) < 1e-4


def test_mask_of_step_one() -> None:
    m = unroll_mask(4, 1).int()
    # step 0's keys: positions <= i - 1; step 1's keys: the row itself
    assert m.tolist() == [[0, 0, 0, 0, 1, 0, 0, 0],
                          [1, 0, 0, 0, 0, 1, 0, 0],
                          [1, 1, 0, 0, 0, 0, 1, 0],
                          [1, 1, 1, 0, 0, 0, 0, 1]]
    assert unroll_mask(4, 0).int().tolist() == torch.tril(torch.ones(4, 4)).int().tolist()
    assert valid_rows(4, 2).tolist() == [False, False, True, True]


def test_mask_of_step_two_sees_its_chain() -> None:
    m = unroll_mask(5, 2)
    i = 3  # the chain started at t = 1: step 0 keys 0..1, step 1 key at row 2, step 2 key at row 3
    assert m[i, :5].nonzero().flatten().tolist() == [0, 1]
    assert m[i, 5:10].nonzero().flatten().tolist() == [2]
    assert m[i, 10:].nonzero().flatten().tolist() == [3]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_unrolled_steps_equal_chains_drafted_over_the_paged_cache(method: str) -> None:
    target = random_target()
    head = new_eagle_head(target, method, seed=2)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    n, steps, block = 12, 3, 4
    ids = torch.randint(0, 97, (n + 1,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, states = target.forward_with_hidden_states(ids[None])
        feats = head.fuse([states[i][0, :n] for i in head.feature_layers])
        tokens = ids[1:]  # the token after each position
        outs = unroll(head, tokens[None], feats[None], steps)
        attn = head.attention_layers()[0]
        table = [5, 0, 3, 1, 2]
        for t in (0, 4, 8):
            attn.kv_cache = torch.full((2, 6, block, 2, 16), float("nan"))
            # step 0: the verified prefix 0..t, teacher-forced (the runner's prefill / verify pass)
            meta = AttentionMetadata.from_lens([t + 1], [t + 1], [table], block)
            nxt, normed = head(tokens[:t + 1], feats[:t + 1], torch.arange(t + 1), meta)
            assert close(normed[t], outs[0][1][0, t])
            feature = nxt[t:t + 1]
            for j in range(1, steps):
                pos = t + j
                meta = AttentionMetadata.from_lens([1], [pos + 1], [table], block)
                nxt, normed = head(tokens[pos:pos + 1], feature, torch.tensor([pos]), meta)
                assert close(normed[0], outs[j][1][0, pos]), f"chain {t} step {j}"
                assert close(nxt[0], outs[j][0][0, pos])
                feature = nxt


def test_unroll_trains_and_restores_the_attention() -> None:
    target = random_target()
    head = new_eagle_head(target, "eagle3")
    attn = head.attention_layers()[0]
    backend = attn.backend
    tokens = torch.randint(0, 97, (2, 8))
    feats = torch.randn(2, 8, 64)
    outs = unroll(head, tokens, feats, 3)
    sum(target.compute_logits(normed).logsumexp(-1).mean() for _, normed in outs).backward()
    assert head.fc.weight.grad is not None and head.fuse_fc.weight.grad is None  # fuse ran outside the unroll
    assert attn.backend is backend and attn.kv_cache is None
