"""EAGLE tree drafting: a static tree (``speculative_token_tree``) or EAGLE-2's dynamic tree (``tree_topk``,
``tree_depth``), one batched head step per tree level for every speculating request.

A level step runs the head over the request's tree so far as one decode-like sequence: row 0 is the root (the
verify's known token at position p0 - 1 of the head, fed the target's true feature there: it rewrites the same
K/V the catch-up wrote), row i a node, fed its parent's head output; rows attend to the committed context and
their ancestors (``AttentionMetadata.tree_mask``; per request for dynamic trees), at positions by depth and at
the slots the scheduler reserved for the verify. The head's K/V written there is scratch: the next step's
catch-up rewrites the committed positions with true features.

EAGLE-2 (Li et al. 2024b): the tree grows from the root by the draft's own confidence. Each level expands the
``topk`` best nodes found so far at that depth (scores: the sum of the draft's log-probabilities along the path)
into their ``topk`` best children; after ``depth`` levels the ``n`` best nodes of everything generated form the
tree (a path's score never rises, so a node's ancestors always rank before it; ties go to the shallower node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cinq.kernels.metadata import depths
from cinq.spec.tree import TreeShape


@dataclass(slots=True)
class TreeRoots:
    """Per speculating request, what the head's catch-up left at its last committed position."""

    ids: list[str]
    root_token: dict[str, int]  # the verify's known token (the root's input token)
    root_in: torch.Tensor  # [n, H] the target's feature fed to the root row
    root_out: torch.Tensor  # [n, H] the head's output feature there
    root_logprobs: torch.Tensor  # [n, V] the draft's log-probabilities of the first draft
    # column j of every log-probability row is target token draft_ids[j] (an EAGLE-3 head's draft vocabulary:
    # ranking its 8k columns, not 49k widened with -inf, SmolLM2's ~2 ms per tree step); None: column j is token j
    draft_ids: torch.Tensor | None = None

    def tokens(self, columns: torch.Tensor) -> list:
        """The target tokens of log-probability ``columns`` (any shape), as nested lists."""
        return (columns if self.draft_ids is None else self.draft_ids[columns]).tolist()


# (tokens per request incl. the root, parents per request, input feature per row) -> (out features, logprobs),
# each [n, q, ...] in ``TreeRoots.ids`` order
LevelStep = Callable[[dict[str, list[int]], dict[str, list[int]], dict[str, list[torch.Tensor]]],
                     tuple[torch.Tensor, torch.Tensor]]


def static_tree(roots: TreeRoots, shape: TreeShape, level: LevelStep) -> tuple[dict[str, list[int]], list[int]]:
    """Drafts of every request for ``shape``: the node at path (r_1, ..., r_d) holds the r_d-th best token after
    its parent. Returns (drafts per request in the tree's row order, without the root; the shared parents)."""
    parents = shape.parents()
    depth_of = depths(parents)
    tokens = {r: [roots.root_token[r]] + [-1] * len(shape.paths) for r in roots.ids}
    out_feat = {r: [roots.root_out[i]] + [None] * len(shape.paths) for i, r in enumerate(roots.ids)}
    top = roots.tokens(roots.root_logprobs.topk(shape.max_rank, dim=-1).indices)
    for i, r in enumerate(roots.ids):
        for node, p in enumerate(shape.paths, start=1):
            if len(p) == 1:
                tokens[r][node] = top[i][p[-1]]
    for d in range(1, shape.depth):
        m = 1 + sum(1 for x in depth_of[1:] if x <= d)  # the root and the nodes of depth <= d: a prefix
        feats = {r: [roots.root_in[i]] + [out_feat[r][parents[j]] for j in range(1, m)]
                 for i, r in enumerate(roots.ids)}
        f, logprobs = level({r: tokens[r][:m] for r in roots.ids}, {r: parents[:m] for r in roots.ids}, feats)
        expand = [j for j in range(1, m) if depth_of[j] == d]
        ranks = roots.tokens(logprobs[:, expand].topk(shape.max_rank, dim=-1).indices)  # [n, len(expand), rank]
        for i, r in enumerate(roots.ids):
            for e, j in enumerate(expand):
                out_feat[r][j] = f[i, j]
                for child, p in enumerate(shape.paths, start=1):
                    if parents[child] == j:
                        tokens[r][child] = ranks[i][e][p[-1]]
    return {r: tokens[r][1:] for r in roots.ids}, parents


@dataclass(slots=True)
class _Node:
    score: float
    depth: int
    parent: int  # index in the pool
    token: int


def dynamic_tree(roots: TreeRoots, topk: int, max_depth: int, n: int, level: LevelStep
                 ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """EAGLE-2 trees of ``n`` drafts per request. Returns (drafts per request in row order, parents per request
    over [root] + drafts)."""
    pools: dict[str, list[_Node]] = {r: [_Node(0.0, 0, -1, roots.root_token[r])] for r in roots.ids}
    vals, idx = roots.root_logprobs.topk(topk, dim=-1)
    frontier: dict[str, list[int]] = {}
    for i, r in enumerate(roots.ids):
        pool = pools[r]
        frontier[r] = []
        for v, t in zip(vals[i].tolist(), roots.tokens(idx[i])):
            pool.append(_Node(v, 1, 0, t))
            frontier[r].append(len(pool) - 1)
    # the rows a level step runs: the root and every node expanded so far (the frontiers), in creation order
    expanded = {r: [0] + frontier[r] for r in roots.ids}
    out_feat = {r: {0: roots.root_out[i]} for i, r in enumerate(roots.ids)}
    for d in range(1, max_depth):
        rows = {r: expanded[r] for r in roots.ids}
        pos_in = {r: {node: j for j, node in enumerate(rows[r])} for r in roots.ids}
        tokens = {r: [pools[r][node].token for node in rows[r]] for r in roots.ids}
        parents = {r: [-1] + [pos_in[r][pools[r][node].parent] for node in rows[r][1:]] for r in roots.ids}
        feats = {r: [roots.root_in[i]] + [out_feat[r][pools[r][node].parent] for node in rows[r][1:]]
                 for i, r in enumerate(roots.ids)}
        f, logprobs = level(tokens, parents, feats)
        for i, r in enumerate(roots.ids):
            pool, cands = pools[r], []
            front_rows = [pos_in[r][node] for node in frontier[r]]
            v, t = logprobs[i, front_rows].topk(topk, dim=-1)
            for node, j, vs, ts in zip(frontier[r], front_rows, v.tolist(), roots.tokens(t)):
                out_feat[r][node] = f[i, j]
                for score, tok in zip(vs, ts):
                    pool.append(_Node(pool[node].score + score, d + 1, node, tok))
                    cands.append(len(pool) - 1)
            frontier[r] = sorted(cands, key=lambda c: -pool[c].score)[:topk]
            expanded[r] = expanded[r] + frontier[r]
    drafts, parents_out = {}, {}
    for r in roots.ids:
        pool = pools[r]
        best = sorted(range(1, len(pool)), key=lambda c: (-pool[c].score, pool[c].depth, c))[:n]
        order = sorted(best, key=lambda c: (pool[c].depth, c))  # parents before children
        row = {0: 0, **{c: j for j, c in enumerate(order, start=1)}}
        drafts[r] = [pool[c].token for c in order]
        parents_out[r] = [-1] + [row[pool[c].parent] for c in order]
    return drafts, parents_out
