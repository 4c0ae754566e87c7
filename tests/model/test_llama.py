"""HF parity: cinq's decoder against transformers, for every supported architecture and CPU attention backend."""

from __future__ import annotations

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.kernels.backends import available_backends
from cinq.model.loader import load_model
from tests.model_factory import ARCHS

CPU_BACKENDS = [b for b in available_backends() if b != "triton"]
PROMPTS = [[1, 5, 9, 200, 33, 17, 101, 64, 250, 3, 77, 45, 12, 99, 140, 7, 8, 150, 44, 230, 21],
           [7, 50, 61], [42]]


def hf_model(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_training_forward_logits_match_transformers(tiny_models, arch):
    path = tiny_models(arch)
    ours, ref = load_model(path, dtype="float32"), hf_model(path)
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    with torch.no_grad():
        diff = (ours.compute_logits(ours(ids)) - ref(ids).logits).abs().max().item()
    assert diff <= 1e-4


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_paged_engine_matches_transformers(tiny_models, arch, backend):
    path = tiny_models(arch)
    ref = hf_model(path)
    llm = LLM(path, dtype="float32", attention_backend=backend, num_kv_blocks=64, block_size=4,
              max_num_batched_tokens=16)  # small blocks and budget: chunked prefill across scattered blocks
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, prompt_logprobs=0, logprobs=0)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        full = prompt + out.outputs[0].token_ids
        with torch.no_grad():
            ref_lp = ref(torch.tensor([full])).logits[0].log_softmax(-1)
        # Prompt logprobs (computed in prefill chunks) and generated-token logprobs (decode steps).
        for pos in range(1, len(prompt)):
            got = out.prompt_logprobs[pos][prompt[pos]].logprob
            assert abs(got - ref_lp[pos - 1, prompt[pos]].item()) <= 1e-4
        for j, tok in enumerate(out.outputs[0].token_ids):
            got = out.outputs[0].logprobs[j][tok].logprob
            assert abs(got - ref_lp[len(prompt) + j - 1, tok].item()) <= 1e-4
        assert out.outputs[0].token_ids == hf_greedy(ref, prompt, 32)


@pytest.mark.parametrize("arch", ARCHS)
def test_state_ids_return_the_named_states_in_their_order(tiny_models, arch):
    # EAGLE-3 asks the served forward for its three feature layers only: the same tensors as the full list's
    from cinq.errors import InvalidParameterError
    model = load_model(tiny_models(arch), dtype="float32")
    ids = torch.tensor([PROMPTS[0]])
    n = model.config.num_hidden_layers
    with torch.no_grad():
        final, every = model.forward_with_hidden_states(ids)
        picked_final, picked = model.forward_with_hidden_states(ids, state_ids=(n, 2, 0))
    assert len(every) == n + 1 and len(picked) == 3
    assert torch.equal(picked_final, final)
    for got, i in zip(picked, (n, 2, 0)):
        assert torch.equal(got, every[i])
    with pytest.raises(InvalidParameterError, match="state_ids") as e:
        model.forward_with_hidden_states(ids, state_ids=(n + 1,))
    assert e.value.param == "state_ids"
