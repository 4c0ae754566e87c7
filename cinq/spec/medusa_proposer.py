"""Medusa proposer: K heads on the target's final hidden state at the last committed position guess the tokens
2..K+1 ahead (the target's own sample is the next one). No KV of its own: one batched head forward per step.

Medusa's heads draft independently of each other's guesses; with greedy drafting (top-1 of each head) that is
one chain, verified like any other; with ``speculative_token_tree`` the top candidates of each head form a static
tree, verified in one forward with an ancestor mask. Drafts sampled from a head's distribution are independent
of the previous draft, which the rejection rule allows (q_j is whatever distribution the draft was drawn from).
"""

from __future__ import annotations

import torch

from cinq.spec.medusa import MedusaHeads
from cinq.spec.proposer import DraftSampling, Proposals, StepView, draw_drafts
from cinq.spec.tree import TreeShape
from cinq.step.scheduler_output import ScheduledSeq


class MedusaProposer:
    """Drafts with ``heads`` (``method: medusa``)."""

    layer_state_ids: tuple[int, ...] = ()

    def __init__(self, heads: MedusaHeads, probabilistic: bool, generator: torch.Generator,
                 tree: TreeShape | None = None) -> None:
        self.heads = heads
        self.tree = tree
        self.tree_parents = tree.parents() if tree is not None else []
        self.probabilistic = probabilistic
        self.generator = generator
        self.last_hidden: dict[str, torch.Tensor] = {}  # request -> the target's hidden at its last committed position

    def kv_bytes_per_block(self, block_size: int) -> int:
        return 0

    def initialize_cache(self, num_blocks: int, block_size: int, pad_block_ids: list[int]) -> None:
        return None

    def forget(self, request_id: str) -> None:
        self.last_hidden.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, seqs: list[ScheduledSeq], history: dict[str, list[int]],
                sampling: dict[str, DraftSampling]) -> Proposals:
        want = [s for s in seqs if s.num_draft_slots]
        out = Proposals()
        have = [s for s in want if s.request_id in self.last_hidden]
        if self.tree is not None:
            trees = [s for s in have if s.num_draft_slots == len(self.tree.paths)]
            self._propose_trees(trees, out)
            have = [s for s in have if s not in trees]
        if have:
            # a chain cut short of the tree by the step's token budget may ask for more drafts than there are heads:
            # the last head's guess repeats (a poor guess, still verified exactly)
            k = min(max(s.num_draft_slots for s in have), self.heads.num_heads)
            hidden = torch.stack([self.last_hidden[s.request_id] for s in have])
            logits = torch.stack([self.heads.head_logits(hidden, i) for i in range(k)], dim=1)  # [n, k, V]
            n = len(have)
            tokens, q = draw_drafts(logits.reshape(n * k, -1), [sampling[s.request_id] for s in have for _ in range(k)],
                                    self.probabilistic, self.generator)
            for i, s in enumerate(have):
                m = s.num_draft_slots
                drafts = tokens[i * k:i * k + min(m, k)]
                out.token_ids[s.request_id] = drafts + drafts[-1:] * (m - len(drafts))
                if q is not None:  # a repeated guess is deterministic: one-hot q there
                    rows = q[i * k:i * k + min(m, k)]
                    # long even when empty (m <= k, the usual case): an empty float tensor fails one_hot
                    repeats = torch.tensor(drafts[-1:] * (m - len(drafts)), dtype=torch.long, device=rows.device)
                    extra = torch.nn.functional.one_hot(repeats, rows.shape[-1]).to(rows)
                    out.probs[s.request_id] = torch.cat([rows, extra])
        for s in want:  # no hidden state kept yet (cannot happen after a prefill; guards a bug, stays exact)
            out.token_ids.setdefault(s.request_id, [history[s.request_id][-1]] * s.num_draft_slots)
        return out

    def _propose_trees(self, seqs: list[ScheduledSeq], out: Proposals) -> None:
        """Static-tree drafts: the node at path (r_1, ..., r_d) holds head d's r_d-th best token (Medusa's heads
        guess each position independently of the tokens before it)."""
        if not seqs:
            return
        assert self.tree is not None
        hidden = torch.stack([self.last_hidden[s.request_id] for s in seqs])
        top = torch.stack([self.heads.head_logits(hidden, d).topk(self.tree.max_rank, dim=-1).indices
                           for d in range(self.tree.depth)], dim=1).tolist()  # [n, depth, max_rank]
        for s, ranks in zip(seqs, top):
            out.token_ids[s.request_id] = [ranks[len(p) - 1][p[-1]] for p in self.tree.paths]
            out.parents[s.request_id] = self.tree_parents

    def commit(self, view: StepView) -> None:
        """Keep each request's hidden state at its last position the target kept."""
        for i, s in enumerate(view.batch.seqs):
            if s.num_logit_rows:  # a chunk that reached the request's last token: its next token was sampled
                self.last_hidden[s.request_id] = view.hidden[view.committed_rows(i)[-1]]
