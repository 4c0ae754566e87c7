"""Gemma 3 (cinq/model/gemma3.py) against transformers' Gemma3ForCausalLM with the same random weights: a tiny
config (window 8, global every 3rd layer, distinct local / global rope bases, q/k norms, GeGLU), every norm weight
random so that (1 + w) is exercised, logits in float32 on prompts past the window, served through the paged
engine too (the window in the attention backends); and the registry / saver / loader round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.model.byte_tokenizer import save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.registry import ModelRegistry
from cinq.model.saver import init_random_model, save_model
from tests.layers.test_norm import assert_native_matches_reference

transformers = pytest.importorskip("transformers")

CFG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "sliding_window": 8,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "rope_theta": 5e5,
    "rope_local_base_freq": 2e3, "query_pre_attn_scalar": 24, "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = ModelConfig.from_dict(CFG)
    model = init_random_model(config, seed=3, std=0.1)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # norms random too: the (1 + w) convention must match HF's
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    path = save_model(model, tmp_path_factory.mktemp("gemma3") / "m")
    save_byte_tokenizer(path)  # the engine wants a tokenizer; the tests feed token ids
    return path


@pytest.fixture(scope="module")
def hf_model(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_registry_resolves_gemma3_to_its_own_class():
    config = ModelConfig.from_dict(CFG)
    assert ModelRegistry.model_class(config.architecture).__name__ == "Gemma3ForCausalLM"
    assert [config.layer_window(i) for i in range(3)] == [8, 8, None]
    assert config.rope_local_theta == 2e3 and config.query_pre_attn_scalar == 24
    assert ModelConfig.from_dict({**CFG, "architectures": None}).architecture == "Gemma3ForCausalLM"


def test_transformers_reads_the_saved_config_as_gemma3(hf_model):
    assert type(hf_model).__name__ == "Gemma3ForCausalLM"
    assert hf_model.config.layer_types == CFG["layer_types"] and hf_model.config.sliding_window == 8


def test_float32_logits_equal_transformers_past_the_window(folder: Path, hf_model):
    from cinq.model.loader import load_model
    ours = load_model(folder, dtype="float32")
    ids = torch.randint(3, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine = ours.compute_logits(ours(ids))
        theirs = hf_model(ids).logits
    assert (mine - theirs).abs().max().item() < 1e-4


@pytest.mark.parametrize("backend", ["sdpa", "flash-torch", "reference"])
def test_served_greedy_tokens_equal_transformers(folder: Path, hf_model, backend: str):
    """Prompts of 5 to 30 tokens, 24 new tokens: decodes run far past the window of 8, in 4-token blocks, with
    chunked prefill splitting the longest prompt."""
    from cinq import LLM, SamplingParams
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (5, 12, 30)]
    llm = LLM(str(folder), dtype="float32", seed=0, attention_backend=backend, block_size=4, num_kv_blocks=64,
              max_num_batched_tokens=16)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        want = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
                                 eos_token_id=None)[0, len(prompt):].tolist()
        assert out.outputs[0].token_ids == want


def test_state_ids_return_the_named_states_in_their_order(folder: Path):
    from cinq.model.loader import load_model
    model = load_model(folder, dtype="float32")
    ids = torch.tensor([[3, 9, 27, 81, 43, 5, 7]])
    n = model.config.num_hidden_layers
    with torch.no_grad():
        final, every = model.forward_with_hidden_states(ids)
        picked_final, picked = model.forward_with_hidden_states(ids, state_ids=(1, n))
    assert len(every) == n + 1 and torch.equal(picked_final, final)
    assert torch.equal(picked[0], every[1]) and torch.equal(picked[1], every[n])


@pytest.mark.parametrize("shape", [(1, 640), (5, 4, 256), (300, 128)])
def test_native_norm_matches_the_pytorch_path(shape, monkeypatch):
    # Gemma's (1 + w) scales in float32 before the one rounding (Llama's norm rounds twice): the native kernel
    # follows it; the sum of squares may round differently, so a bf16 step on a few values at most
    from cinq.kernels.cpu_native import native_module
    from cinq.model import gemma3
    if native_module("rms_norm") is None:
        pytest.skip("no native CPU kernels here")
    g = torch.Generator().manual_seed(sum(shape))
    norm = gemma3.GemmaRMSNorm(shape[-1], 1e-6).to(torch.bfloat16).eval()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g) * 0.5)
    x = (torch.randn(shape, generator=g) * 4).to(torch.bfloat16)
    res = torch.randn(shape, generator=g).to(torch.bfloat16)
    calls = []
    native = gemma3.rms_norm_scaled_native
    monkeypatch.setattr(gemma3, "rms_norm_scaled_native", lambda *a: calls.append(1) or native(*a))
    assert_native_matches_reference(norm, x, res, monkeypatch, gemma3, "rms_norm_scaled_native")
    assert len(calls) == 2
    with torch.no_grad():  # a weight loaded after the first call: the kept scale follows it
        norm.weight.add_(1.0)
    with torch.inference_mode():
        moved = norm(x)
        monkeypatch.setattr(gemma3, "rms_norm_scaled_native", native)
        assert (norm(x) != moved).float().mean() < 0.01
