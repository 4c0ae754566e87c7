from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import causal_mask, check_inputs, context_slots, gather_context, write_kv_index_copy


def test_write_kv_index_copy_stores_rows_at_their_slots_only() -> None:
    cache = torch.full((2, 4, 4, 2, 3), -1.0)
    key, value = torch.randn(3, 2, 3), torch.randn(3, 2, 3)
    write_kv_index_copy(key, value, cache, torch.tensor([13, 2, 5]))
    for row, slot in enumerate([13, 2, 5]):
        assert torch.equal(cache[0, slot // 4, slot % 4], key[row])
        assert torch.equal(cache[1, slot // 4, slot % 4], value[row])
    assert int((cache == -1).sum()) == 2 * 16 * 6 - 2 * 3 * 6


def test_context_slots_and_gather_follow_the_block_table() -> None:
    cache = torch.randn(2, 6, 4, 1, 2)
    table = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    slots = context_slots(table, 10, 4)
    assert slots.tolist() == [20, 21, 22, 23, 0, 1, 2, 3, 12, 13]
    k, v = gather_context(cache, table, 10)
    flat = cache.view(2, 24, 1, 2)
    assert torch.equal(k, flat[0, slots]) and torch.equal(v, flat[1, slots])


def test_causal_mask_puts_queries_at_the_end() -> None:
    mask = causal_mask(2, 4, torch.device("cpu"))  # queries at positions 2 and 3
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def _meta() -> AttentionMetadata:
    return AttentionMetadata.from_lens([1, 2], [5, 2], [[0, 2], [1]], block_size=4)


@pytest.mark.parametrize("field,make", [
    ("query", lambda: (torch.randn(3, 8), torch.zeros(2, 3, 4, 2, 8))),  # query not 3-D
    ("kv_cache", lambda: (torch.randn(3, 4, 8), torch.zeros(3, 4, 2, 8))),  # cache not 5-D
    ("query", lambda: (torch.randn(3, 4, 16), torch.zeros(2, 3, 4, 2, 8))),  # head_dim differs
    ("query", lambda: (torch.randn(3, 3, 8), torch.zeros(2, 3, 4, 2, 8))),  # heads not a multiple of kv heads
    ("query", lambda: (torch.randn(5, 4, 8), torch.zeros(2, 3, 4, 2, 8))),  # token count differs from metadata
    ("query", lambda: (torch.ones(3, 4, 8, dtype=torch.int32), torch.zeros(2, 3, 4, 2, 8))),  # integer query
    ("block_size", lambda: (torch.randn(3, 4, 8), torch.zeros(2, 3, 8, 2, 8))),  # block size differs
])
def test_check_inputs_names_the_bad_field(field: str, make) -> None:
    query, cache = make()
    with pytest.raises(InvalidParameterError) as err:
        check_inputs(query, cache, _meta())
    assert err.value.param == field


def test_check_inputs_validates_key_value_and_out() -> None:
    query, cache, meta = torch.randn(3, 4, 8), torch.zeros(2, 3, 4, 2, 8), _meta()
    check_inputs(query, cache, meta, torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.empty(3, 4, 8))
    with pytest.raises(InvalidParameterError, match="key"):
        check_inputs(query, cache, meta, key=torch.randn(3, 4, 8))
    with pytest.raises(InvalidParameterError, match="out"):
        check_inputs(query, cache, meta, out=torch.empty(3, 4, 8, dtype=torch.float64))


def test_check_inputs_checks_a_step_once_and_again_for_new_inputs(monkeypatch) -> None:
    import cinq.kernels.paged as paged

    calls = []
    real = paged._check_inputs
    monkeypatch.setattr(paged, "_check_inputs", lambda *a: calls.append(1) or real(*a))
    query, cache, meta = torch.randn(3, 4, 8), torch.zeros(2, 3, 4, 2, 8), _meta()
    for _ in range(4):  # the layers of one step
        check_inputs(query, cache, meta)
    assert len(calls) == 1
    with pytest.raises(InvalidParameterError, match="out"):  # other inputs with the same metadata: checked
        check_inputs(query, cache, meta, out=torch.empty(3, 4, 8, dtype=torch.float64))
    meta.checked_inputs = None  # what StepBuffers.fill does for a new step
    check_inputs(query, cache, meta)
    assert len(calls) == 3
