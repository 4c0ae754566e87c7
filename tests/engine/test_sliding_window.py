"""Sliding-window KV freeing (cinq/engine/sliding_window.py): blocks out of every layer's window go back to the
pool, the block table keeps its indexing through the null block, and a model whose every layer is windowed
still decodes exactly what transformers does while its freed blocks are reused by other requests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.engine.sliding_window import SlidingWindowKVCacheManager, kv_memory_per_context
from cinq.sampling_params import SamplingParams
from cinq.step.request import Request


def _request(n: int, rid: str = "r") -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=100), 100, 0.0)


def test_blocks_before_the_window_are_freed_and_replaced_by_the_null_block():
    kv = SlidingWindowKVCacheManager(num_blocks=20, block_size=4, window=6, enable_caching=False)
    req = _request(16)
    assert kv.allocate_slots(req, 16)  # 4 blocks, nothing computed yet: nothing dead
    assert kv.num_free_blocks == 20 - 1 - 4
    req.num_computed_tokens = 16  # next step starts at 16: it reads keys > 16 - 6 = 10, i.e. blocks 2.. (8..15)
    req.append_output_token(99)
    assert kv.allocate_slots(req, 1)
    ids = kv.block_ids("r")
    assert len(ids) == 5 and ids[0] == ids[1] == kv.null_block.block_id and kv.num_freed_blocks == 2
    assert kv.num_free_blocks == 20 - 1 - 3
    kv.free("r")
    assert kv.num_free_blocks == 19 and kv.null_block.ref_cnt == 1  # the null block is never handed out


def test_first_live_block_keeps_every_key_a_future_query_reads():
    kv = SlidingWindowKVCacheManager(num_blocks=4, block_size=16, window=512)
    assert kv.first_live_block(511) == 0 and kv.first_live_block(527) == 1  # key 16 still read from 527
    assert kv.first_live_block(528) == 1 and kv.first_live_block(543) == 2


def test_memory_arithmetic_of_an_interleaved_model():
    windows = [512] * 5 + [None]  # one global layer in six
    mem = kv_memory_per_context(16384, windows * 3, kv_heads=1, head_dim=256, dtype_bytes=2, block_size=16)
    per_token_layer = 2 * 256 * 2
    assert mem.shared_table == 18 * 16384 * per_token_layer
    assert mem.per_group_tables == (3 * 16384 + 15 * 33 * 16) * per_token_layer
    local = kv_memory_per_context(16384, [512] * 4, 1, 256, 2, 16)
    assert local.shared_table == local.per_group_tables == 4 * 33 * 16 * per_token_layer


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def all_local_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cinq.model.byte_tokenizer import save_byte_tokenizer
    from cinq.model.config import ModelConfig
    from cinq.model.saver import init_random_model, save_model
    cfg = {"architectures": ["Gemma3ForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "max_position_embeddings": 256, "sliding_window": 6, "layer_types": ["sliding_attention"] * 2,
           "rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 32,
           "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2,
           "eos_token_id": 1}
    model = init_random_model(ModelConfig.from_dict(cfg), seed=5, std=0.2)
    path = save_model(model, tmp_path_factory.mktemp("local") / "m")
    save_byte_tokenizer(path)
    return path


def test_all_local_model_frees_blocks_and_decodes_like_transformers(all_local_folder: Path):
    from cinq import LLM
    hf = transformers.AutoModelForCausalLM.from_pretrained(all_local_folder, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (5, 9, 14)]
    # 3 requests x up to 54 tokens = 42 blocks of 4 without freeing; 16 blocks force reuse of freed ones
    llm = LLM(str(all_local_folder), dtype="float32", seed=0, block_size=4, num_kv_blocks=16)
    kv = llm.engine.core.kv
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, min_new_tokens=40,
                           eos_token_id=None)[0, len(prompt):].tolist()
        assert out.outputs[0].token_ids == want
    assert isinstance(kv, SlidingWindowKVCacheManager) and kv.num_freed_blocks > 20
