"""EAGLE tree drafting (cinq/spec/eagle_tree.py): ranking a head's draft-vocabulary columns (``TreeRoots.draft_ids``)
builds the same trees as ranking the target's whole vocabulary with -inf outside the draft vocabulary (what the
proposer did before), for a static and a dynamic tree."""

from __future__ import annotations

import zlib

import pytest
import torch

from cinq.spec.eagle_tree import TreeRoots, dynamic_tree, static_tree
from cinq.spec.tree import TreeShape

VOCAB = 60
DRAFT_IDS = torch.tensor(sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:16].tolist()))
IDS = ["a", "b"]


def narrow_logprobs(*key: object) -> torch.Tensor:
    """Seeded log-probabilities over the draft vocabulary for one row, a function of its path (ties impossible)."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return torch.randn(len(DRAFT_IDS), generator=gen, dtype=torch.float64).log_softmax(-1)


def widen(lp: torch.Tensor) -> torch.Tensor:
    out = torch.full((*lp.shape[:-1], VOCAB), float("-inf"), dtype=lp.dtype)
    out[..., DRAFT_IDS] = lp
    return out


def build(kind: str, narrow: bool) -> tuple[dict[str, list[int]], object]:
    def rows(lp: torch.Tensor) -> torch.Tensor:
        return lp if narrow else widen(lp)

    def level(tokens, parents, feats):  # noqa: ANN001, ANN202
        q = len(tokens[IDS[0]])
        lp = torch.stack([torch.stack([narrow_logprobs(r, tuple(tokens[r][:j + 1]), tuple(parents[r][:j + 1]))
                                       for j in range(q)]) for r in IDS])
        return torch.zeros(len(IDS), q, 4), rows(lp)

    roots = TreeRoots(IDS, {"a": 3, "b": 7}, torch.zeros(2, 4), torch.zeros(2, 4),
                      rows(torch.stack([narrow_logprobs(r, "root") for r in IDS])),
                      DRAFT_IDS if narrow else None)
    if kind == "static":
        return static_tree(roots, TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), level)
    return dynamic_tree(roots, 2, 3, 6, level)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_draft_vocabulary_columns_build_the_trees_of_the_widened_rows(kind: str) -> None:
    drafts, parents = build(kind, narrow=True)
    assert (drafts, parents) == build(kind, narrow=False)
    assert all(t in set(DRAFT_IDS.tolist()) for d in drafts.values() for t in d)  # target ids, not columns
