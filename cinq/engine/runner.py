"""ModelRunner: owns the model and the KV tensors; turns a SchedulerOutput into one flat varlen forward pass
and sampled tokens (inputs built by cinq/step/batch_inputs.py).

With a runner-side proposer (cinq/spec/proposer.py: a draft model, EAGLE or Medusa heads) a step first lets it
fill each speculating sequence's reserved draft slots, verifies the drafts in the target's forward, then
commits what was kept back to the proposer.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass

import torch

from cinq.compilation_config import CompilationConfig
from cinq.engine.compiled_decode import CompiledDecode
from cinq.engine.kv_cache_groups import FULL, add_group_tables, allocate_group_caches
from cinq.engine.kv_cache_virtual import VirtualKVRegion, VirtualKVSpec
from cinq.errors import InvalidParameterError
from cinq.host_memory import kv_cache_tensor
from cinq.layers.sampler import Sampler, SamplingMetadata, bad_word_bans, logit_bias_row
from cinq.model.interface import check_supported
from cinq.model.llama import LlamaForCausalLM
from cinq.sampling_params import SamplingParams
from cinq.spec.proposer import DraftSampling, Proposals, Proposer, StepView
from cinq.spec.verifier import Verifier
from cinq.step.batch_inputs import BatchInputs, TreeGroup, build_batch
from cinq.step.runner_output import RunnerOutput, TokenLogprobs
from cinq.step.scheduler_output import NewRequestData, ScheduledSeq, SchedulerOutput
from cinq.step.shape_buckets import MAX_PAD_ROWS, bucket_rows
from cinq.step.token_logprobs import token_logprobs
from cinq.structured.backend import GrammarMatcher
from cinq.structured.masks import advance, mask_logits

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _RequestState:
    params: SamplingParams
    prompt_token_ids: list[int]
    generator: torch.Generator | None = None
    output_counts: torch.Tensor | None = None  # [V] int32, for penalties
    seen_mask: torch.Tensor | None = None  # [V] bool, prompt + output tokens
    token_ids: list[int] | None = None  # prompt + emitted tokens, kept only for a proposer (its catch-up reads them)
    matcher: GrammarMatcher | None = None  # structured outputs: the grammar's state over the emitted tokens
    bias: torch.Tensor | None = None  # [V] float32: logit_bias, -inf outside allowed_token_ids
    output_ids: list[int] | None = None  # the tokens emitted so far, kept only for bad_words


def _plain_greedy(state: _RequestState, num_output: int) -> bool:
    """True when the request's next token is the argmax of the raw logits: greedy, no penalties, no logit bias or
    bad words, no logprobs, no min_tokens ban at this output count."""
    p = state.params
    return (p.greedy and state.output_counts is None and state.bias is None and state.output_ids is None
            and p.logprobs is None and num_output >= p.min_tokens)


class ModelRunner:
    """Runs the model over scheduled sequences and samples."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int | tuple[int, int], block_size: int,
                 device: torch.device, kv_dtype: torch.dtype, seed: int = 0, proposer: Proposer | None = None,
                 compilation: CompilationConfig | None = None, virtual: VirtualKVSpec | None = None,
                 tokenizer_path: str | None = None) -> None:
        self.model = model
        self.tokenizer_path = tokenizer_path  # structured outputs compile grammars over this tokenizer
        self.device = device
        self.block_size = block_size
        self.vocab_size = model.config.vocab_size
        self.sampler = Sampler()
        # Unseeded requests draw from the engine's own generator, not torch's global one: two engines in one
        # process (or a library user's own torch.manual_seed) do not disturb each other.
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        cfg = model.config
        num_kv_heads = model.attention_layers()[0].num_kv_heads  # this rank's heads under tensor parallelism
        # A (full, sliding) pair: KV cache groups (kv_cache_groups.py), each layer's tensor sized by its group;
        # block ids below are the full group's (group 0, the scheduler's block_ids)
        self.group_pad_block_ids: list[list[int]] | None = None
        group_blocks = num_blocks if isinstance(num_blocks, tuple) else None
        if group_blocks is not None:
            if proposer is not None or virtual is not None:
                what, field = (("a runner-side speculative proposer (draft model, EAGLE, Medusa): use n-gram",
                                "speculative_config") if proposer is not None else
                               ("kv_cache_layout 'virtual'", "kv_cache_layout"))
                raise InvalidParameterError(f"KV cache groups (a model mixing full and sliding-window layers) do "
                                            f"not support {what}", field)
            num_blocks = group_blocks[FULL]
        # Past the pool's num_blocks: scratch blocks for the padding tokens that round a step's rows up to a
        # bucket (shape_buckets.py); the KV manager never hands them out.
        self.pad_block_ids = list(range(num_blocks, num_blocks + -(-MAX_PAD_ROWS // block_size)))
        # kv_cache_layout "virtual": blocks are per-request slots of a reservation committed on first write
        self.kv_region: VirtualKVRegion | None = None
        if virtual is not None:
            self.kv_region = VirtualKVRegion(cfg.num_hidden_layers, num_blocks + len(self.pad_block_ids), block_size,
                                             num_kv_heads, cfg.head_dim, kv_dtype, virtual.page_size)
            self.kv_caches = self.kv_region.layer_views()
        elif group_blocks is not None:
            npad = len(self.pad_block_ids)
            self.group_pad_block_ids = [list(range(n, n + npad)) for n in group_blocks]
            self.kv_caches = allocate_group_caches(model.attention_layers(), group_blocks, npad, block_size,
                                                   num_kv_heads, cfg.head_dim, kv_dtype, device)
        else:
            shape = (2, num_blocks + len(self.pad_block_ids), block_size, num_kv_heads, cfg.head_dim)
            self.kv_caches = [kv_cache_tensor(shape, kv_dtype, device) for _ in range(cfg.num_hidden_layers)]
        for attn, cache in zip(model.attention_layers(), self.kv_caches):
            attn.kv_cache = cache
        self.states: dict[str, _RequestState] = {}
        self.proposer = proposer
        self.verifier = Verifier(device, self.vocab_size, self.generator, self._sampling_metadata)
        if proposer is not None:
            proposer.initialize_cache(num_blocks + len(self.pad_block_ids), block_size, self.pad_block_ids)
        # plain decode steps compiled (CPU) or captured (CUDA graphs; compilation_config): tables as wide as the
        # longest sequence can need
        self.compiled: CompiledDecode | None = None
        if compilation is not None and compilation.enabled and proposer is None:
            check_supported(type(model), "compile", "compilation_config")
            self.compiled = CompiledDecode(model, compilation, block_size, self.pad_block_ids, device,
                                           min(num_blocks, -(-cfg.max_position_embeddings // block_size)))

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.config
        elem = torch.empty((), dtype=dtype).element_size()
        num_kv_heads = model.attention_layers()[0].num_kv_heads  # this rank's heads under tensor parallelism
        return 2 * cfg.num_hidden_layers * block_size * num_kv_heads * cfg.head_dim * elem

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        t0 = time.perf_counter()
        out = self._execute(sched)
        out.elapsed_s = time.perf_counter() - t0
        return out

    @torch.inference_mode()
    def _execute(self, sched: SchedulerOutput) -> RunnerOutput:
        for rid in sched.finished_request_ids:
            self.states.pop(rid, None)
            if self.proposer is not None:
                self.proposer.forget(rid)
        for new in sched.new_requests:
            self.states[new.request_id] = self._new_state(new)
        out = RunnerOutput()
        if not sched.seqs:
            return out
        seqs, proposals, kept = sched.seqs, None, {}
        if self.kv_region is not None:
            self.kv_region.check_step(seqs)  # no write past a request's own range
        if self.proposer is not None:
            proposals = self._propose(seqs)
            out.catch_up_s = proposals.catch_up_s
            seqs = [dataclasses.replace(s, token_ids=s.token_ids + proposals.token_ids.get(s.request_id, []))
                    if s.num_draft_slots else s for s in seqs]
        # Decode-like sequences first: the attention backends batch them in their decode kernel. A padding
        # sequence last (its own scratch blocks, no logits) keeps the GEMM shapes to a few buckets.
        tree = TreeGroup(proposals.parents) if proposals is not None and proposals.parents else None
        if self.compiled is not None and tree is None:
            logits = self.compiled.run(seqs)  # plain decode steps of a compile (capture) size
            if logits is not None:
                self._sample(logits, seqs, out)
                return out
        batch = build_batch(seqs, self.block_size, self.pad_block_ids, self.device, tree=tree)
        if self.group_pad_block_ids is not None:
            add_group_tables(batch, self.group_pad_block_ids, self.block_size, self.device)
        layer_states = None
        if self.proposer is not None and self.proposer.layer_state_ids:
            hidden, layer_states = self.model.forward_with_hidden_states(batch.input_ids, batch.positions,
                                                                         batch.meta, self.proposer.layer_state_ids)
        else:
            hidden = self.model(batch.input_ids, batch.positions, batch.meta)
        seqs, starts = batch.seqs, batch.starts
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
                spec_seqs = [seqs[i] for i in spec]
                kept = self.verifier.verify(logits[len(plain):], spec_seqs,
                                            [self.states[s.request_id] for s in spec_seqs], out, proposals)
                if proposals is not None and proposals.parents:
                    self.verifier.move_accepted_kv(batch, kept, self.kv_caches)
        for i, seq in enumerate(seqs):
            if self.states[seq.request_id].params.prompt_logprobs is not None:
                self._prompt_logprobs(hidden[starts[i]:starts[i + 1]], seq, out)
        if self.proposer is not None:
            self._commit(batch, hidden, layer_states, out, kept)
        return out

    def _propose(self, seqs: list[ScheduledSeq]) -> Proposals:
        assert self.proposer is not None
        history = {s.request_id: self.states[s.request_id].token_ids or [] for s in seqs}
        sampling = {s.request_id: DraftSampling(self.states[s.request_id].params, self.states[s.request_id].generator)
                    for s in seqs if s.num_draft_slots}
        proposals = self.proposer.propose(seqs, history, sampling)
        for s in seqs:  # a proposer fills every reserved slot: the scheduler counted them in the step
            got = len(proposals.token_ids.get(s.request_id, []))
            if got != s.num_draft_slots:
                raise RuntimeError(f"proposer gave {got} drafts for {s.num_draft_slots} slots of {s.request_id}")
        return proposals

    def _commit(self, batch: BatchInputs, hidden: torch.Tensor, layer_states: list[torch.Tensor] | None,
                out: RunnerOutput, kept: dict[str, list[int]]) -> None:
        """Keep the proposer's state and the token history in step with what the target kept."""
        assert self.proposer is not None
        accepted = {rid: len(rows) - 1 for rid, rows in kept.items()}
        self.proposer.commit(StepView(batch, hidden, layer_states, out.sampled, accepted, kept))
        for rid, tokens in out.sampled.items():
            history = self.states[rid].token_ids
            if history is not None:
                history.extend(tokens)

    def _compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """LM-head logits of ``hidden[rows]``, computed over a bucketed number of rows (the last one repeated)."""
        idx = rows + [rows[-1]] * (bucket_rows(len(rows)) - len(rows))
        if len(idx) == hidden.shape[0] and idx == list(range(len(idx))):  # all rows in order (batch-1 decode)
            return self.model.compute_logits(hidden)
        return self.model.compute_logits(hidden[torch.tensor(idx, device=self.device)])[:len(rows)]

    def _new_state(self, new: NewRequestData) -> _RequestState:
        params = new.sampling_params
        state = _RequestState(params, new.prompt_token_ids)
        if self.proposer is not None:
            state.token_ids = list(new.prompt_token_ids)
        if params.seed is not None and not params.greedy:
            state.generator = torch.Generator(device=self.device)
            state.generator.manual_seed(params.seed)
        if params.structured_outputs is not None:
            state.matcher = self._structured().matcher(params.structured_outputs)
        if params.has_logit_bias:
            state.bias = logit_bias_row(params, self.vocab_size, self.device)
        if params.bad_words_token_ids:
            state.output_ids = []
        if params.has_penalties:
            state.output_counts = torch.zeros(self.vocab_size, dtype=torch.int32, device=self.device)
            state.seen_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            prompt = torch.tensor(new.prompt_token_ids, device=self.device)
            state.seen_mask[prompt[prompt < self.vocab_size]] = True
        return state

    def _structured(self):  # noqa: ANN202 - the manager, built on the first constrained request
        from cinq.engine.structured_outputs import structured_output_manager
        if self.tokenizer_path is None:
            raise RuntimeError("structured outputs need the runner's tokenizer_path")
        return structured_output_manager(self.tokenizer_path, self.vocab_size)

    def _sample(self, logits: torch.Tensor, seqs: list[ScheduledSeq], out: RunnerOutput) -> None:
        states = [self.states[s.request_id] for s in seqs]
        matchers = [st.matcher for st in states]
        if any(m is not None for m in matchers):  # grammar masks first: before penalties, temperature, top-p
            logits = mask_logits(logits, matchers)
        if all(_plain_greedy(st, s.num_output_tokens) for st, s in zip(states, seqs)):
            # nothing but argmax to do: no sampling metadata (a dozen small tensors), no sampler pass
            for seq, st, tok in zip(seqs, states, Sampler.greedy(logits).tolist()):
                out.sampled[seq.request_id] = [tok]
                advance(st.matcher, [tok], seq.request_id)
            return
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
            advance(st.matcher, [tok], seq.request_id)
            if st.output_ids is not None:
                st.output_ids.append(tok)
            if st.output_counts is not None:
                st.output_counts[tok] += 1
                st.seen_mask[tok] = True
        for i in want_lp:
            k = states[i].params.logprobs
            out.logprobs[seqs[i].request_id] = [TokenLogprobs(
                tokens[i], lp[i], rank[i], top_ids[i][:k] if top_ids else [], top_vals[i][:k] if top_vals else [])]

    def _sampling_metadata(self, states: list[_RequestState], num_outputs: list[int],
                           drafted: list[list[int]] | None = None) -> SamplingMetadata:
        """The rows' sampling metadata; ``drafted``: per row, the draft tokens before it that count as output
        (speculative verification's path to the row)."""
        dev = self.device
        params = [st.params for st in states]
        greedy = [p.greedy for p in params]
        meta = SamplingMetadata(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            greedy=torch.tensor(greedy, device=dev), all_greedy=all(greedy), generator=self.generator)
        if not meta.all_greedy:
            if any(p.top_k > 0 for p in params):
                ks = [p.top_k if p.top_k > 0 else self.vocab_size for p in params]
                meta.top_k, meta.max_top_k = torch.tensor(ks, device=dev), max(ks)
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
        biased = [i for i, st in enumerate(states) if st.bias is not None]
        if biased:
            meta.bias_rows = torch.tensor(biased, device=dev)
            meta.bias = torch.stack([states[i].bias for i in biased])
        for i, (st, num_output) in enumerate(zip(states, num_outputs)):
            p = st.params
            if num_output < p.min_tokens:
                banned = [t for t in itertools.chain(p.stop_token_ids, [] if p.ignore_eos else p.eos_token_ids)
                          if t < self.vocab_size]
                if banned:
                    meta.banned.append((i, banned))
            if st.output_ids is not None:
                words = bad_word_bans(p.bad_words_token_ids, st.output_ids, drafted[i] if drafted else ())
                if words:
                    meta.banned.append((i, words))
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
