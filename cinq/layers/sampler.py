"""Sampler with vLLM semantics, batched over the step's rows.

Order: logprobs are taken from the raw model distribution (as vLLM v1 returns them); then min_tokens bans,
penalties (repetition on prompt+output tokens, presence/frequency on output tokens), temperature, min-p, top-k and
top-p; then one draw per row. Draws use the exponential-race trick (argmax p / q with q ~ Exp(1)), where a seeded
row takes its q from its own generator only, so its tokens do not depend on its batch mates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from cinq.kernels.cpu_native import argmax_native
from cinq.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingMetadata:
    """Per-row sampling settings for one step (rows = requests that sample this step)."""

    temperature: torch.Tensor  # [B] float32; rows with greedy=True ignore it
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    top_k: torch.Tensor | None = None  # [B] int64, vocab size where disabled
    max_top_k: int = 0  # the largest of top_k, read on the host when it was built (0: not given)
    top_p: torch.Tensor | None = None  # [B] float32, 1.0 where disabled
    min_p: torch.Tensor | None = None  # [B] float32, 0.0 where disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> its seeded generator
    generator: torch.Generator | None = None  # the other rows' draws (None: torch's global generator)
    # Penalties, for the rows listed in penalty_rows only.
    penalty_rows: torch.Tensor | None = None  # [P] int64
    output_counts: torch.Tensor | None = None  # [P, V] int32: occurrences in the output so far
    seen_mask: torch.Tensor | None = None  # [P, V] bool: in prompt or output (repetition penalty)
    presence_penalty: torch.Tensor | None = None  # [P]
    frequency_penalty: torch.Tensor | None = None  # [P]
    repetition_penalty: torch.Tensor | None = None  # [P]
    # logit_bias / allowed_token_ids, for the rows listed in bias_rows only: added to the raw logits first
    bias_rows: torch.Tensor | None = None  # [R] int64
    bias: torch.Tensor | None = None  # [R, V] float32 (-inf outside allowed_token_ids)
    banned: list[tuple[int, list[int]]] = field(default_factory=list)  # (row, token ids) banned by min_tokens
    max_num_logprobs: int | None = None  # None: no row asked for logprobs


@dataclass(slots=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprob_token_ids: torch.Tensor | None = None  # [B, k] top-k token ids
    logprobs: torch.Tensor | None = None  # [B, k]
    sampled_logprob: torch.Tensor | None = None  # [B]
    sampled_rank: torch.Tensor | None = None  # [B] 1-based rank of the sampled token


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        out = SamplerOutput(token_ids=torch.empty(0, dtype=torch.long))
        raw_logprobs = logits.log_softmax(-1) if meta.max_num_logprobs is not None else None
        logits = self.apply_bans_and_penalties(logits, meta)
        greedy_tokens = self.greedy(logits)
        if meta.all_greedy:
            out.token_ids = greedy_tokens
        else:
            out.token_ids = torch.where(meta.greedy, greedy_tokens, self._sample(logits, meta))
        if raw_logprobs is not None:
            k = meta.max_num_logprobs
            out.sampled_logprob = raw_logprobs.gather(1, out.token_ids[:, None]).squeeze(1)
            out.sampled_rank = (raw_logprobs > out.sampled_logprob[:, None]).sum(-1) + 1
            if k:
                out.logprobs, out.logprob_token_ids = raw_logprobs.topk(k, dim=-1)
        return out

    @staticmethod
    def greedy(logits: torch.Tensor) -> torch.Tensor:
        """The greedy token of each row [B] (no softmax: it cannot move the argmax)."""
        return row_argmax(logits)

    @staticmethod
    def apply_bans_and_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """logit_bias and allowed_token_ids, min_tokens bans (-inf), then repetition / frequency / presence
        penalties (vLLM's order); a new tensor when any."""
        if meta.bias_rows is not None:
            logits = logits.index_add(0, meta.bias_rows, meta.bias)
        if meta.banned:
            logits = logits.clone()
            for row, ids in meta.banned:
                logits[row, ids] = float("-inf")
        if meta.penalty_rows is not None:
            logits = apply_penalties(logits, meta)
        return logits

    @staticmethod
    def processed_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The distribution each row samples from: temperature (1 for greedy rows), min-p, top-k / top-p, softmax.
        Speculative verification compares drafts against exactly this."""
        temp = torch.where(meta.greedy, torch.ones_like(meta.temperature), meta.temperature)
        logits = logits / temp[:, None]
        if meta.min_p is not None:
            probs = logits.softmax(-1)
            threshold = probs.amax(-1, keepdim=True) * meta.min_p[:, None]
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        if meta.top_k is not None or meta.top_p is not None:
            logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p, meta.max_top_k or None)
        return logits.softmax(-1)

    @staticmethod
    def _sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        probs = Sampler.processed_probs(logits, meta)
        q = torch.empty_like(probs).exponential_(generator=meta.generator)
        for row, gen in meta.generators.items():
            q[row].exponential_(generator=gen)
        return row_argmax(probs.div(q))


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` of a [B, V] tensor: the native pass for float32 CPU rows (the same indices, ~10x faster than
    PyTorch's on a row of logits; cinq/kernels/cpu/argmax.cpp), else PyTorch's."""
    out = argmax_native(x)
    return x.argmax(-1) if out is None else out


def logit_bias_row(params: SamplingParams, vocab_size: int, device: torch.device) -> torch.Tensor:
    """One request's additive bias over the vocabulary [V] float32: ``logit_bias`` at its ids, -inf outside
    ``allowed_token_ids`` (ids past the model's vocabulary, e.g. a padded tokenizer's, are left out)."""
    bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if params.allowed_token_ids is not None:
        bias.fill_(float("-inf"))
        allowed = [t for t in params.allowed_token_ids if t < vocab_size]
        bias[torch.tensor(allowed, dtype=torch.long, device=device)] = 0.0
    if params.logit_bias:
        items = [(t, b) for t, b in params.logit_bias.items() if t < vocab_size]
        if items:
            ids = torch.tensor([t for t, _ in items], dtype=torch.long, device=device)
            bias[ids] += torch.tensor([float(b) for _, b in items], dtype=torch.float32, device=device)
    return bias


def bad_word_bans(words: list[list[int]], output: list[int], drafted: list[int] = ()) -> list[int]:
    """The tokens ``words`` (token sequences) ban after ``output`` + ``drafted``: each word's last token where its
    other tokens end them (a one-token word: always). Only the tail a word can reach is read: no per-step copy of
    the whole output."""
    longest = max(len(w) for w in words) - 1
    tail = output[len(output) - min(longest, len(output)):] + list(drafted) if longest else []
    banned = []
    for w in words:
        head = len(w) - 1
        if head == 0 or (len(tail) >= head and tail[len(tail) - head:] == w[:-1]):
            banned.append(w[-1])
    return banned


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Repetition penalty (divide positive / multiply negative logits of seen tokens), then frequency
    (minus f * count) and presence (minus p if the token occurred) penalties on output tokens."""
    rows = meta.penalty_rows
    sub = logits[rows]
    rep = meta.repetition_penalty[:, None]
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(meta.seen_mask, penalised, sub)
    counts = meta.output_counts.to(sub.dtype)
    sub = sub - meta.frequency_penalty[:, None] * counts
    sub = sub - meta.presence_penalty[:, None] * (counts > 0).to(sub.dtype)
    logits = logits.clone()
    logits[rows] = sub
    return logits


# Top-p over a large vocabulary sorts it whole every step (49k tokens: ~8 ms on a CPU core, a third of a real
# model's decode step). The tokens top-p keeps are almost always among the few hundred most likely: when the
# TOP_P_CANDIDATES most likely already hold the mass p, only they are sorted (topk), with the same result.
TOP_P_CANDIDATES = 1024


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                      max_top_k: int | None = None) -> torch.Tensor:
    """Keep the k most likely tokens and the smallest set whose probability reaches p (at least one token).
    ``max_top_k``: the largest of ``top_k`` when the caller knows it on the host (else it is read from the tensor,
    a device sync on a GPU)."""
    vocab = logits.shape[-1]
    if top_p is not None and top_k is None and vocab > 2 * TOP_P_CANDIDATES:
        kept = _top_p_among_candidates(logits, top_p)
        if kept is not None:
            return kept
    # With top-k, only the k_max most likely can survive: sort those (topk), not the whole vocabulary (a 49k sort
    # per row cost ~2.4 ms a row, 76 ms a step at batch 32, against 2.4 ms)
    width = vocab if top_k is None else max_top_k if max_top_k is not None else int(top_k.max())
    if width <= vocab // 2:
        sorted_logits, order = logits.topk(width, dim=-1)
    else:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        width = vocab
    if top_k is not None:
        ranks = torch.arange(width, device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    if top_p is not None:
        # float64 sums: a float32 cumsum over a flat 49k-token row (what reaches this full sort) drifts by ~1e-4,
        # enough to move a p = 0.99 cutoff by a few tokens depending on the CPU's summation order
        probs = (sorted_logits - sorted_logits.logsumexp(-1, keepdim=True)).double().exp()
        mass_before = probs.cumsum(-1) - probs
        drop = mass_before >= top_p[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    if width < vocab:
        return torch.full_like(logits, float("-inf")).scatter_(1, order, sorted_logits)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _top_p_among_candidates(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor | None:
    """Top-p from the TOP_P_CANDIDATES most likely tokens of each row, or None when some row's candidates hold
    less than its p (then the full sort decides)."""
    values, order = logits.topk(TOP_P_CANDIDATES, dim=-1)  # sorted, descending
    probs = (values - logits.logsumexp(-1, keepdim=True)).exp()
    mass_before = probs.cumsum(-1) - probs
    if bool((mass_before[:, -1] + probs[:, -1] < top_p).any()):
        return None
    drop = mass_before >= top_p[:, None]
    drop[:, 0] = False
    return torch.full_like(logits, float("-inf")).scatter_(1, order, values.masked_fill(drop, float("-inf")))
