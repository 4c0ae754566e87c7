"""Tree attention (``AttentionMetadata.tree_mask``) in every backend's decode path, against a float64 dense
reference built by explicit masking from the parent arrays (independent of every kernel and of the mask helper).

A tree-verification step: the q new rows of each decode-like sequence are a flattened candidate tree; row i sees
the cached context and its ancestors (and itself), never its siblings or cousins. The tree is one [q, q] mask
shared by the step's sequences, or (EAGLE-2 dynamic trees) one per sequence, [num_decodes, q, q].
"""

from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels import sdpa
from cinq.kernels.backends import available_backends, get_backend
from cinq.kernels.cpu_native import native_module, paged_decode_native
from cinq.kernels.flash import flash_attention_paged
from cinq.kernels.metadata import AttentionMetadata, tree_mask_from_parents, tree_masks_from_parents
from cinq.kernels.paged import context_slots

CPU_BACKENDS = ["sdpa", "sdpa-fallback", "flash-torch", "reference"]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
HEADS = [(4, 4, 32), (8, 2, 80), (8, 1, 64)]  # GQA ratios 1, 4, 8
BRANCHING = [-1, 0, 0, 1, 1, 2, 0, 3]  # root with three children, two grandchildren under row 1, ...


def random_parents(q: int, seed: int) -> list[int]:
    """A random tree of q rows: the parent of row i is any earlier row."""
    g = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, q)]


def ancestors(parents: list[int], i: int) -> set[int]:
    """Row i and every row on its path to the root."""
    seen = set()
    while i >= 0:
        seen.add(i)
        i = parents[i]
    return seen


def dense_tree_reference(case, parents: list[int] | list[list[int]] | None,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    """float64 [T, Hq, D]: every sequence's rows over its K/V read slot by slot; decode-like rows see the context
    and their tree ancestors (from ``parents``: one array for all, or one per decode-like sequence; or ``mask``
    [q, q] when given), other rows are causal."""
    meta, q_all = case.meta, case.query.double().cpu()
    _, nb, bs, hkv, d = case.kv_cache.shape
    flat = case.kv_cache.double().cpu().view(2, nb * bs, hkv, d)
    out = torch.empty_like(q_all)
    starts = meta.query_start_loc.tolist()
    for s in range(meta.num_seqs):
        a, b, seq_len = starts[s], starts[s + 1], meta.seq_lens_cpu[s]
        ql = b - a
        slots = context_slots(meta.block_tables[s].cpu(), seq_len, bs)
        group = q_all.shape[1] // hkv
        k = flat[0, slots].repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = flat[1, slots].repeat_interleave(group, dim=1)
        visible = torch.zeros(ql, seq_len, dtype=torch.bool)
        for i in range(ql):
            first = seq_len - ql
            visible[i, :first] = True
            if s < meta.num_decodes and (parents is not None or mask is not None):
                if mask is None:
                    rows = ancestors(parents[s] if isinstance(parents[0], list) else parents, i)
                else:
                    rows = set(torch.nonzero(mask[i].cpu()).flatten().tolist())
                for j in rows:
                    visible[i, first + j] = True
            else:
                visible[i, first:first + i + 1] = True
        scores = torch.einsum("qhd,khd->hqk", q_all[a:b], k) * case.scale
        scores = scores.masked_fill(~visible, float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def run_backend(name: str, case, monkeypatch) -> torch.Tensor:
    out = torch.full_like(case.query, float("nan"))  # an element the backend forgets to write stays NaN
    if name == "sdpa-fallback":  # the SDPA decode path, as where the native kernel cannot be built
        monkeypatch.setattr(sdpa, "paged_decode_native", lambda *a: None)
        case.kv_cache = torch.nan_to_num(case.kv_cache)  # the padded gather reads (masked) padding
        name = "sdpa"
    return get_backend(name).forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale,
                                     out=out)


def tree_case(paged_case, parents: list[int], hq: int, hkv: int, d: int, dtype=torch.float32, seed: int = 0,
              mask: torch.Tensor | None = None, device: str = "cpu"):
    """Three tree-verifying sequences (one whose context is just the tree), then a prefill chunk and a prompt."""
    q = len(parents)
    mask = tree_mask_from_parents(parents) if mask is None else mask
    return paged_case([q, q, q, 5, 7], [q + 40, q, q + 13, 30, 7], hq, hkv, d, dtype, seed=seed, device=device,
                      decode_query_len=q, tree_mask=mask.to(device))


def per_seq_case(paged_case, parents_per_seq: list[list[int]], hq: int, hkv: int, d: int, dtype=torch.float32,
                 seed: int = 0, device: str = "cpu"):
    """``tree_case`` with one tree per tree-verifying sequence: a [3, q, q] mask."""
    assert len(parents_per_seq) == 3
    return tree_case(paged_case, parents_per_seq[0], hq, hkv, d, dtype, seed, tree_masks_from_parents(parents_per_seq),
                     device)


def distinct_random_trees(q: int, seed: int) -> list[list[int]]:
    """Three random trees of q rows, pairwise different (so that a kernel mixing them up fails)."""
    trees = [random_parents(q, seed + k) for k in range(3)]
    assert len({tuple(t) for t in trees}) == 3, trees
    return trees


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", HEADS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_random_trees_match_the_dense_reference(backend: str, hq: int, hkv: int, d: int, dtype: torch.dtype,
                                                paged_case, rel_err, monkeypatch) -> None:
    for seed, q in ((hq + d, 6), (hq * d, 9)):
        parents = random_parents(q, seed)
        case = tree_case(paged_case, parents, hq, hkv, d, dtype, seed=seed)
        ref = dense_tree_reference(case, parents)
        assert rel_err(run_backend(backend, case, monkeypatch), ref) <= TOL[dtype], parents


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", HEADS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_per_sequence_random_trees_match_the_dense_reference(backend: str, hq: int, hkv: int, d: int,
                                                             dtype: torch.dtype, paged_case, rel_err,
                                                             monkeypatch) -> None:
    for seed, q in ((hq + d, 6), (hq * d, 9)):
        trees = distinct_random_trees(q, seed)
        case = per_seq_case(paged_case, trees, hq, hkv, d, dtype, seed=seed)
        assert case.meta.tree_mask.shape == (3, q, q)
        ref = dense_tree_reference(case, trees)
        assert rel_err(run_backend(backend, case, monkeypatch), ref) <= TOL[dtype], trees


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_identical_per_sequence_slices_equal_the_shared_mask(backend: str, paged_case, monkeypatch) -> None:
    parents = random_parents(7, seed=4)
    shared = tree_case(paged_case, parents, 8, 2, 64, torch.bfloat16, seed=4)
    per_seq = tree_case(paged_case, parents, 8, 2, 64, torch.bfloat16, seed=4,
                        mask=tree_masks_from_parents([parents] * 3))
    assert shared.meta.tree_mask.dim() == 2 and per_seq.meta.tree_mask.dim() == 3
    assert torch.equal(run_backend(backend, shared, monkeypatch), run_backend(backend, per_seq, monkeypatch))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_sequence_zeros_tree_for_every_sequence_is_wrong(backend: str, paged_case, rel_err, monkeypatch) -> None:
    # the tolerances tell a kernel that reads slice 0 for every sequence (stride 0) from a correct one
    trees = [BRANCHING, random_parents(len(BRANCHING), seed=21), list(range(-1, len(BRANCHING) - 1))]
    case = per_seq_case(paged_case, trees, 8, 2, 32, seed=13)
    ref = dense_tree_reference(case, trees)
    assert rel_err(run_backend(backend, case, monkeypatch), ref) <= 1e-5
    case.meta.tree_mask = case.meta.tree_mask[0]  # the shared form with the first sequence's tree
    wrong = run_backend(backend, case, monkeypatch)
    q = len(BRANCHING)
    assert rel_err(wrong[:q], ref[:q]) <= 1e-5  # sequence 0 is right either way
    for s in (1, 2):
        assert rel_err(wrong[s * q:(s + 1) * q], ref[s * q:(s + 1) * q]) > 1e-2, s


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_any_lower_triangular_mask_is_honoured(backend: str, paged_case, rel_err, monkeypatch) -> None:
    # not a tree: some rows do not see the root (nor key 0 when the context is only the new rows): no NaN
    g = torch.Generator().manual_seed(7)
    mask = (torch.rand(7, 7, generator=g) < 0.4).tril() | torch.eye(7, dtype=torch.bool)
    mask[3, 0] = mask[5, 0] = False
    case = tree_case(paged_case, [-1] * 7, 8, 2, 32, seed=7, mask=mask)
    ref = dense_tree_reference(case, None, mask)
    assert rel_err(run_backend(backend, case, monkeypatch), ref) <= 1e-5


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_causal_tree_mask_changes_nothing(backend: str, paged_case, monkeypatch) -> None:
    q = 5
    causal = torch.ones(q, q, dtype=torch.bool).tril()
    with_mask = tree_case(paged_case, [-1] * q, 8, 2, 32, seed=3, mask=causal)
    plain = tree_case(paged_case, [-1] * q, 8, 2, 32, seed=3, mask=causal)
    plain.meta.tree_mask = None
    a = run_backend(backend, with_mask, monkeypatch)
    b = run_backend(backend, plain, monkeypatch)
    assert torch.equal(a, b)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_ancestor_only_differs_from_causal_on_a_branching_tree(backend: str, paged_case, rel_err,
                                                               monkeypatch) -> None:
    # the tolerances above tell the two apart: a wrong (causal) mask on a branching tree fails them by far
    case = tree_case(paged_case, BRANCHING, 8, 2, 32, seed=11)
    tree_ref = dense_tree_reference(case, BRANCHING)
    causal_ref = dense_tree_reference(case, list(range(-1, len(BRANCHING) - 1)))  # a chain: causal
    out = run_backend(backend, case, monkeypatch)
    assert rel_err(out, tree_ref) <= 1e-5
    assert rel_err(out, causal_ref) > 1e-2
    rows = len(BRANCHING)  # the first sequence's row 0 (the root) and row 1 see the same keys either way
    assert torch.allclose(out[:2].double(), causal_ref[:2], atol=1e-5)
    assert not torch.allclose(out[2:rows].double(), causal_ref[2:rows], atol=1e-2)


def test_flash_torch_tiles_crossing_the_tree(paged_case, rel_err) -> None:
    # tiny tiles: some KV tiles hold context and tree keys together, some query tiles split the tree
    parents = random_parents(11, seed=5)
    case = tree_case(paged_case, parents, 4, 2, 16, seed=5)
    ref = dense_tree_reference(case, parents)
    for block_m, block_n in ((1, 1), (4, 8), (3, 5), (16, 16)):
        out, _ = flash_attention_paged(case.query, case.kv_cache, case.meta, case.scale, block_m=block_m,
                                       block_n=block_n)
        assert rel_err(out, ref) <= 1e-5, (block_m, block_n)


def test_native_kernel_takes_the_mask_itself(paged_case, rel_err) -> None:
    parents = random_parents(8, seed=2)
    case = tree_case(paged_case, parents, 8, 2, 64, torch.bfloat16, seed=2)
    nd, ql = case.meta.num_decodes, case.meta.decode_query_len
    native = paged_decode_native(case.query[:nd * ql], case.kv_cache, case.meta.block_tables, case.meta.seq_lens,
                                 case.scale, ql, case.meta.tree_mask)
    assert native is not None  # this platform builds it (tests/kernels/test_cpu_native.py)
    assert rel_err(native, dense_tree_reference(case, parents)[:nd * ql]) <= 1e-2


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 64), (torch.float32, 32)])  # AVX512-BF16 / generic loop
def test_native_kernel_takes_per_sequence_masks(dtype: torch.dtype, d: int, paged_case, rel_err) -> None:
    trees = distinct_random_trees(8, seed=30)
    case = per_seq_case(paged_case, trees, 8, 2, d, dtype, seed=3)
    nd, ql = case.meta.num_decodes, case.meta.decode_query_len
    args = (case.query[:nd * ql], case.kv_cache, case.meta.block_tables, case.meta.seq_lens, case.scale, ql)
    native = paged_decode_native(*args, case.meta.tree_mask)
    assert native is not None
    assert rel_err(native, dense_tree_reference(case, trees)[:nd * ql]) <= TOL[dtype]
    mod = native_module("paged_decode")
    with pytest.raises(RuntimeError, match="tree_mask"):  # one slice short: refused, not read past its end
        mod.paged_decode(case.query[:nd * ql].float().contiguous(), case.kv_cache, case.meta.block_tables,
                         case.meta.seq_lens, case.scale, ql, case.meta.tree_mask[:nd - 1].contiguous())


@pytest.mark.skipif("triton" not in available_backends(), reason="triton is not installed")
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 32), (8, 2, 80)])
def test_triton_backend_with_a_tree(hq: int, hkv: int, d: int, paged_case, rel_err) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: interpreted (see conftest)
    parents = random_parents(6, seed=d)
    case = tree_case(paged_case, parents, hq, hkv, d, seed=d, device=device)
    out = get_backend("triton").forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(out.cpu(), dense_tree_reference(case, parents)) <= 1e-5


@pytest.mark.skipif("triton" not in available_backends(), reason="triton is not installed")
def test_triton_backend_with_per_sequence_trees(paged_case, rel_err) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trees = distinct_random_trees(6, seed=40)
    case = per_seq_case(paged_case, trees, 8, 2, 32, seed=40, device=device)
    out = get_backend("triton").forward(case.query, case.key, case.value, case.kv_cache, case.meta, case.scale)
    assert rel_err(out.cpu(), dense_tree_reference(case, trees)) <= 1e-5


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("bad", [(3, 3), (1, 2, 2), (3, 2, 2), (2, 3, 3)])
def test_backends_reject_a_tree_mask_that_does_not_fit_the_step(backend: str, bad: tuple[int, ...]) -> None:
    # two decode-like sequences of 2 rows: [2, 2] and [2, 2, 2] fit; another q or sequence count does not
    meta = AttentionMetadata.from_lens([2, 2], [5, 3], [[0, 2], [1]], block_size=4, decode_query_len=2,
                                       tree_mask=torch.ones(2, 2, 2, dtype=torch.bool).tril())
    meta.tree_mask = torch.ones(bad, dtype=torch.bool).tril()  # built by hand for another step
    q, kv = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    with pytest.raises(InvalidParameterError, match="tree_mask") as err:
        get_backend(backend).forward(q, kv, kv, torch.zeros(2, 3, 4, 2, 16), meta, 1.0)
    assert err.value.param == "tree_mask"


@pytest.mark.parametrize("backend", available_backends())
def test_backends_reject_a_tree_mask_that_does_not_fit(backend: str) -> None:
    meta = AttentionMetadata.from_lens([2], [5], [[0, 2]], block_size=4, decode_query_len=2,
                                       tree_mask=torch.ones(2, 2, dtype=torch.bool).tril())
    meta.tree_mask = torch.ones(3, 3, dtype=torch.bool).tril()  # built by hand for another query length
    q, kv = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    with pytest.raises(InvalidParameterError, match="tree_mask") as err:
        get_backend(backend).forward(q, kv, kv, torch.zeros(2, 3, 4, 2, 16), meta, 1.0)
    assert err.value.param == "tree_mask"
