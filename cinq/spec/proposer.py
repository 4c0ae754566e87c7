"""Proposers that run in the model runner: a draft model, EAGLE heads, Medusa heads (vLLM v1's ``spec_decode``
room). The n-gram drafter needs only token history and runs in the scheduler (cinq/spec/drafter.py).

The scheduler reserves ``ScheduledSeq.num_draft_slots`` draft positions (KV slots and budget) for each decoding
request; the runner asks its proposer to fill them before the target's forward, verifies the drafts in that same
forward, then tells the proposer what was kept (``commit``) so that its own state (a draft model's paged KV, an
EAGLE head's features) follows the committed tokens. Proposers write their K/V into the target's block tables
(their own KV tensors, the same block ids), so prefix caching, preemption and block freeing need nothing of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch

from cinq.host_memory import kv_cache_tensor
from cinq.sampling_params import SamplingParams
from cinq.spec.draft_vocab import DraftVocab
from cinq.step.batch_inputs import BatchInputs
from cinq.step.scheduler_output import ScheduledSeq

T = TypeVar("T")


@dataclass(slots=True)
class DraftSampling:
    """How one request's drafts are drawn: greedy (argmax, one-hot q) or from the proposer's distribution."""

    params: SamplingParams
    generator: torch.Generator | None  # the request's own (seeded) generator, else the runner's


@dataclass(slots=True)
class Proposals:
    """Per request id: the draft tokens, and the proposer's distribution q at each ([k, V]) when drafts were
    sampled from it (absent: one-hot q)."""

    token_ids: dict[str, list[int]] = field(default_factory=dict)
    probs: dict[str, torch.Tensor] = field(default_factory=dict)
    # requests whose drafts form a tree: its parent array over [root] + drafts (one shape for the whole step)
    parents: dict[str, list[int]] = field(default_factory=dict)
    # seconds of the catch-up spent on positions committed while their request did not draft (PagedKVProposer
    # .catch_up): a one-time price of having been off, not what a step with drafts costs (adaptive k leaves the
    # whole step's cost out when it is > 0, and counts its acceptance only)
    catch_up_s: float = 0.0


@dataclass(slots=True)
class StepView:
    """What the target computed this step, for a proposer's commit: the batch (drafts filled in), the target's
    hidden states (final normed, and the per-layer states the proposer asked for, in its order), the emitted tokens,
    accepted draft counts, and the rows each verify kept (root and accepted path, within its sequence; before
    the runner moved a tree path's K/V down to consecutive slots)."""

    batch: BatchInputs
    hidden: torch.Tensor
    layer_states: list[torch.Tensor] | None
    emitted: dict[str, list[int]]
    num_accepted: dict[str, int]
    kept_rows: dict[str, list[int]] = field(default_factory=dict)

    def committed_rows(self, i: int) -> list[int]:
        """Rows (within the batch) of ``batch.seqs[i]`` whose tokens the target kept, in position order."""
        s, start = self.batch.seqs[i], self.batch.starts[i]
        rows = self.kept_rows.get(s.request_id)
        if rows is None:
            return list(range(start, start + len(s.token_ids)))
        return [start + r for r in rows]


class Proposer(Protocol):
    """A runner-side proposer."""

    # the target states StepView carries (indices as LlamaModel.forward's state_ids; EAGLE-3's feature layers),
    # empty for none
    layer_state_ids: tuple[int, ...]

    def kv_bytes_per_block(self, block_size: int) -> int: ...

    def initialize_cache(self, num_blocks: int, block_size: int, pad_block_ids: list[int]) -> None: ...

    def propose(self, seqs: list[ScheduledSeq], history: dict[str, list[int]],
                sampling: dict[str, DraftSampling]) -> Proposals: ...

    def commit(self, view: StepView) -> None: ...

    def forget(self, request_id: str) -> None: ...


def draw_drafts(logits: torch.Tensor, sampling: list[DraftSampling], probabilistic: bool,
                default_generator: torch.Generator, vocab: DraftVocab | None = None
                ) -> tuple[list[int], torch.Tensor | None]:
    """One draft token per row of ``logits`` [n, V]: argmax (greedy drafting, or a greedy request), else a sample
    from softmax(logits / temperature) — then q, those rows' distributions, comes back for the rejection sampler
    (rows of greedy requests hold a one-hot q, which the greedy acceptance rule ignores). ``vocab``: the logits
    cover only its tokens (an EAGLE-3 draft vocabulary), widened to [n, V] only where a draft is sampled."""
    greedy_only = not probabilistic or all(s.params.greedy for s in sampling)
    if vocab is not None:
        if greedy_only:
            return vocab.argmax(logits).tolist(), None
        logits = vocab.widen(logits)
    greedy_ids = logits.argmax(-1)
    if greedy_only:
        return greedy_ids.tolist(), None
    temps = torch.tensor([s.params.temperature if not s.params.greedy else 1.0 for s in sampling],
                         dtype=torch.float32, device=logits.device)
    q = torch.softmax(logits.float() / temps[:, None], dim=-1)
    noise = torch.empty_like(q).exponential_(generator=default_generator)
    for i, s in enumerate(sampling):
        if s.generator is not None:
            noise[i].exponential_(generator=s.generator)
    sampled = q.div(noise).argmax(-1)  # the exponential race: a sample of q per row
    greedy = torch.tensor([s.params.greedy for s in sampling], device=logits.device)
    ids = torch.where(greedy, greedy_ids, sampled)
    q = torch.where(greedy[:, None], torch.nn.functional.one_hot(ids, q.shape[-1]).to(q.dtype), q)
    return ids.tolist(), q


def draft_chains(ids: list[str], want: dict[str, int], sampling: dict[str, DraftSampling], logits: torch.Tensor,
                 step: Callable[[list[int], list[str], int], torch.Tensor], probabilistic: bool,
                 generator: torch.Generator, out: Proposals, vocab: DraftVocab | None = None) -> None:
    """The chain loop every model proposer shares: draw one draft per request from ``logits`` [len(ids), V]
    (or over ``vocab``'s tokens), then ``step(keep, ids, j)`` (the indices of the requests that still want drafts,
    their ids, the step number) feeds their newest drafts and returns their next logits. Drafts and q rows go
    into ``out``."""
    q_rows: dict[str, list[torch.Tensor]] = {}
    for j in range(max(want[r] for r in ids)):
        tokens, q = draw_drafts(logits, [sampling[r] for r in ids], probabilistic, generator, vocab)
        for i, (rid, tok) in enumerate(zip(ids, tokens)):
            out.token_ids.setdefault(rid, []).append(tok)
            if q is not None:
                q_rows.setdefault(rid, []).append(q[i])
        keep = [i for i, rid in enumerate(ids) if len(out.token_ids[rid]) < want[rid]]
        if not keep:  # a request's last draft is never fed
            break
        ids = [ids[i] for i in keep]
        logits = step(keep, ids, j)
    out.probs.update({r: torch.stack(p) for r, p in q_rows.items()})


def paged_kv_bytes(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over ``num_layers`` layers (K and V)."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def bind_paged_kv(layers: list[torch.nn.Module], num_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                  dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """A proposer's own KV tensors, one per attention layer, over the target's block ids; bound to ``layers``."""
    caches = [kv_cache_tensor((2, num_blocks, block_size, num_kv_heads, head_dim), dtype, device) for _ in layers]
    for attn, cache in zip(layers, caches):
        attn.kv_cache = cache
    return caches


def stale_rows(rows: list[int], drafts: list[int], prompt_rows: list[int], charge_gaps: bool) -> int:
    """The catch-up rows left out of an arm's step cost (``PagedKVProposer.catch_up``): request i's rows past its
    ``drafts[i] + 1``, or, with ``charge_gaps`` (prompt lookup first), only those of them at prompt positions
    (``prompt_rows[i]``): there a lookup-drafted step leaves the head a gap every time, part of what the arm
    costs (left out, adaptive k priced EAGLE-3 + lookup's k = 1 within 2% of plain at batch 4, ran it on 61% of
    its steps, and read 0.81x)."""
    past = [max(0, r - d - 1) for r, d in zip(rows, drafts)]
    return sum(min(p, q) for p, q in zip(past, prompt_rows)) if charge_gaps else sum(past)


class PagedKVProposer:
    """The base of proposers with their own paged KV over the target's block ids (a draft model, an EAGLE head):
    how they draw drafts, and their KV, sized and bound from the attention layers ``kv_layers`` names."""

    def __init__(self, device: torch.device, kv_dtype: torch.dtype, probabilistic: bool,
                 generator: torch.Generator) -> None:
        self.device = device
        self.kv_dtype = kv_dtype
        self.probabilistic = probabilistic
        self.generator = generator
        self.block_size = 0
        self.pad_block_ids: list[int] = []
        self.kv_caches: list[torch.Tensor] = []
        # With prompt lookup first, the positions committed by lookup-drafted steps are the proposer's gap in
        # steady state, not a one-time price: only prompt positions are left out of an arm's cost (load_proposer)
        self.charge_gaps = False

    def kv_layers(self) -> tuple[list[torch.nn.Module], int, int]:
        """The proposer's attention layers, their KV heads and head size."""
        raise NotImplementedError

    def catch_up(self, forward: Callable[[], T], rows: list[int], drafts: list[int], prompt_rows: list[int]
                 ) -> tuple[T, float]:
        """Run ``forward``, the catch-up over ``rows[i]`` positions of request i, which drafts ``drafts[i]``
        tokens this step; also return the share of its wall time spent past ``drafts[i] + 1`` positions a request
        (as much as a step that drafted k commits: its known token and accepted drafts). Those positions were
        committed while the request did not draft (its prompt, or steps with speculation off): timed here so that
        adaptive k prices an arm by what its steps cost from then on, not by the re-try that pays for the gap.
        ``prompt_rows[i]``: how many of request i's rows are prompt positions (with ``charge_gaps`` only those
        are left out, ``stale_rows``). Apportioned by rows: a long catch-up is compute-bound, linear in them."""
        stale = stale_rows(rows, drafts, prompt_rows, self.charge_gaps)
        if not stale:
            return forward(), 0.0
        t0 = time.perf_counter()
        out = forward()
        if self.device.type == "cuda":  # the launches return at once: wait for the work they timed
            torch.cuda.synchronize(self.device)
        return out, (time.perf_counter() - t0) * stale / sum(rows)

    def kv_bytes_per_block(self, block_size: int) -> int:
        layers, num_kv_heads, head_dim = self.kv_layers()
        return paged_kv_bytes(len(layers), num_kv_heads, head_dim, block_size, self.kv_dtype)

    def initialize_cache(self, num_blocks: int, block_size: int, pad_block_ids: list[int]) -> None:
        """KV tensors for ``num_blocks`` blocks (the target's pool plus its scratch blocks)."""
        layers, num_kv_heads, head_dim = self.kv_layers()
        self.block_size, self.pad_block_ids = block_size, pad_block_ids
        self.kv_caches = bind_paged_kv(layers, num_kv_heads, head_dim, num_blocks, block_size, self.kv_dtype,
                                       self.device)
