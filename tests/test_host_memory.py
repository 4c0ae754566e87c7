"""Host memory: tensors in 2 MB pages (the engine's weights and KV caches) and their fallbacks."""

from __future__ import annotations

import gc

import pytest
import torch

from cinq import host_memory
from cinq.host_memory import HUGE_PAGE_BYTES, huge_page_bytes, huge_page_tensor, huge_pages_available, kv_cache_tensor

needs_thp = pytest.mark.skipif(not huge_pages_available(), reason="no transparent huge pages on this machine")


def test_a_huge_page_tensor_is_zeroed_and_starts_on_a_huge_page() -> None:
    t = huge_page_tensor(3 * HUGE_PAGE_BYTES + 5)
    assert t.dtype == torch.uint8 and t.numel() == 3 * HUGE_PAGE_BYTES + 5
    assert int(t.sum()) == 0
    assert t.data_ptr() % HUGE_PAGE_BYTES == 0


def test_its_mapping_lives_as_long_as_a_view_of_it() -> None:
    t = huge_page_tensor(HUGE_PAGE_BYTES)
    view = t[64:128].view(torch.float32)
    del t
    gc.collect()
    view.fill_(2.5)  # a freed mapping would fault here
    assert torch.equal(view, torch.full((16,), 2.5))


@needs_thp
def test_touched_memory_sits_in_huge_pages() -> None:
    t = huge_page_tensor(8 * HUGE_PAGE_BYTES)
    t.fill_(1)
    # the kernel may be short of free 2 MB frames on a fragmented machine: at least one is asked for and given
    assert huge_page_bytes(t) >= HUGE_PAGE_BYTES


def test_huge_pages_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CINQ_HUGE_PAGES", "0")
    assert not huge_pages_available()
    cache = kv_cache_tensor((2, 3, 4, 1, 8), torch.bfloat16, "cpu")
    assert cache.shape == (2, 3, 4, 1, 8) and cache.dtype == torch.bfloat16 and not cache.any()


def test_without_the_kernel_switch_nothing_asks_for_them(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("CINQ_HUGE_PAGES", raising=False)
    switch = tmp_path / "enabled"
    switch.write_text("always madvise [never]\n")
    monkeypatch.setattr(host_memory, "_THP_SWITCH", str(switch))
    assert not huge_pages_available()
    switch.write_text("always [madvise] never\n")
    assert huge_pages_available()


def test_a_kv_cache_tensor_is_zeroed_with_its_shape_and_dtype() -> None:
    cache = kv_cache_tensor((2, 5, 16, 2, 64), torch.bfloat16, "cpu")
    assert cache.shape == (2, 5, 16, 2, 64) and cache.dtype == torch.bfloat16 and cache.is_contiguous()
    assert not cache.any()
    cache[1, 4, 15, 1, 63] = 3.0  # the last element is writable: the whole shape is mapped
    assert float(cache.sum()) == 3.0
