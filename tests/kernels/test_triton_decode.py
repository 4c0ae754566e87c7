"""cinq/kernels/triton/decode.py against the float64 reference (interpreted on CPU, tiny shapes)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.kernels.reference import paged_attention_reference  # noqa: E402
from cinq.kernels.triton.decode import choose_num_splits, paged_decode  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80), (8, 1, 128), (32, 1, 64)])
def test_matches_reference_with_and_without_split_k(num_splits: int, dtype: torch.dtype, hq: int, hkv: int,
                                                     d: int, paged_case, rel_err) -> None:
    # one long context and short ones: with splits, the short sequences' later splits hold no key at all
    case = paged_case([1, 1, 1, 1], [70, 1, 17, 33], hq, hkv, d, dtype, seed=num_splits + d, device=DEVICE)
    out = torch.full_like(case.query, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, out, num_splits=num_splits)
    ref, _ = paged_attention_reference(case.query.cpu(), case.kv_cache.cpu(), case.meta, case.scale)
    assert rel_err(out.cpu(), ref) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 80)])
def test_multi_row_decode_matches_reference(num_splits: int, hq: int, hkv: int, d: int, paged_case,
                                            rel_err) -> None:
    # three rows per sequence (verifying a 2-token draft): causal among them; with splits, a row's last split
    # may hold no key it may see (seq_len 3: the rows are the whole context)
    case = paged_case([3, 3, 3], [70, 3, 33], hq, hkv, d, seed=num_splits + d, device=DEVICE, decode_query_len=3)
    out = torch.full_like(case.query, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, out, num_splits=num_splits)
    ref, _ = paged_attention_reference(case.query.cpu(), case.kv_cache.cpu(), case.meta, case.scale)
    assert rel_err(out.cpu(), ref) <= 1e-5


def test_only_the_decode_rows_are_written(paged_case) -> None:
    case = paged_case([1, 1, 5], [3, 20, 5], 4, 2, 64, seed=1, device=DEVICE)
    out = torch.full_like(case.query, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, out)
    assert not torch.isnan(out[:2]).any() and torch.isnan(out[2:]).all()


def test_split_count_is_one_off_gpu() -> None:
    assert choose_num_splits(1, 1, 100_000, torch.device("cpu")) == 1


@pytest.mark.parametrize("num_splits", [1, 3])
def test_tree_decode_matches_reference(num_splits: int, paged_case, rel_err) -> None:
    # tree verification: row r sees the context and its ancestors only; with splits, a row's later splits may
    # hold only tree keys it must not see (seq_len 6: the tree is the whole context)
    from cinq.kernels.metadata import tree_mask_from_parents

    tree = tree_mask_from_parents([-1, 0, 0, 1, 2, 2]).to(DEVICE)
    case = paged_case([6, 6, 6], [70, 6, 33], 8, 2, 32, seed=num_splits, device=DEVICE, decode_query_len=6,
                      tree_mask=tree)
    out = torch.full_like(case.query, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, out, num_splits=num_splits)
    ref, _ = paged_attention_reference(case.query.cpu(), case.kv_cache.cpu(), case.meta, case.scale)
    assert rel_err(out.cpu(), ref) <= 1e-5
    # a causal tree mask is no mask at all
    case.meta.tree_mask = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()
    causal = torch.full_like(out, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, causal, num_splits=num_splits)
    case.meta.tree_mask = None
    plain = torch.full_like(out, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, plain, num_splits=num_splits)
    # equal up to rounding: compiled, the tree and plain variants are separate kernels (the interpreter: bit equal)
    assert rel_err(causal.cpu(), plain.cpu()) <= 1e-6 and rel_err(plain.cpu(), ref) > 1e-2


@pytest.mark.parametrize("num_splits", [1, 3])
def test_per_sequence_tree_decode_matches_reference(num_splits: int, paged_case, rel_err) -> None:
    # one tree per sequence ([3, 6, 6]): each program must read its own sequence's slice
    from cinq.kernels.metadata import tree_mask_from_parents, tree_masks_from_parents

    trees = [[-1, 0, 0, 1, 2, 2], [-1, 0, 1, 1, 0, 4], [-1, 0, 0, 0, 0, 0]]
    masks = tree_masks_from_parents(trees, DEVICE)
    case = paged_case([6, 6, 6], [70, 6, 33], 8, 2, 32, seed=num_splits, device=DEVICE, decode_query_len=6,
                      tree_mask=masks)
    out = torch.full_like(case.query, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, out, num_splits=num_splits)
    ref, _ = paged_attention_reference(case.query.cpu(), case.kv_cache.cpu(), case.meta, case.scale)
    assert rel_err(out.cpu(), ref) <= 1e-5
    # the first sequence's tree for all: right for it, wrong for the others
    case.meta.tree_mask = masks[0]
    first = torch.full_like(out, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, first, num_splits=num_splits)
    assert torch.equal(first[:6], out[:6]) and rel_err(first[6:].cpu(), ref[6:]) > 1e-2
    # identical slices are the shared form, bit for bit
    case.meta.tree_mask = tree_mask_from_parents(trees[1], DEVICE)[None].expand(3, 6, 6)  # not contiguous either
    same = torch.full_like(out, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, same, num_splits=num_splits)
    case.meta.tree_mask = tree_mask_from_parents(trees[1], DEVICE)
    shared = torch.full_like(out, float("nan"))
    paged_decode(case.query, case.kv_cache, case.meta, case.scale, shared, num_splits=num_splits)
    assert torch.equal(same, shared)
