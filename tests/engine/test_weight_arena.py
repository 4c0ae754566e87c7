"""Packing a model's weights into one huge-page arena keeps every output bit-identical and every sharing intact."""

from __future__ import annotations

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.engine import weight_arena
from cinq.engine.weight_arena import pack_weights
from cinq.host_memory import huge_pages_available
from cinq.model.loader import load_model


pytestmark = pytest.mark.skipif(not huge_pages_available(), reason="no transparent huge pages on this machine")


@pytest.fixture(autouse=True)
def _huge_pages_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CINQ_HUGE_PAGES", raising=False)  # an A/B shell's setting must not skip the packing


@pytest.fixture
def model(tiny_llama):
    return load_model(tiny_llama, "float32")


def logits_of(model) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 42, 9, 77]])
    with torch.inference_mode():
        hidden = model(ids, torch.arange(5)[None], None)
        return model.compute_logits(hidden)


def test_packed_weights_give_bit_identical_logits(model) -> None:
    before = logits_of(model)
    packed = pack_weights(model, min_bytes=0)
    assert packed is not None and packed.tensors == len(list(model.parameters())) + len(list(model.buffers()))
    assert torch.equal(logits_of(model), before)


def test_every_weight_lives_in_the_arena(model) -> None:
    packed = pack_weights(model, min_bytes=0)
    lo = packed.arena.data_ptr()
    hi = lo + packed.nbytes
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert lo <= t.data_ptr() < hi, name
        assert t.data_ptr() % 64 == 0 or t.storage_offset() > 0, name


def test_tied_weights_stay_one_storage(tiny_models) -> None:
    model = load_model(tiny_models("qwen2"), "float32")  # tied embeddings
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    assert emb.data_ptr() == head.data_ptr()
    pack_weights(model, min_bytes=0)
    assert emb.data_ptr() == head.data_ptr()
    with torch.no_grad():
        emb[0, 0] = 123.0
    assert float(head[0, 0]) == 123.0


def test_views_of_one_storage_keep_their_offsets(model) -> None:
    w = next(model.parameters())
    shared = torch.nn.Module()
    shared.register_buffer("row", w.detach()[1])  # a view: the same storage, offset by one row
    expected = w.detach()[1].clone()
    pack_weights(model, shared, min_bytes=0)
    assert shared.row.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert torch.equal(shared.row, expected)


def test_small_models_and_turned_off_huge_pages_are_left_alone(model, monkeypatch) -> None:
    assert pack_weights(model) is None  # a tiny model is under MIN_PACK_BYTES
    monkeypatch.setenv("CINQ_HUGE_PAGES", "0")
    assert pack_weights(model, min_bytes=0) is None


def test_an_engine_serves_the_same_tokens_from_packed_weights(tiny_llama, monkeypatch) -> None:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79]]
    plain = LLM(tiny_llama, dtype="bfloat16")
    assert plain.engine.core.executor.packed_weights is None  # under MIN_PACK_BYTES
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    monkeypatch.setattr(weight_arena, "MIN_PACK_BYTES", 0)
    packed = LLM(tiny_llama, dtype="bfloat16")
    assert packed.engine.core.executor.packed_weights is not None
    assert [o.outputs[0].token_ids for o in packed.generate(prompts, params)] == want
