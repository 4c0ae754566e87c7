"""Draft trees (Medusa's static trees, EAGLE-2's dynamic ones) and their exact verification.

A tree of n nodes is flattened into one verify sequence: row 0 is the root (the last committed token), every
other row a draft token whose parent row is smaller. The target scores all rows in one forward with an
ancestor-only attention mask (``AttentionMetadata.tree_mask``, from ``tree_mask_from_parents``) and depth-based
positions; row i's logits are the target's distribution after the path root -> i.

Verification walks from the root. Greedy requests follow the child whose token is the target's argmax. Sampled
requests use recursive rejection with deterministic drafts (SpecInfer's multi-candidate rule with one-hot q):
at a node, its children (distinct tokens) are tried in order; child c is accepted with probability p(c), where p
is the node's distribution with the tokens of the children already rejected removed and renormalised; when all
are rejected the closing token is drawn from that residual, and at a leaf from the leaf's own distribution. Each
emitted token therefore follows the target's distribution exactly, as chain verification does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import tree_mask_from_parents

__all__ = ["TreeResult", "TreeShape", "tree_mask_from_parents", "verify_tree"]


@dataclass(slots=True)
class TreeShape:
    """A static tree as Medusa writes it: each path is a node, its entries the rank of the candidate taken at
    each depth ((0,) = the top-1 token of the first draft position, (0, 1) = the second-best after it, ...).
    Every path's prefix must be a path too."""

    paths: list[tuple[int, ...]]

    def __post_init__(self) -> None:
        self.paths = sorted({tuple(p) for p in self.paths}, key=lambda p: (len(p), p))
        known = set(self.paths) | {()}
        for p in self.paths:
            if not p or p[:-1] not in known or any((not isinstance(r, int)) or r < 0 for r in p):
                raise InvalidParameterError(f"speculative_config.tree: path {list(p)} needs its parent path "
                                            f"{list(p[:-1])} and non-negative ranks", "tree")

    @classmethod
    def chain(cls, depth: int) -> TreeShape:
        return cls([(0,) * d for d in range(1, depth + 1)])

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def max_rank(self) -> int:
        return max((r for p in self.paths for r in p), default=0) + 1

    def parents(self) -> list[int]:
        """Row of each node's parent in the flattened tree (row 0 = root, parent -1)."""
        row = {(): 0}
        out = [-1]
        for i, p in enumerate(self.paths, start=1):
            row[p] = i
            out.append(row[p[:-1]])
        return out


@dataclass(slots=True)
class TreeResult:
    """Per request: the emitted tokens and the tree rows of the accepted drafts (root excluded), in order."""

    token_ids: list[list[int]]
    accepted_rows: list[list[int]]


def verify_tree(probs: torch.Tensor, tokens: list[list[int]], parents: list[list[int]], greedy: list[bool],
                generators: dict[int, torch.Generator] | None = None,
                generator: torch.Generator | None = None) -> TreeResult:
    """Verify each request's tree. ``probs``: [sum n_i, V], request i's n_i rows in its tree order (the target's
    processed distribution after each node); ``tokens[i][r]``: the draft token of row r (row 0 unused);
    ``parents[i]``: its parent array. Uniforms are float64, from the request's own generator when it has one."""
    generators = generators or {}
    out_tokens, out_rows = [], []
    at = 0
    for i, (toks, par) in enumerate(zip(tokens, parents)):
        n = len(par)
        children: list[list[int]] = [[] for _ in range(n)]
        for r in range(1, n):
            children[par[r]].append(r)
        rows = probs[at:at + n]
        at += n
        gen = generators.get(i, generator)
        node, emitted, accepted = 0, [], []
        while True:
            p = rows[node].double()
            kids = children[node]
            if greedy[i]:
                best = int(p.argmax())
                nxt = next((c for c in kids if toks[c] == best), None)
                if nxt is None:
                    emitted.append(best)
                    break
            else:
                nxt = None
                u = torch.rand(len(kids), dtype=torch.float64, generator=gen, device=p.device).tolist() if kids else []
                for c, uc in zip(kids, u):
                    t = toks[c]
                    total = float(p.sum())
                    if 0 <= t < p.numel() and total > 0 and uc * total < float(p[t]):
                        nxt = c
                        break
                    if 0 <= t < p.numel():
                        p = p.clone()
                        p[t] = 0.0  # one-hot q: the residual max(0, p - q) drops the rejected token
                if nxt is None:
                    if float(p.sum()) <= 0:  # every token was a rejected draft: nothing else could be drawn
                        p = rows[node].double()
                    emitted.append(int(torch.multinomial(p / p.sum(), 1, generator=gen)))
                    break
            emitted.append(toks[nxt])
            accepted.append(nxt)
            node = nxt
        out_tokens.append(emitted)
        out_rows.append(accepted)
    return TreeResult(out_tokens, out_rows)
