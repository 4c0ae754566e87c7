"""GPTQ act-order folders whose merged projections' shards carry different g_idx (AutoGPTQ / GPTQModel quantizing
each projection with its own Hessian order): served with one kernel per run of agreeing shards, giving the
logits of the dequantized float32 model and of the same folder loaded unmerged, under tensor parallelism too."""

from __future__ import annotations

import math

import pytest
import torch

from cinq.layers.quantization.shard_kernels import SHARD_KERNELS, g_idx_runs
from cinq.model.loader import load_model
from tests.layers.quantization.act_order import write_act_order_folders

IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [40, 41, 42, 43, 44, 45, 46, 47]])


def test_g_idx_runs_groups_adjacent_equal_rows():
    a, b = torch.arange(8), torch.arange(8).flip(0)
    assert g_idx_runs([a, a, a]) == [(0, 3)]
    assert g_idx_runs([a, a.clone(), b]) == [(0, 2), (2, 3)]  # equal values, not only the same tensor
    assert g_idx_runs([a, b, a]) == [(0, 1), (1, 2), (2, 3)]  # only adjacent shards share a kernel
    assert g_idx_runs([a, b, b.clone()]) == [(0, 1), (1, 3)]


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory):
    return write_act_order_folders(tiny_llama, tmp_path_factory.mktemp("act-order-shards"))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(IDS))


def test_merged_shards_with_different_g_idx_give_the_dequantized_logits(folders, monkeypatch):
    gptq, dequantized = folders
    model = load_model(gptq, "float32")
    layers = model.model.layers
    # layer 0: q, k, v, gate, up each their own g_idx; layer 1: q = k != v, gate = up (one kernel, as before)
    assert layers[0].self_attn.qkv_proj.kind == SHARD_KERNELS
    assert len(layers[0].self_attn.qkv_proj.shard_kernels.parts) == 3
    assert len(layers[0].mlp.gate_up_proj.shard_kernels.parts) == 2
    assert len(layers[1].self_attn.qkv_proj.shard_kernels.parts) == 2
    assert layers[1].mlp.gate_up_proj.kind not in (SHARD_KERNELS, "unloaded")
    assert layers[1].mlp.gate_up_proj.shard_kernels is None
    got = logits(model)
    ref = logits(load_model(dequantized, "float32"))
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    # the same folder with every projection its own linear (no merging) computes the same logits
    monkeypatch.setattr("cinq.model.llama.can_merge", lambda quant, prefixes: False)
    unmerged = load_model(gptq, "float32")
    assert unmerged.model.layers[0].self_attn.qkv_proj is None
    torch.testing.assert_close(logits(unmerged), got, atol=1e-6, rtol=1e-6)


def test_merged_shards_with_different_g_idx_under_tensor_parallelism(folders):
    from cinq import LLM, SamplingParams
    gptq, _ = folders
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=5, ignore_eos=True)
    engine = dict(dtype="float32", num_kv_blocks=64, seed=1)
    prompts = ["hello world", "the quick brown fox"]
    ref = [o.outputs[0] for o in LLM(str(gptq), **engine).generate(prompts, params)]
    llm = LLM(str(gptq), **engine, tensor_parallel_size=2)
    try:
        qkv = llm.engine.model.model.layers[0].self_attn.qkv_proj  # rank 0's columns, one kernel per shard
        assert qkv.kind == SHARD_KERNELS and len(qkv.shard_kernels.parts) == 3
        got = [o.outputs[0] for o in llm.generate(prompts, params)]
    finally:
        llm.engine.shutdown()
    for r, g in zip(ref, got):
        assert g.token_ids == r.token_ids
        for a, b in zip(r.logprobs, g.logprobs):
            assert set(a) == set(b)
            assert all(math.isclose(a[t].logprob, b[t].logprob, abs_tol=1e-4) for t in a)
