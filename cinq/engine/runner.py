"""ModelRunner: owns the model and the KV tensors; turns a SchedulerOutput into one flat varlen forward pass
and sampled tokens.

Inputs are built with tensor ops over the whole batch (no per-token Python loops): positions from the
per-sequence start and cumulative lengths, slot mapping by gathering the block tables.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch

from cinq.engine.io import NewRequestData, RunnerOutput, ScheduledSeq, SchedulerOutput, TokenLogprobs
from cinq.engine.shape_buckets import MAX_PAD_ROWS, bucket_rows
from cinq.kernels.metadata import AttentionMetadata
from cinq.layers.sampler import Sampler, SamplingMetadata
from cinq.model.llama import LlamaForCausalLM
from cinq.sampling_params import SamplingParams
from cinq.spec.rejection import DraftBatch, rejection_sample

log = logging.getLogger(__name__)
_PAD_ID = "\x00pad"  # the padding sequence's id: no request has it, no state, never sampled


@dataclass(slots=True)
class _RequestState:
    params: SamplingParams
    prompt_token_ids: list[int]
    generator: torch.Generator | None = None
    output_counts: torch.Tensor | None = None  # [V] int32, for penalties
    seen_mask: torch.Tensor | None = None  # [V] bool, prompt + output tokens


def token_logprobs(logprobs: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """Row j of ``logprobs`` [n, V] scored ``tokens[j]``: its logprob, its rank and the top ``k``."""
    targets = torch.tensor(tokens, device=logprobs.device)
    chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
    ranks = ((logprobs > chosen[:, None]).sum(-1) + 1).tolist()
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
    top_ids_l = top_ids.tolist() if k else [[]] * len(tokens)
    top_vals_l = top_vals.tolist() if k else [[]] * len(tokens)
    return [TokenLogprobs(t, c, r, i, v) for t, c, r, i, v in zip(tokens, chosen.tolist(), ranks, top_ids_l,
                                                                   top_vals_l)]


def decode_query_len(seqs: list[ScheduledSeq]) -> int:
    """The query length the decode kernel batches this step: the most common one among decode-like sequences
    (every row produces logits: plain decodes, 1; speculative verifies, k + 1), the shorter on a tie; 1 if none.
    The rest take the backends' chunk path, which is exact for any sequence too."""
    counts: dict[int, int] = {}
    for s in seqs:
        if s.num_logit_rows == len(s.token_ids):
            counts[s.num_logit_rows] = counts.get(s.num_logit_rows, 0) + 1
    return min(counts, key=lambda q: (-counts[q], q)) if counts else 1


class ModelRunner:
    """Runs the model over scheduled sequences and samples."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, device: torch.device,
                 kv_dtype: torch.dtype, seed: int = 0) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.vocab_size = model.config.vocab_size
        self.sampler = Sampler()
        # Unseeded requests draw from the engine's own generator, not torch's global one: two engines in one
        # process (or a library user's own torch.manual_seed) do not disturb each other.
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        cfg = model.config
        # Past the pool's num_blocks: scratch blocks for the padding tokens that round a step's rows up to a
        # bucket (shape_buckets.py); the KV manager never hands them out.
        self.pad_block_ids = list(range(num_blocks, num_blocks + -(-MAX_PAD_ROWS // block_size)))
        self.kv_caches = [
            torch.zeros(2, num_blocks + len(self.pad_block_ids), block_size, cfg.num_key_value_heads,
                        cfg.head_dim, dtype=kv_dtype, device=device)
            for _ in range(cfg.num_hidden_layers)
        ]
        for attn, cache in zip(model.attention_layers(), self.kv_caches):
            attn.kv_cache = cache
        self.states: dict[str, _RequestState] = {}

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.config
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        for rid in sched.finished_request_ids:
            self.states.pop(rid, None)
        for new in sched.new_requests:
            self.states[new.request_id] = self._new_state(new)
        out = RunnerOutput()
        if not sched.seqs:
            return out
        # Decode-like sequences first: the attention backends batch them in their decode kernel.
        ql = decode_query_len(sched.seqs)
        seqs = sorted(sched.seqs, key=lambda s: len(s.token_ids) != ql)
        num_tokens = sum(len(s.token_ids) for s in seqs)
        pad = bucket_rows(num_tokens) - num_tokens
        # A padding sequence last (its own scratch blocks, no logits) keeps the GEMM shapes to a few buckets.
        padded = seqs + [ScheduledSeq(_PAD_ID, [0] * pad, 0, self.pad_block_ids, 0)] if pad else seqs
        meta, input_ids, positions = self._prepare(padded, ql)
        hidden = self.model(input_ids, positions, meta)
        starts = meta.query_start_loc.tolist()
        plain = [i for i, s in enumerate(seqs) if s.num_logit_rows == 1]
        spec = [i for i, s in enumerate(seqs) if s.num_logit_rows > 1]  # last token + drafts to verify
        if plain or spec:
            rows = [starts[i + 1] - 1 for i in plain]
            for i in spec:
                rows.extend(range(starts[i + 1] - seqs[i].num_logit_rows, starts[i + 1]))
            logits = self._compute_logits(hidden, rows)
            if plain:
                self._sample(logits[:len(plain)], [seqs[i] for i in plain], out)
            if spec:
                self._verify(logits[len(plain):], [seqs[i] for i in spec], out)
        for i, seq in enumerate(seqs):
            if self.states[seq.request_id].params.prompt_logprobs is not None:
                self._prompt_logprobs(hidden[starts[i]:starts[i + 1]], seq, out)
        return out

    def _compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """LM-head logits of ``hidden[rows]``, computed over a bucketed number of rows (the last one repeated)."""
        idx = rows + [rows[-1]] * (bucket_rows(len(rows)) - len(rows))
        return self.model.compute_logits(hidden[torch.tensor(idx, device=self.device)])[:len(rows)]

    def _new_state(self, new: NewRequestData) -> _RequestState:
        params = new.sampling_params
        state = _RequestState(params, new.prompt_token_ids)
        if params.seed is not None and not params.greedy:
            state.generator = torch.Generator(device=self.device)
            state.generator.manual_seed(params.seed)
        if params.has_penalties:
            state.output_counts = torch.zeros(self.vocab_size, dtype=torch.int32, device=self.device)
            state.seen_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            prompt = torch.tensor(new.prompt_token_ids, device=self.device)
            state.seen_mask[prompt[prompt < self.vocab_size]] = True
        return state

    def _prepare(self, seqs: list[ScheduledSeq], ql: int) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
        dev = self.device
        q_lens = [len(s.token_ids) for s in seqs]
        start_pos = [s.start_pos for s in seqs]
        seq_lens = [a + b for a, b in zip(start_pos, q_lens)]
        input_ids = torch.tensor(list(itertools.chain.from_iterable(s.token_ids for s in seqs)), dtype=torch.long)
        q_lens_t = torch.tensor(q_lens, dtype=torch.int32)
        cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
        torch.cumsum(q_lens_t, 0, out=cu[1:])
        seq_idx = torch.repeat_interleave(torch.arange(len(seqs)), q_lens_t)
        positions = torch.arange(len(input_ids)) - cu[:-1].long()[seq_idx] + torch.tensor(start_pos)[seq_idx]
        max_blocks = max(len(s.block_ids) for s in seqs)
        tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
        for i, s in enumerate(seqs):
            tables[i, :len(s.block_ids)] = torch.tensor(s.block_ids, dtype=torch.int32)
        slots = tables[seq_idx, positions // self.block_size].long() * self.block_size + positions % self.block_size
        num_decodes = next((i for i, n in enumerate(q_lens) if n != ql), len(q_lens))
        meta = AttentionMetadata(
            slot_mapping=slots.to(dev), query_start_loc=cu.to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev), block_tables=tables.to(dev),
            query_lens_cpu=q_lens, seq_lens_cpu=seq_lens, num_decodes=num_decodes,
            max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=self.block_size,
            decode_query_len=ql)
        return meta, input_ids.to(dev), positions.to(dev)

    def _sample(self, logits: torch.Tensor, seqs: list[ScheduledSeq], out: RunnerOutput) -> None:
        states = [self.states[s.request_id] for s in seqs]
        meta = self._sampling_metadata(states, [s.num_output_tokens for s in seqs])
        result = self.sampler(logits, meta)
        tokens = result.token_ids.tolist()
        want_lp = [i for i, st in enumerate(states) if st.params.logprobs is not None]
        if want_lp:
            lp = result.sampled_logprob.tolist()
            rank = result.sampled_rank.tolist()
            top_ids = result.logprob_token_ids.tolist() if result.logprob_token_ids is not None else None
            top_vals = result.logprobs.tolist() if result.logprobs is not None else None
        for i, (seq, st) in enumerate(zip(seqs, states)):
            tok = tokens[i]
            out.sampled[seq.request_id] = [tok]
            if st.output_counts is not None:
                st.output_counts[tok] += 1
                st.seen_mask[tok] = True
        for i in want_lp:
            k = states[i].params.logprobs
            out.logprobs[seqs[i].request_id] = [TokenLogprobs(
                tokens[i], lp[i], rank[i], top_ids[i][:k] if top_ids else [], top_vals[i][:k] if top_vals else [])]

    def _verify(self, logits: torch.Tensor, seqs: list[ScheduledSeq], out: RunnerOutput) -> None:
        """Rejection-sample each sequence's drafts (its last ``num_logit_rows - 1`` tokens) against the target's
        distributions at those rows; emits the accepted drafts and one closing token per sequence."""
        raw_logits = logits
        states = [self.states[s.request_id] for s in seqs]
        ks = [s.num_logit_rows - 1 for s in seqs]
        draft_lists = [s.token_ids[len(s.token_ids) - k:] for s, k in zip(seqs, ks)]
        # Row j of a sequence scores the token after its first j drafts: to min_tokens bans and penalties those
        # drafts are output already, exactly as if they had been decoded one by one.
        row_states = [st for st, k in zip(states, ks) for _ in range(k + 1)]
        row_outputs = [s.num_output_tokens + j for s, k in zip(seqs, ks) for j in range(k + 1)]
        row_history = [d[:j] for d, k in zip(draft_lists, ks) for j in range(k + 1)]
        meta = self._sampling_metadata(row_states, row_outputs)
        if meta.penalty_rows is not None:
            for n, r in enumerate(meta.penalty_rows.tolist()):
                if row_history[r]:
                    prev = torch.tensor(row_history[r], device=self.device)
                    meta.output_counts[n].index_add_(0, prev, torch.ones_like(prev, dtype=torch.int32))
                    meta.seen_mask[n, prev] = True
        logits = Sampler.apply_bans_and_penalties(logits.float(), meta)
        probs = Sampler.processed_probs(logits, meta)
        drafts = torch.tensor([t for d in draft_lists for t in d], dtype=torch.long, device=self.device)
        greedy = torch.tensor([st.params.greedy for st in states], device=self.device)
        gens = {i: st.generator for i, st in enumerate(states) if st.generator is not None}
        result = rejection_sample(probs, DraftBatch(ks, drafts), greedy, gens, self.generator)
        row = 0
        for seq, st, k, tokens in zip(seqs, states, ks, result.token_ids):
            out.sampled[seq.request_id] = tokens
            if st.params.logprobs is not None:  # raw, as without drafts: emitted token j comes from row j
                raw = raw_logits[row:row + len(tokens)].float().log_softmax(-1)
                out.logprobs[seq.request_id] = token_logprobs(raw, tokens, st.params.logprobs)
            if st.output_counts is not None:
                emitted = torch.tensor(tokens, device=self.device)
                st.output_counts.index_add_(0, emitted, torch.ones_like(emitted, dtype=torch.int32))
                st.seen_mask[emitted] = True
            row += k + 1

    def _sampling_metadata(self, states: list[_RequestState], num_outputs: list[int]) -> SamplingMetadata:
        dev = self.device
        params = [st.params for st in states]
        greedy = [p.greedy for p in params]
        meta = SamplingMetadata(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            greedy=torch.tensor(greedy, device=dev), all_greedy=all(greedy), generator=self.generator)
        if not meta.all_greedy:
            if any(p.top_k > 0 for p in params):
                meta.top_k = torch.tensor([p.top_k if p.top_k > 0 else self.vocab_size for p in params], device=dev)
            if any(p.top_p < 1.0 for p in params):
                meta.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
            if any(p.min_p > 0.0 for p in params):
                meta.min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev)
            meta.generators = {i: st.generator for i, st in enumerate(states) if st.generator is not None}
        pen = [i for i, st in enumerate(states) if st.output_counts is not None]
        if pen:
            meta.penalty_rows = torch.tensor(pen, device=dev)
            meta.output_counts = torch.stack([states[i].output_counts for i in pen])
            meta.seen_mask = torch.stack([states[i].seen_mask for i in pen])
            for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
                setattr(meta, name, torch.tensor([getattr(params[i], name) for i in pen], dtype=torch.float32,
                                                 device=dev))
        for i, (st, num_output) in enumerate(zip(states, num_outputs)):
            p = st.params
            if num_output < p.min_tokens:
                banned = [t for t in itertools.chain(p.stop_token_ids, [] if p.ignore_eos else p.eos_token_ids)
                          if t < self.vocab_size]
                if banned:
                    meta.banned.append((i, banned))
        lp = [p.logprobs for p in params if p.logprobs is not None]
        meta.max_num_logprobs = max(lp) if lp else None
        return meta

    def _prompt_logprobs(self, hidden: torch.Tensor, seq: ScheduledSeq, out: RunnerOutput) -> None:
        st = self.states[seq.request_id]
        prompt = st.prompt_token_ids
        # Row j predicts the token at position start_pos + j + 1; only prompt targets are reported.
        n = min(len(seq.token_ids), len(prompt) - 1 - seq.start_pos)
        if n <= 0:
            return
        logprobs = self._compute_logits(hidden, list(range(n))).log_softmax(-1)
        targets = prompt[seq.start_pos + 1:seq.start_pos + 1 + n]
        entries = out.prompt_logprobs.setdefault(seq.request_id, [])
        for j, tl in enumerate(token_logprobs(logprobs, targets, st.params.prompt_logprobs)):
            entries.append((seq.start_pos + j + 1, tl))
