"""EAGLE / EAGLE-3 proposer: the head drafts from the target's features, in the runner, over paged KV.

The head's K/V at position t comes from (x_{t+1}, f_t): the token after t and the target's (fused) feature at t.
After each target step the runner commits the features of the positions the target kept (prefill chunks, plain
decodes, a verify's known token and accepted drafts); they pile up until the request next wants drafts, when
propose first runs the head over them (true features overwrite whatever the head wrote there while drafting),
and the last of those rows, at the last committed position, yields the first draft. A step without drafts
(speculation off) runs no head forward. Each further draft is one batched head step fed the head's own
output feature and its previous draft, at the positions the scheduler reserved for this step's verification.
A prefix-cache hit trusts the head's K/V in the shared blocks; where the request that computed them never caught
the head up over them, that costs acceptance, never exactness.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.model.llama import LlamaForCausalLM
from cinq.spec.draft_vocab import DraftVocab
from cinq.spec.eagle import EagleHead
from cinq.spec.proposer import DraftSampling, PagedKVProposer, Proposals, StepView, draft_chains
from cinq.spec.eagle_tree import TreeRoots, dynamic_tree, static_tree
from cinq.spec.tree import TreeShape
from cinq.step.batch_inputs import RAGGED_MAX_ROWS, TreeGroup, build_batch
from cinq.step.scheduler_output import ScheduledSeq


MAX_PENDING = 4096  # committed positions whose features wait for the head, per request


@dataclass(slots=True)
class PendingFeatures:
    """One request's committed target features [m, F] from position ``first`` on, not yet fed to the head: a
    list of per-step chunks, joined only at the catch-up (joining every step would copy all of them each step
    a request spends with speculation off)."""

    first: int
    chunks: list[torch.Tensor]
    length: int

    @property
    def end(self) -> int:
        return self.first + self.length

    def rows(self) -> torch.Tensor:
        return self.chunks[0] if len(self.chunks) == 1 else torch.cat(self.chunks)

    def append_at(self, pos: int, kept: torch.Tensor) -> None:
        """Add ``kept`` at position ``pos`` (first <= pos <= end): only what is before ``pos`` stays trusted (a
        preempted request may restart inside its old features). Past ``MAX_PENDING`` positions whole chunks go
        from the front: older features then only cost acceptance."""
        if pos < self.end:
            self.chunks, self.length = [self.rows()[:pos - self.first]], pos - self.first
        self.chunks.append(kept)
        self.length += kept.shape[0]
        while len(self.chunks) > 1 and self.length - self.chunks[0].shape[0] >= MAX_PENDING:
            n = self.chunks.pop(0).shape[0]
            self.first, self.length = self.first + n, self.length - n


class EagleProposer(PagedKVProposer):
    """Drafts with ``head`` on ``target``'s features (``method: eagle`` or ``eagle3``)."""

    def __init__(self, head: EagleHead, target: LlamaForCausalLM, device: torch.device, kv_dtype: torch.dtype,
                 probabilistic: bool, generator: torch.Generator, tree: TreeShape | None = None,
                 tree_topk: int = 0, tree_depth: int = 0, tree_nodes: int = 0) -> None:
        super().__init__(device, kv_dtype, probabilistic, generator)
        self.head = head
        # a static tree, or EAGLE-2's dynamic one (tree_topk > 0: tree_nodes drafts, tree_depth levels)
        self.tree = tree
        self.tree_topk, self.tree_depth = tree_topk, tree_depth
        self.tree_nodes = len(tree.paths) if tree is not None else tree_nodes if tree_topk else 0
        self.target = target
        # EAGLE-3's feature layers only: the target keeps no other layer's input
        self.layer_state_ids = tuple(head.feature_layers) if head.method == "eagle3" else ()
        # request -> target features committed, not yet fed to the head
        self.pending: dict[str, PendingFeatures] = {}

    def kv_layers(self) -> tuple[list[torch.nn.Module], int, int]:
        cfg = self.head.config
        return self.head.attention_layers(), cfg.num_key_value_heads, cfg.head_dim

    def forget(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, seqs: list[ScheduledSeq], history: dict[str, list[int]],
                sampling: dict[str, DraftSampling]) -> Proposals:
        want = {s.request_id: s.num_draft_slots for s in seqs if s.num_draft_slots}
        out = Proposals()
        if not want:  # speculation is off this step: the features wait (off costs no head forward)
            return out
        rows_in, feats, ids, prompt_rows = [], [], [], []
        for s in seqs:
            if s.request_id not in want:
                continue
            entry = self.pending.pop(s.request_id, None)
            if entry is None:
                continue
            first, feat = entry.first, entry.rows()
            # only what the target still trusts (a preempted request restarts before its old features)
            m = min(feat.shape[0], s.start_pos - first)
            if m <= 0:
                continue
            hist = history[s.request_id]
            # every row counted as a logit row, up to the ragged kernels' limit: the catch-up is then a decode-like
            # batch, whose attention reads the pages in place (the head's fused layer, cinq/spec/eagle3.py) rather
            # than a prefill chunk's gathered context; the head reads its last row only either way
            rows_in.append(ScheduledSeq(s.request_id, hist[first + 1:first + 1 + m], first, s.block_ids,
                                        m if m <= RAGGED_MAX_ROWS else 1))
            feats.append(feat[:m])
            ids.append(s.request_id)
            # positions up to the prompt's last token (its state, committed by the prefill) are prompt rows
            prompt_rows.append(max(0, min(first + m, len(hist) - s.num_output_tokens) - first))
        if not rows_in:
            return self._fallback(seqs, want, history, out)
        batch = build_batch(rows_in, self.block_size, self.pad_block_ids, self.device)
        by_id = dict(zip(ids, feats))

        def forward() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # the fusion of the kept layers is timed with the head: it too grows with the positions caught up
            feature = _pad_rows(self._fused(torch.cat([by_id[s.request_id] for s in batch.seqs])),
                                batch.input_ids.shape[0])
            return feature, *self.head(batch.input_ids, feature, batch.positions, batch.meta)

        (feature, next_feat, normed), out.catch_up_s = self.catch_up(
            forward, [len(s.token_ids) for s in rows_in], [want[s.request_id] for s in rows_in], prompt_rows)
        live = [(s, row) for s, row in zip(batch.seqs, batch.last_rows()) if s.request_id in want]
        block_ids = {s.request_id: s.block_ids for s in seqs}
        n_tree = self.tree_nodes or -1
        for is_tree in (False, True):
            part = [(s, row) for s, row in live if (want[s.request_id] == n_tree) == is_tree]
            if not part:
                continue
            rows = torch.tensor([row for _, row in part], dtype=torch.long, device=self.device)
            ids = [s.request_id for s, _ in part]
            # the next head position: just past the catch-up, i.e. the verify's known token
            pos = {s.request_id: s.start_pos + len(s.token_ids) for s, _ in part}
            if not is_tree:
                self._draft_chains(ids, pos, block_ids, want, sampling, next_feat[rows], normed[rows], out)
                continue
            vocab = self.head.draft_vocab()
            roots = TreeRoots(ids, {s.request_id: s.token_ids[-1] for s, _ in part}, feature[rows],
                              next_feat[rows], self._tree_logprobs(normed[rows], vocab),
                              None if vocab is None else vocab.ids)

            def level(tokens, parents, feats, ids=ids, pos=pos):  # noqa: ANN001, ANN202
                return self._tree_level(ids, pos, block_ids, tokens, parents, feats)

            if self.tree is not None:
                drafts, parents = static_tree(roots, self.tree, level)
                out.parents.update({r: parents for r in ids})
            else:
                drafts, per_request = dynamic_tree(roots, self.tree_topk, self.tree_depth, self.tree_nodes, level)
                out.parents.update(per_request)
            out.token_ids.update(drafts)
        return self._fallback(seqs, want, history, out)

    def _draft_chains(self, ids: list[str], pos: dict[str, int], block_ids: dict[str, list[int]],
                      want: dict[str, int], sampling: dict[str, DraftSampling], cur_feat: torch.Tensor,
                      cur_norm: torch.Tensor, out: Proposals) -> None:
        """One batched head step per draft, each fed its previous draft and the head's own feature; over the
        head's draft vocabulary where it has one (no full-vocabulary row per greedy draft)."""
        feat = [cur_feat]
        vocab = self.head.draft_vocab()
        logits_of = self.head.draft_logits if vocab is not None else self.head.compute_logits

        def step(keep: list[int], ids: list[str], j: int) -> torch.Tensor:
            step_seqs = [ScheduledSeq(r, [out.token_ids[r][-1]], pos[r] + j, block_ids[r], 1) for r in ids]
            batch = build_batch(step_seqs, self.block_size, self.pad_block_ids, self.device, ql=1)
            sel = torch.tensor(keep, device=self.device)
            f, n = self.head(batch.input_ids, _pad_rows(feat[0][sel], batch.input_ids.shape[0]), batch.positions,
                             batch.meta)
            feat[0] = f[:len(ids)]
            return logits_of(n[:len(ids)])

        draft_chains(ids, want, sampling, logits_of(cur_norm), step, self.probabilistic, self.generator, out, vocab)

    def _tree_level(self, ids: list[str], pos: dict[str, int], block_ids: dict[str, list[int]],
                    tokens: dict[str, list[int]], parents: dict[str, list[int]],
                    feats: dict[str, list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One head step over every request's tree so far (root at the head position p0 - 1): output features
        [n, q, H] and the draft's log-probabilities [n, q, V], in ``ids`` order."""
        q = len(tokens[ids[0]])
        level = [ScheduledSeq(r, tokens[r], pos[r] - 1, block_ids[r], q) for r in ids]
        batch = build_batch(level, self.block_size, self.pad_block_ids, self.device,
                            tree=TreeGroup({r: parents[r] for r in ids}))
        feat_in = torch.stack([f for s in batch.seqs for f in feats[s.request_id]])
        f, normed = self.head(batch.input_ids, _pad_rows(feat_in, batch.input_ids.shape[0]), batch.positions,
                              batch.meta)
        n = len(ids)
        logprobs = self._tree_logprobs(normed[:n * q], self.head.draft_vocab())
        return f[:n * q].view(n, q, -1), logprobs.view(n, q, -1)

    def _tree_logprobs(self, normed: torch.Tensor, vocab: DraftVocab | None) -> torch.Tensor:
        """The draft's log-probabilities that rank tree nodes: over the head's draft vocabulary where it has one
        (TreeRoots.draft_ids maps the columns), else over the target's."""
        logits = self.head.compute_logits(normed) if vocab is None else self.head.draft_logits(normed).float()
        return logits.log_softmax(-1)

    @staticmethod
    def _fallback(seqs: list[ScheduledSeq], want: dict[str, int], history: dict[str, list[int]],
                  out: Proposals) -> Proposals:
        # A request with no committed features yet (none kept since a preemption) still gets its slots filled:
        # repeating its last token is a poor but valid guess, and verification stays exact.
        for rid, k in want.items():
            got = out.token_ids.setdefault(rid, [])
            if len(got) < k:
                got.extend([history[rid][-1]] * (k - len(got)))
                out.probs.pop(rid, None)
        return out

    def commit(self, view: StepView) -> None:
        """Keep the target features of the positions the target kept, for the head's next catch-up: they pile up
        while a request does not speculate (up to ``MAX_PENDING`` positions; older ones then only cost
        acceptance). EAGLE-3's three layers are kept side by side and fused at the catch-up, so that a step
        with speculation off runs no head layer at all (off costs nothing)."""
        if self.layer_state_ids:
            assert view.layer_states is not None
            fused = torch.cat(view.layer_states, dim=-1)
        else:
            fused = view.hidden
        for i, s in enumerate(view.batch.seqs):
            rows = view.committed_rows(i)
            if not rows:
                continue
            contiguous = rows[-1] - rows[0] + 1 == len(rows)
            # a copy: a view would keep the whole step's tensor alive while the request is off
            kept = fused[rows[0]:rows[-1] + 1].clone() if contiguous else \
                fused[torch.tensor(rows, device=fused.device)]
            old = self.pending.get(s.request_id)
            if old is not None and old.first <= s.start_pos <= old.end:
                old.append_at(s.start_pos, kept)
            else:
                self.pending[s.request_id] = PendingFeatures(s.start_pos, [kept], kept.shape[0])


    def _fused(self, kept: torch.Tensor) -> torch.Tensor:
        """The head's input features [n, H] from what ``commit`` kept (EAGLE-3: its layers side by side)."""
        if not self.layer_state_ids:
            return kept
        return self.head.fuse(list(kept.chunk(len(self.head.feature_layers), dim=-1)))


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` [n, H] with zero rows appended up to the batch's padded row count."""
    return x if x.shape[0] == rows else torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])
