"""cinq/kernels/triton/kv_write.py (interpreted on CPU: conftest sets TRITON_INTERPRET before the import)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.errors import InvalidParameterError  # noqa: E402
from cinq.kernels.paged import write_kv_index_copy  # noqa: E402
from cinq.kernels.triton import check_device, interpreter_enabled  # noqa: E402
from cinq.kernels.triton.kv_write import write_kv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("cache_dtype,kv_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("num_heads,head_dim", [(2, 64), (3, 80)])
def test_matches_index_copy(cache_dtype: torch.dtype, kv_dtype: torch.dtype, num_heads: int, head_dim: int) -> None:
    g = torch.Generator().manual_seed(head_dim)
    cache = torch.randn(2, 6, 16, num_heads, head_dim, generator=g).to(cache_dtype).to(DEVICE)
    expect = cache.clone()
    key = torch.randn(5, num_heads, head_dim, generator=g).to(kv_dtype).to(DEVICE)
    value = torch.randn(5, num_heads, head_dim, generator=g).to(kv_dtype).to(DEVICE)
    slots = torch.randperm(96, generator=g)[:5].to(DEVICE)
    write_kv(key, value, cache, slots)
    write_kv_index_copy(key, value, expect, slots)
    assert torch.equal(cache, expect)


def test_strided_inputs_and_negative_slots() -> None:
    cache = torch.zeros(2, 2, 4, 2, 16, device=DEVICE)
    qkv = torch.randn(3, 3, 2, 16, device=DEVICE)  # a fused projection: k and v are strided views of it
    key, value = qkv[:, 1], qkv[:, 2]
    write_kv(key, value, cache, torch.tensor([5, -1, 2], device=DEVICE))  # -1: padding token, not stored
    flat = cache.view(2, 8, 2, 16)
    assert torch.equal(flat[0, 5], key[0]) and torch.equal(flat[1, 2], value[2])
    assert int((flat != 0).any(-1).any(-1).sum()) == 4  # slots 5 and 2, keys and values: nothing else


def test_rejects_mismatched_shapes() -> None:
    cache = torch.zeros(2, 2, 4, 2, 16, device=DEVICE)
    with pytest.raises(InvalidParameterError, match="slot_mapping"):
        write_kv(torch.randn(3, 2, 16, device=DEVICE), torch.randn(3, 2, 16, device=DEVICE), cache,
                 torch.tensor([0, 1], device=DEVICE))
    with pytest.raises(InvalidParameterError, match="slot_mapping"):
        write_kv(torch.randn(3, 4, 16, device=DEVICE), torch.randn(3, 4, 16, device=DEVICE), cache,
                 torch.tensor([0, 1, 2], device=DEVICE))


def test_compiled_kernels_refuse_cpu_tensors() -> None:
    with pytest.raises(InvalidParameterError, match="CUDA"):
        check_device(torch.zeros(1), interpreted=False)
    check_device(torch.zeros(1), interpreted=True)
    assert interpreter_enabled() == (not torch.cuda.is_available())
