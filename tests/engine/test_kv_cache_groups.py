"""KV cache groups (cinq/engine/kv_cache_groups.py): a model mixing full and sliding-window layers keeps one pool
per group; the sliding group's blocks out of the window go back to its pool (bounded per request during a long
decode), the full group behaves as the plain manager, allocation is all-or-nothing across groups, and greedy
tokens are those of the single-table path, with preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.engine.kv_cache import KVCacheManager
from cinq.engine.kv_cache_groups import HybridKVCacheManager, split_kv_blocks, uses_kv_cache_groups
from cinq.model.byte_tokenizer import save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.saver import init_random_model, save_model
from cinq.step.request import Request
from tests.model.test_gemma3 import CFG

WINDOW, BS = 8, 4


def _request(n: int, rid: str = "r") -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=500), 500, 0.0)


def _live(kv: HybridKVCacheManager, rid: str) -> int:
    """The request's sliding-group blocks that are not the null block."""
    return sum(1 for b in kv.sliding.requests[rid].blocks if b is not kv.sliding.null_block)


def test_long_decode_keeps_the_sliding_group_bounded_and_the_full_group_plain():
    kv = HybridKVCacheManager(200, 20, BS, WINDOW)
    plain = KVCacheManager(200, BS, enable_caching=False)
    req, twin = _request(30), _request(30)
    assert kv.allocate_slots(req, 30, [], 0) and plain.allocate_slots(twin, 30, [], 0)
    bound = WINDOW // BS + 2
    for _ in range(150):  # decode far past the window, one token a step
        for r in (req, twin):
            r.num_computed_tokens = r.num_tokens
            r.append_output_token(7)
        assert kv.allocate_slots(req, 1) and plain.allocate_slots(twin, 1)
        assert _live(kv, "r") <= bound
        assert kv.block_ids("r") == plain.block_ids("r") and kv.num_free_blocks == plain.num_free_blocks
    assert kv.sliding.num_freed_blocks > 30 and kv.sliding.pool.num_free_blocks == 20 - 1 - _live(kv, "r")
    groups = kv.group_block_ids("r")
    assert len(groups[1]) == len(groups[0]) and groups[1][0] == kv.sliding.null_block.block_id
    kv.free("r")
    assert kv.num_free_blocks == 200 and kv.sliding.pool.num_free_blocks == 19


def test_allocation_is_all_or_nothing_across_groups():
    kv = HybridKVCacheManager(4, 40, BS, WINDOW)  # the full group is the short one
    req = _request(20)
    assert not kv.allocate_slots(req, 20, [], 0)  # 5 full blocks > 4
    assert kv.sliding.pool.num_free_blocks == 39 and kv.num_free_blocks == 4 and kv.block_ids("r") == []
    kv2 = HybridKVCacheManager(40, 4, BS, WINDOW)  # now the sliding group (3 usable blocks)
    assert not kv2.allocate_slots(req, 20, [], 0) and kv2.num_free_blocks == 40


def test_split_keeps_the_byte_budget_and_favours_the_full_group():
    gemma = ModelConfig.from_dict({**CFG, "num_hidden_layers": 18, "sliding_window": 512,
                                   "max_position_embeddings": 32768,
                                   "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3})
    assert uses_kv_cache_groups(gemma) and not uses_kv_cache_groups(ModelConfig.from_dict(
        {**CFG, "layer_types": ["sliding_attention"] * 3}))
    full, sliding = split_kv_blocks(gemma, 10_000, 16, 32768, 2048)
    assert 3 * full + 15 * sliding <= 18 * 10_000 < 3 * full + 15 * sliding + 18
    # per request at 32k: 2048 full blocks, (511 + 2048) / 16 + 2 = 162 sliding ones
    assert full // 2048 == sliding // 162 and full > 2 * 10_000


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = init_random_model(ModelConfig.from_dict(CFG), seed=13, std=0.3)
    path = save_model(model, tmp_path_factory.mktemp("groups") / "m")
    save_byte_tokenizer(path)
    return path


def test_greedy_tokens_match_the_single_table_path_with_preemption(folder: Path, monkeypatch):
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (26, 31, 19, 35)]  # 2-4 windows
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    args = dict(dtype="float32", seed=0, block_size=BS, max_num_batched_tokens=16)
    llm = LLM(str(folder), num_kv_blocks=20, **args)
    kv = llm.engine.core.kv
    assert isinstance(kv, HybridKVCacheManager)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.get_stats().num_preemptions > 0 and kv.sliding.num_freed_blocks > 20
    assert kv.num_free_blocks == kv.full.num_blocks and kv.sliding.pool.num_free_blocks == kv.sliding.num_blocks - 1
    monkeypatch.setattr("cinq.engine.core.uses_kv_cache_groups", lambda config: False)
    ref = LLM(str(folder), num_kv_blocks=200, **args)
    assert not isinstance(ref.engine.core.kv, HybridKVCacheManager)
    assert [o.outputs[0].token_ids for o in ref.generate(prompts, params)] == got


def test_a_request_the_full_group_cannot_hold_is_refused_not_left_waiting(folder: Path):
    """The budget of 24 shared blocks leaves the full-attention group 1 block of 4 tokens: a request of 11
    tokens is refused at once, naming max_tokens (checked against the budget's 24 blocks, it waited forever)."""
    from cinq.errors import PromptTooLongError
    llm = LLM(str(folder), dtype="float32", block_size=4, num_kv_blocks=24, engine_core="inproc")
    assert llm.engine.kv.num_blocks == 1
    with pytest.raises(PromptTooLongError, match="1 blocks of 4 tokens") as e:
        llm.generate([[5, 6, 7, 8, 9, 10, 11]], SamplingParams(max_tokens=4))
    assert e.value.param == "max_tokens"
    assert llm.generate([[5, 6]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids  # one that fits runs
