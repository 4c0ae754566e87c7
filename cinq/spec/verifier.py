"""Verification of speculative drafts: one verifier for chains and trees, so the runner only runs forwards.

The runner hands over the target's logits at each speculating sequence's rows (its last token, then one per
draft), the proposals (a chain, or a flattened tree when the proposer gave parents) and the requests' sampling
state. Each row is processed exactly as plain decoding would process it at that output position (grammar mask,
min_tokens bans, penalties with the path's drafts counted as output, temperature / top-k / top-p), then chains
go through rejection sampling (cinq/spec/rejection.py, with the proposer's q where it sampled, one-hot where it
drew greedily) and trees through ``verify_tree`` (cinq/spec/tree.py). The accepted drafts plus one closing token
are emitted per sequence, with raw logprobs when asked; a tree's accepted path is then moved down to
consecutive KV slots.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

import torch

from cinq.layers.sampler import Sampler, SamplingMetadata
from cinq.sampling_params import SamplingParams
from cinq.spec.proposer import Proposals
from cinq.spec.rejection import DraftBatch, rejection_sample
from cinq.spec.tree import verify_tree
from cinq.step.batch_inputs import BatchInputs
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import ScheduledSeq
from cinq.step.token_logprobs import token_logprobs
from cinq.structured.masks import advance, mask_logits


class RequestSampling(Protocol):
    """What the verifier reads and updates of a request's sampling state (the runner's per-request state)."""

    params: SamplingParams
    generator: torch.Generator | None
    output_counts: torch.Tensor | None
    seen_mask: torch.Tensor | None
    matcher: Any
    output_ids: list[int] | None


# (states of the rows, output count at each row, the drafts before each row) -> the rows' sampling metadata (the
# runner builds it)
MetadataFn = Callable[[list[Any], list[int], list[list[int]]], SamplingMetadata]


class Verifier:
    """Verifies drafts for one runner (its device, vocabulary, shared generator and metadata builder)."""

    def __init__(self, device: torch.device, vocab_size: int, generator: torch.Generator | None,
                 sampling_metadata: MetadataFn) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = generator
        self.sampling_metadata = sampling_metadata

    def verify(self, logits: torch.Tensor, seqs: list[ScheduledSeq], states: list[RequestSampling],
               out: RunnerOutput, proposals: Proposals | None = None) -> dict[str, list[int]]:
        """Verify each sequence's drafts (its last ``num_logit_rows - 1`` tokens: a chain, or a flattened tree
        when the proposer gave its parents) against the target's distributions at those rows; emits the accepted
        drafts and one closing token per sequence into ``out``. Returns, per request, the rows the target kept
        (the root and the accepted path)."""
        ks = [s.num_logit_rows - 1 for s in seqs]
        draft_lists = [s.token_ids[len(s.token_ids) - k:] for s, k in zip(seqs, ks)]
        trees = proposals.parents if proposals is not None else {}
        parents = [trees.get(s.request_id) or list(range(-1, k)) for s, k in zip(seqs, ks)]
        # Row j scores the token after the path to node j (chain: the first j drafts): to min_tokens bans and
        # penalties that path is output already, exactly as if it had been decoded one token at a time.
        row_history: list[list[int]] = []
        for d, par in zip(draft_lists, parents):
            paths: list[list[int]] = [[]]
            for j in range(1, len(par)):
                paths.append(paths[par[j]] + [d[j - 1]])
            row_history += paths
        row_states = [st for st, k in zip(states, ks) for _ in range(k + 1)]
        if any(st.matcher is not None for st in states):  # row j masked at the grammar's state after its path
            logits = mask_logits(logits, [st.matcher for st in row_states], row_history)
        raw_logits = logits  # logprobs: of the constrained distribution where a grammar masks
        offsets = [0, *itertools.accumulate(k + 1 for k in ks)]
        row_outputs = [s.num_output_tokens + len(row_history[r]) for i, s in enumerate(seqs)
                       for r in range(offsets[i], offsets[i + 1])]
        probs = self._processed(logits, row_states, row_outputs, row_history)
        emitted: dict[int, list[int]] = {}
        kept: dict[int, list[int]] = {}
        chain = [i for i, s in enumerate(seqs) if s.request_id not in trees]
        tree = [i for i, s in enumerate(seqs) if s.request_id in trees]
        if chain:
            rows = torch.tensor([r for i in chain for r in range(offsets[i], offsets[i + 1])], device=self.device)
            sub = probs if len(chain) == len(seqs) else probs[rows]
            cks = [ks[i] for i in chain]
            drafts = torch.tensor([t for i in chain for t in draft_lists[i]], dtype=torch.long, device=self.device)
            greedy = torch.tensor([states[i].params.greedy for i in chain], device=self.device)
            gens = {n: states[i].generator for n, i in enumerate(chain) if states[i].generator is not None}
            q = (self.draft_probs([seqs[i] for i in chain], cks, drafts, proposals)
                 if proposals is not None and proposals.probs else None)
            result = rejection_sample(sub, DraftBatch(cks, drafts, q), greedy, gens, self.generator)
            for i, tokens in zip(chain, result.token_ids):
                emitted[i], kept[i] = tokens, list(range(len(tokens)))
        if tree:
            rows = torch.tensor([r for i in tree for r in range(offsets[i], offsets[i + 1])], device=self.device)
            gens = {n: states[i].generator for n, i in enumerate(tree) if states[i].generator is not None}
            result = verify_tree(probs[rows], [[-1] + draft_lists[i] for i in tree], [parents[i] for i in tree],
                                 [states[i].params.greedy for i in tree], gens, self.generator)
            for i, tokens, path in zip(tree, result.token_ids, result.accepted_rows):
                emitted[i], kept[i] = tokens, [0] + path
        for i, (seq, st) in enumerate(zip(seqs, states)):
            self._emit(seq, st, emitted[i], raw_logits, [offsets[i] + r for r in kept[i]], out)
        return {seqs[i].request_id: rows_kept for i, rows_kept in kept.items()}

    def _processed(self, logits: torch.Tensor, row_states: list[RequestSampling], row_outputs: list[int],
                   row_history: list[list[int]]) -> torch.Tensor:
        """Each row's distribution as plain decoding would sample it (greedy rows: the banned, penalised logits,
        whose argmax is all they need)."""
        meta = self.sampling_metadata(row_states, row_outputs, row_history)
        if meta.penalty_rows is not None:
            for n, r in enumerate(meta.penalty_rows.tolist()):
                if row_history[r]:
                    prev = torch.tensor(row_history[r], device=self.device)
                    meta.output_counts[n].index_add_(0, prev, torch.ones_like(prev, dtype=torch.int32))
                    meta.seen_mask[n, prev] = True
        logits = Sampler.apply_bans_and_penalties(logits.float(), meta)
        # greedy rows only compare drafts with the argmax: temperature / top-k / top-p cannot move it
        return logits if meta.all_greedy else Sampler.processed_probs(logits, meta)

    def _emit(self, seq: ScheduledSeq, st: RequestSampling, tokens: list[int], raw_logits: torch.Tensor,
              rows: list[int], out: RunnerOutput) -> None:
        out.sampled[seq.request_id] = tokens
        advance(st.matcher, tokens, seq.request_id)
        if st.output_ids is not None:
            st.output_ids.extend(tokens)
        if st.params.logprobs is not None:  # raw, as without drafts: emitted token j comes from kept row j
            raw = raw_logits[torch.tensor(rows, device=self.device)].float().log_softmax(-1)
            out.logprobs[seq.request_id] = token_logprobs(raw, tokens, st.params.logprobs)
        if st.output_counts is not None:
            new = torch.tensor(tokens, device=self.device)
            st.output_counts.index_add_(0, new, torch.ones_like(new, dtype=torch.int32))
            st.seen_mask[new] = True

    def draft_probs(self, seqs: list[ScheduledSeq], ks: list[int], drafts: torch.Tensor,
                    proposals: Proposals) -> torch.Tensor:
        """The proposer's q at every draft row; one-hot where it drew greedily (or the drafts are not its own)."""
        q = torch.nn.functional.one_hot(drafts.clamp(0, self.vocab_size - 1), self.vocab_size).float()
        at = 0
        for s, k in zip(seqs, ks):
            p = proposals.probs.get(s.request_id)
            if p is not None and p.shape[0] == k:
                q[at:at + k] = p.to(q.dtype)
            at += k
        return q

    def move_accepted_kv(self, batch: BatchInputs, kept: dict[str, list[int]], kv_caches: list[torch.Tensor]
                         ) -> None:
        """A tree's accepted path lies at scattered rows; the committed tokens must sit in consecutive slots
        (the scheduler advances by the accepted count): copy their K/V down, in every layer."""
        src, dst = [], []
        for s, start in zip(batch.seqs, batch.starts):
            for j, r in enumerate(kept.get(s.request_id, [])):
                if r != j:
                    src.append(start + r)
                    dst.append(start + j)
        if not src:
            return
        slots = batch.meta.slot_mapping
        src_t, dst_t = slots[torch.tensor(src, device=self.device)], slots[torch.tensor(dst, device=self.device)]
        for cache in kv_caches:
            flat = cache.view(2, -1, *cache.shape[3:])
            flat[:, dst_t] = flat[:, src_t]
