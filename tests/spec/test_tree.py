"""Tree shapes and exact tree verification.

Distribution test: a toy target over V = 5 tokens scores a branching tree (root -> tokens 0 and 1, token 0 ->
token 2). The emitted sequence (x1, x2, x3 when the walk gets that far) must follow the target's autoregressive
distribution. There are M = 17 possible sequences; by the Bretagnolle-Huber-Carol inequality,
P(||p_hat - p||_1 >= eps) <= 2^M exp(-N eps^2 / 2), so at delta = 1e-6, TV = eps / 2 <= sqrt((M ln 2 +
ln(1/delta)) / (2 N)). Sampling the closing token from p instead of the residual (rejected children not removed)
is shown to break that bound.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import depths
from cinq.spec.tree import TreeResult, TreeShape, tree_mask_from_parents, verify_tree

V, N = 5, 30000
PARENTS = [-1, 0, 0, 1]  # row 1: token 0, row 2: token 1 (both children of the root), row 3: token 2 under row 1
TOKENS = [-1, 0, 1, 2]


def toy() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.softmax(torch.randn(4, V, generator=g, dtype=torch.float64) * 1.2, -1)


def analytic(p: torch.Tensor) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for x1 in range(V):
        if x1 == 0:  # row 1 accepted: its child (token 2, row 3) may follow
            for x2 in range(V):
                if x2 == 2:
                    for x3 in range(V):
                        out[(0, 2, x3)] = float(p[0, 0] * p[1, 2] * p[3, x3])
                else:
                    out[(0, x2)] = float(p[0, 0] * p[1, x2])
        elif x1 == 1:  # row 2, a leaf
            for x2 in range(V):
                out[(1, x2)] = float(p[0, 1] * p[2, x2])
        else:
            out[(x1,)] = float(p[0, x1])
    return out


def tv_bound(n: int, m: int) -> float:
    return math.sqrt((m * math.log(2) + math.log(1e6)) / (2 * n))


def empirical_tv(p: torch.Tensor, verify=verify_tree) -> float:
    probs = p.repeat(N, 1)
    result = verify(probs, [TOKENS] * N, [PARENTS] * N, [False] * N, generator=torch.Generator().manual_seed(0))
    counts = Counter(tuple(t) for t in result.token_ids)
    target = analytic(p)
    return 0.5 * sum(abs(counts.get(s, 0) / N - target.get(s, 0.0)) for s in set(target) | set(counts))


def test_emitted_sequences_follow_the_target() -> None:
    p = toy()
    assert abs(sum(analytic(p).values()) - 1) < 1e-12
    assert empirical_tv(p) <= tv_bound(N, len(analytic(p)))


def test_a_wrong_residual_breaks_the_bound() -> None:
    p = toy()

    def verify_without_residual(probs, tokens, parents, greedy, generators=None, generator=None):
        # the broken variant: every rejection test sees the node's full distribution (rejected children kept)
        out_t, out_r = [], []
        for i in range(len(tokens)):
            node, emitted, acc = 0, [], []
            while True:
                row = probs[4 * i + node]
                kids = [r for r in range(1, 4) if parents[i][r] == node]
                nxt = next((c for c, u in zip(kids, torch.rand(len(kids), dtype=torch.float64, generator=generator))
                            if u < row[tokens[i][c]]), None)
                if nxt is None:
                    emitted.append(int(torch.multinomial(row, 1, generator=generator)))
                    break
                emitted.append(tokens[i][nxt])
                acc.append(nxt)
                node = nxt
            out_t.append(emitted)
            out_r.append(acc)
        return TreeResult(out_t, out_r)

    assert empirical_tv(p, verify_without_residual) > tv_bound(N, len(analytic(p)))


def test_greedy_follows_the_argmax_child_and_closes_with_argmax() -> None:
    p = torch.full((4, V), 0.01, dtype=torch.float64)
    p[0, 0] = p[1, 2] = p[3, 4] = 1.0  # root -> 0 (row 1) -> 2 (row 3) -> closes with 4
    r = verify_tree(p, [TOKENS], [PARENTS], [True])
    assert r.token_ids == [[0, 2, 4]] and r.accepted_rows == [[1, 3]]
    p[0] = 0.01
    p[0, 3] = 1.0  # no child holds 3: nothing accepted
    r = verify_tree(p, [TOKENS], [PARENTS], [True])
    assert r.token_ids == [[3]] and r.accepted_rows == [[]]


def test_seeded_requests_repeat() -> None:
    p = toy().repeat(3, 1)
    runs = [verify_tree(p, [TOKENS] * 3, [PARENTS] * 3, [False] * 3,
                        generators={1: torch.Generator().manual_seed(9)},
                        generator=torch.Generator().manual_seed(s)).token_ids[1] for s in (0, 1)]
    assert runs[0] == runs[1]


def test_tree_shapes_flatten_with_parents_before_children() -> None:
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    parents = shape.parents()
    assert parents == [-1, 0, 0, 1, 1, 2, 3]
    assert depths(parents) == [0, 1, 1, 2, 2, 2, 3]
    assert shape.depth == 3 and shape.max_rank == 2
    mask = tree_mask_from_parents(parents)
    assert mask[6].tolist() == [True, True, False, True, False, False, True]
    assert not mask.triu(1).any()
    assert TreeShape.chain(3).parents() == [-1, 0, 1, 2]


def test_a_path_without_its_parent_is_refused() -> None:
    with pytest.raises(InvalidParameterError) as e:
        TreeShape([(0,), (1, 0)])
    assert e.value.param == "tree"
