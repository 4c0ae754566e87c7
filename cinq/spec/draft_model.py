"""Draft-model proposer (``method: draft_model``): a second, smaller model with the target's vocabulary runs in
the same runner, with its own paged KV tensors over the target's block tables.

Its KV follows the target's committed tokens lazily: when a request wants drafts, the draft first runs over
its tokens from where its own KV stops being valid up to the verify's known token (one batched forward for
every speculating request; the prompt too, the first time), which also yields the first draft; then one
batched step per further draft. A step without drafts (speculation off) runs nothing. A request's draft KV is
valid up to the first position whose token the draft did not see: after a verify step that is the last
committed draft it computed (a k-th accepted draft it never fed itself, so the next catch-up re-feeds it). A
fresh request trusts the positions the target trusts, prefix-cache hits included: blocks computed by a request
whose draft never caught up over them then hold other K/V, which costs acceptance, never exactness.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaForCausalLM
from cinq.spec.proposer import DraftSampling, PagedKVProposer, Proposals, StepView, draft_chains
from cinq.step.batch_inputs import build_batch
from cinq.step.scheduler_output import ScheduledSeq

log = logging.getLogger(__name__)


def check_draft_compatible(draft_dir: str | Path, target_dir: str | Path, draft: ModelConfig,
                           target: ModelConfig) -> None:
    """A draft must speak the target's tokens: same vocabulary size and, when both folders ship a tokenizer.json,
    the same vocabulary. Raises InvalidParameterError naming ``speculative_config.model``."""
    if draft.vocab_size != target.vocab_size:
        raise InvalidParameterError(
            f"speculative_config.model: the draft's vocab_size {draft.vocab_size} differs from the target's "
            f"{target.vocab_size}; a draft must share the target's tokenizer", "model")
    vocabs = [_tokenizer_vocab(Path(d)) for d in (draft_dir, target_dir)]
    if vocabs[0] is not None and vocabs[1] is not None and vocabs[0] != vocabs[1]:
        raise InvalidParameterError(
            "speculative_config.model: the draft's tokenizer.json vocabulary differs from the target's; a draft "
            "must share the target's tokenizer", "model")


def _tokenizer_vocab(folder: Path) -> dict | None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = data.get("model", {}).get("vocab")
    return vocab if isinstance(vocab, dict) else None


class DraftModelProposer(PagedKVProposer):
    """Proposes with ``model``; ``probabilistic``: sample drafts from the draft's distribution (else argmax)."""

    layer_state_ids: tuple[int, ...] = ()

    def __init__(self, model: LlamaForCausalLM, device: torch.device, kv_dtype: torch.dtype,
                 probabilistic: bool, generator: torch.Generator) -> None:
        super().__init__(device, kv_dtype, probabilistic, generator)
        self.model = model
        self.valid: dict[str, int] = {}  # request -> leading positions whose draft K/V is valid
        self._drafted: dict[str, int] = {}  # request -> drafts fed to the draft this step (k - 1)

    def kv_layers(self) -> tuple[list[torch.nn.Module], int, int]:
        cfg = self.model.config
        return self.model.attention_layers(), cfg.num_key_value_heads, cfg.head_dim

    def forget(self, request_id: str) -> None:
        self.valid.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, seqs: list[ScheduledSeq], history: dict[str, list[int]],
                sampling: dict[str, DraftSampling]) -> Proposals:
        """Catch the draft's KV up on every sequence of the step and draft ``num_draft_slots`` tokens for those
        that want them (one batched forward per draft position)."""
        out = Proposals()
        for s in seqs:
            # first sighting: trust what the target trusts (prefix-cache hits included); later, a step that starts
            # before the draft's valid end (recompute after preemption) takes the trust back to there
            v = self.valid.get(s.request_id)
            self.valid[s.request_id] = s.start_pos if v is None else min(v, s.start_pos)
        want = {s.request_id: s.num_draft_slots for s in seqs if s.num_draft_slots}
        self._drafted = {rid: k - 1 for rid, k in want.items()}
        if not want:  # speculation is off this step: the draft catches up when it is next needed
            return out
        catch_up, prompt_rows = [], []
        for s in seqs:
            if s.request_id in want:
                d, hist = self.valid[s.request_id], history[s.request_id]
                catch_up.append(ScheduledSeq(s.request_id, hist[d:s.start_pos] + s.token_ids, d, s.block_ids, 1))
                prompt_rows.append(max(0, min(s.start_pos + len(s.token_ids), len(hist) - s.num_output_tokens) - d))
        batch = build_batch(catch_up, self.block_size, self.pad_block_ids, self.device)
        hidden, out.catch_up_s = self.catch_up(lambda: self.model(batch.input_ids, batch.positions, batch.meta),
                                               [len(s.token_ids) for s in catch_up],
                                               [want[s.request_id] for s in catch_up], prompt_rows)
        live = list(zip(batch.seqs, batch.last_rows()))
        by_id = {s.request_id: s for s in seqs}
        positions = {s.request_id: s.start_pos + len(s.token_ids) for s, _ in live}  # where the next draft goes
        rows = hidden[torch.tensor([row for _, row in live], device=self.device)]

        def step(keep: list[int], ids: list[str], j: int) -> torch.Tensor:
            step_seqs = [ScheduledSeq(r, [out.token_ids[r][-1]], positions[r] + j, by_id[r].block_ids, 1)
                         for r in ids]
            batch = build_batch(step_seqs, self.block_size, self.pad_block_ids, self.device)
            hidden = self.model(batch.input_ids, batch.positions, batch.meta)
            order = {s.request_id: row for s, row in zip(batch.seqs, batch.last_rows())}
            return self.model.compute_logits(hidden[torch.tensor([order[r] for r in ids], device=self.device)])

        draft_chains([s.request_id for s, _ in live], want, sampling, self.model.compute_logits(rows), step,
                     self.probabilistic, self.generator, out)
        return out

    def commit(self, view: StepView) -> None:
        """After verification: the draft's KV stays valid through the drafts it fed that the target kept."""
        for s in view.batch.seqs:
            # a verify of drafts the draft model did not write (prompt lookup's) leaves its KV where it was
            if s.num_logit_rows > 1 and s.request_id in self._drafted:
                k = s.num_logit_rows - 1
                fed = self._drafted[s.request_id]
                last = s.start_pos + len(s.token_ids) - k - 1  # the position of the verify's known token
                self.valid[s.request_id] = last + 1 + min(view.num_accepted.get(s.request_id, 0), fed)
