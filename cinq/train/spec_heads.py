"""Train speculative heads (EAGLE, EAGLE-3, Medusa) for a frozen target, on the target's own sequences.

One loop for the three methods: the target's sequences (cinq/train/spec_head_data.py) are batched whole; each
step the frozen target runs its training-mode forward (``forward_with_hidden_states``, no grad) and the loss
compares the head's guesses with the target's next-token distributions there, forward KL(target || head):

* ``eagle`` (Li et al. 2024): teacher-forced; smooth-L1 regression of the next feature f_{t+1} (weight
  ``reg_weight``, 1.0) + the KL on x_{t+2} through the target's LM head (``cls_weight``, 0.1, the paper's);
  uniform noise of +-``feature_noise`` on the input features, as the paper.
* ``eagle3`` (Li et al. 2025): features fused from three layers, unrolled ``unroll_steps`` times over its own
  outputs (training-time test, cinq/spec/eagle_unroll.py); KL at every step, weighted 0.8^j; no regression.
* ``medusa`` (Cai et al. 2024, Medusa-1): head i's KL to the target's distribution of the token i + 2 ahead,
  weighted 0.8^i; each head with its own LM head, or (``medusa_lm_head="target"``) the target's, frozen.

The training prompts are drawn language-balanced (``prompt_mix`` balanced, the default) or in the corpus
train split's natural document proportions (natural, as many prompts); the held-out set is always balanced, so
heads trained on either mix are measured alike.

The run folder holds the cached target sequences (or ``generated_dir`` does, to share them between runs), the
resumable checkpoint (cinq/train/trainer.py: rerunning the same command resumes), ``head_job.json`` (a rerun
with other settings is refused), ``history.json``, ``summary.json`` with the held-out acceptance, and, once
finished, the head folder ``<out>/head``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cinq.assets import model_reference
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds
from cinq.kernels.cpu_native import bf16_gemm_is_emulated
from cinq.eval.spec_acceptance import Batch, measure, measure_ngram
from cinq.spec.draft_vocab import coverage, frequent_tokens
from cinq.spec.eagle import new_eagle_head, save_eagle_head
from cinq.spec.eagle3 import new_eagle3_head
from cinq.spec.eagle_unroll import unroll, valid_rows
from cinq.spec.head_folder import TargetFingerprint
from cinq.spec.medusa import new_medusa_heads, save_medusa_heads
from cinq.train.distill import load_teacher
from cinq.train.losses import forward_kl
from cinq.plan.cpu import cpu_label
from cinq.train.seqkd import PROMPT_MIXES
from cinq.train.spec_head_data import (GenerationSettings, SequenceSampler, TargetSequences, sequences_identity,
                                       target_sequences)
from cinq.train.spec_head_prompts import CHAT_MIXES, is_chat_source
from cinq.train.trainer import Trainer
from cinq.train.training_run import GeneratingRunControls, run_training, train_settings

log = logging.getLogger(__name__)
HEAD_METHODS = ("eagle", "eagle3", "medusa")
DEPTH_DECAY = 0.8  # weight of unrolled step / Medusa head j: 0.8^j (EAGLE-3's and Medusa's choice)
# Settings a resumed run must share with its checkpoint: they change the objective or the data.
_JOB_IDENTITY = ("method", "target", "data_dir", "batch_size", "lr", "seed", "train_prompts", "max_prompt",
                 "max_tokens", "sample_temperature", "generator", "unroll_steps", "num_heads", "medusa_lm_head",
                 "feature_layers", "reg_weight", "cls_weight", "feature_noise", "prompt_mix", "draft_vocab_size")
# What a run folder written before a setting existed was made with.
_EARLIER_DEFAULTS = {"prompt_mix": "balanced", "draft_vocab_size": 0}


@dataclass(slots=True)
class HeadJob(GeneratingRunControls):
    """One head-training run (see the module docstring)."""

    method: str
    target: str  # the target model folder
    data_dir: str
    out_dir: str
    token_budget: int = 400_000  # padded tokens seen (batch_size x longest sequence of each batch, nominal)
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20
    train_prompts: int = bounded(1100, ge=1)
    prompt_mix: str = "balanced"  # balanced / natural (the corpus's proportions) / english (all English)
    eval_prompts: int = bounded(110, ge=1)
    max_prompt: int = bounded(24, ge=2)
    max_tokens: int = bounded(128, ge=1)
    eval_max_tokens: int = bounded(96, ge=1)
    generated_dir: str | None = None  # where target sequences are cached (default: out_dir)
    unroll_steps: int = bounded(3, ge=1)
    num_heads: int = bounded(4, ge=1)
    medusa_lm_head: str = "own"  # own: one trainable LM head per Medusa head; target: the target's, shared, frozen
    feature_layers: tuple[int, ...] | None = None
    # eagle3: > 0 trains a head in vLLM's EAGLE-3 layout with its own LM head over the draft_vocab_size most
    # frequent tokens of the target's training outputs (cinq/spec/eagle3.py); 0: cinq's earlier layout, which
    # drafts through the target's LM head
    draft_vocab_size: int = 0
    reg_weight: float = 1.0
    cls_weight: float = 0.1
    feature_noise: float = 0.1
    draft_k: int = bounded(4, ge=1)
    eval_every: int = 50

    def __post_init__(self) -> None:
        self.check_generator()
        if self.method not in HEAD_METHODS:
            raise InvalidParameterError(f"heads must be one of {list(HEAD_METHODS)}, got {self.method!r}", "heads")
        mixes = CHAT_MIXES if is_chat_source(self.data_dir) else PROMPT_MIXES
        if self.prompt_mix not in mixes:
            raise InvalidParameterError(f"prompt_mix must be one of {list(mixes)} for data {self.data_dir!r}, got "
                                        f"{self.prompt_mix!r}", "prompt_mix")
        if self.medusa_lm_head not in ("own", "target"):
            raise InvalidParameterError(f"medusa_lm_head must be own or target, got {self.medusa_lm_head!r}",
                                        "medusa_lm_head")
        check_bounds(self)
        if self.draft_vocab_size < 0 or (self.draft_vocab_size and self.method != "eagle3"):
            raise InvalidParameterError(f"draft_vocab_size must be 0, or > 0 with eagle3 heads; got "
                                        f"{self.draft_vocab_size} for {self.method}", "draft_vocab_size")
        if self.feature_layers is not None:
            self.feature_layers = tuple(int(i) for i in self.feature_layers)

    @property
    def seq_len(self) -> int:
        """The longest sequence a batch can hold (prompt + continuation)."""
        return self.max_prompt + self.max_tokens


class HeadTrainer:
    """Builds the head, the target's sequences, the loss and the evaluation, and runs the shared Trainer."""

    def __init__(self, job: HeadJob) -> None:
        self.job = job
        torch.manual_seed(job.seed)
        self.out = Path(job.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_same_job()
        self.target_dir = Path(job.target)
        self.target = load_teacher(self.target_dir)
        self.fingerprint = TargetFingerprint.of(self.target, self.target_dir.name)
        self.eos = list(self.target.config.eos_token_ids)
        cache = Path(job.generated_dir) if job.generated_dir else self.out
        gen = GenerationSettings("train", job.train_prompts, job.max_prompt, job.max_tokens, job.sample_temperature,
                                 job.seed, job.generator, prompt_mix=job.prompt_mix)
        identity = sequences_identity(self.target_dir, self.target, self.fingerprint.fingerprint)
        self.train_seqs = target_sequences(self.target_dir, self.target, job.data_dir, gen, cache, identity, self.eos)
        self.eval_seqs = target_sequences(self.target_dir, self.target, job.data_dir, held_out_settings(job), cache,
                                          identity, self.eos)
        self.draft_ids: torch.Tensor | None = None
        self.draft_rows: torch.Tensor | None = None  # the target LM head's rows of the draft vocabulary
        if job.method == "medusa":
            self.head: Any = new_medusa_heads(self.target, job.num_heads, target_name=self.target_dir.name,
                                              original_lm_head=job.medusa_lm_head == "target")
        elif job.draft_vocab_size:
            self.draft_ids = frequent_tokens(generated_tokens(self.train_seqs), job.draft_vocab_size,
                                             self.target.config.vocab_size)
            self.head = new_eagle3_head(self.target, self.draft_ids, job.feature_layers, job.seed,
                                        target_name=self.target_dir.name)
            self.draft_rows = _draft_rows(self.target, self.draft_ids)
        else:
            self.head = new_eagle_head(self.target, job.method, job.feature_layers, job.seed,
                                       target_name=self.target_dir.name)
        self.sampler = SequenceSampler(self.train_seqs, job.batch_size, job.seed)

    def _check_same_job(self) -> None:
        path = self.out / "head_job.json"
        mine = {k: _jsonable(getattr(self.job, k)) for k in _JOB_IDENTITY}
        if path.is_file():
            saved = {**_EARLIER_DEFAULTS, **json.loads(path.read_text())}
            changed = sorted(k for k in _JOB_IDENTITY if k in saved and saved[k] != mine[k])
            if changed:
                raise InvalidParameterError(
                    f"{self.out} holds a head run made with " + ", ".join(f"{k}={saved[k]}" for k in changed)
                    + "; this run asks for " + ", ".join(f"{k}={mine[k]}" for k in changed)
                    + ": rerun with the same settings to resume, or use a new --out", changed[0])
        path.write_text(json.dumps(mine, indent=1) + "\n")

    # -- the loss ----------------------------------------------------------------------------------------------
    def loss(self, batch: tuple[torch.Tensor, torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        tokens, lengths = batch
        s = tokens.shape[1]
        with torch.no_grad():
            final, states = self.target.forward_with_hidden_states(tokens)
            # an EAGLE-3 head with a draft vocabulary is scored on those tokens only: their rows of the LM head
            # (1/6 of SmolLM2's 49k-row product, and no [B, S, 49k] logits tensor per step)
            t_logits = (self.target.compute_logits(final) if self.draft_rows is None
                        else F.linear(final, self.draft_rows).float())
        inside = torch.arange(s)[None, :] < lengths[:, None]  # [B, S]: real tokens, not padding
        if self.job.method == "medusa":
            return self._medusa_loss(final, t_logits, inside)
        # row i: the head at position i, fed the token after i; its guess is scored against the target's
        # distribution at i + 1 (of token i + 2), which exists for rows i + 1 < length
        rows = inside[:, 1:]
        labels = t_logits[:, 1:]
        feats = self.head.fuse([states[i] for i in self.head.feature_layers])[:, :-1]
        next_tokens = tokens[:, 1:]
        if self.job.method == "eagle":
            return self._eagle_loss(next_tokens, feats, final[:, 1:], labels, rows, step)
        return self._eagle3_loss(next_tokens, feats, labels, rows)

    def _eagle_loss(self, next_tokens: torch.Tensor, feats: torch.Tensor, next_feats: torch.Tensor,
                    labels: torch.Tensor, rows: torch.Tensor, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        j = self.job
        if j.feature_noise > 0:
            gen = torch.Generator().manual_seed(int(np.random.default_rng([j.seed, step, 13]).integers(1 << 62)))
            feats = feats + (torch.rand(feats.shape, generator=gen) * 2 - 1).to(feats) * j.feature_noise
        positions = torch.arange(feats.shape[1]).expand(feats.shape[0], -1)
        out, normed = self.head(next_tokens, feats, positions, None)
        logits = self.head.compute_logits(normed)
        kl = forward_kl(logits, labels, mask=rows)
        per_row = F.smooth_l1_loss(out.float(), next_feats.float(), reduction="none").mean(-1)
        reg = (per_row * rows).sum() / rows.sum().clamp_min(1)
        total = j.reg_weight * reg + j.cls_weight * kl
        return total, {"kl": float(kl.detach()), "reg": float(reg.detach()), "acc": _top1(logits, labels, rows)}

    def _eagle3_loss(self, next_tokens: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor,
                     rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        total = torch.zeros(())
        metrics: dict[str, float] = {}
        if self.draft_ids is not None and self.draft_rows is None:  # the draft vocabulary's logits, renormalised
            labels = labels[..., self.draft_ids]
        for step, (_, normed) in enumerate(unroll(self.head, next_tokens, feats, self.job.unroll_steps)):
            mask = rows & valid_rows(rows.shape[1], step)[None, :]
            logits = self.head.draft_logits(normed) if self.draft_ids is not None else self.head.compute_logits(normed)
            kl = forward_kl(logits, labels, mask=mask)
            total = total + DEPTH_DECAY ** step * kl
            metrics[f"kl_{step}"] = float(kl.detach())
            metrics[f"acc_{step}"] = _top1(logits, labels, mask)
        return total, metrics

    def _medusa_loss(self, final: torch.Tensor, t_logits: torch.Tensor, inside: torch.Tensor
                     ) -> tuple[torch.Tensor, dict[str, float]]:
        total = torch.zeros(())
        metrics: dict[str, float] = {}
        s = final.shape[1]
        for i in range(self.head.num_heads):
            n = s - 1 - i  # position t guesses token t + 2 + i: the target's distribution at t + 1 + i
            if n <= 0:
                break
            logits = self.head.head_logits(final[:, :n], i)
            labels, mask = t_logits[:, 1 + i:], inside[:, 1 + i:]
            kl = forward_kl(logits, labels, mask=mask)
            total = total + DEPTH_DECAY ** i * kl
            metrics[f"kl_{i}"] = float(kl.detach())
            metrics[f"acc_{i}"] = _top1(logits, labels, mask)
        return total, metrics

    # -- evaluation --------------------------------------------------------------------------------------------
    def eval_batches(self, limit: int | None = None) -> list[Batch]:
        """The held-out sequences in batches of 16 (``limit``: that many, spread over the languages)."""
        return held_out_batches(self.eval_seqs, limit)

    def acceptance(self, limit: int | None = None) -> dict[str, Any]:
        return measure(self.head, self.target, self.eval_batches(limit), self._k())

    def _k(self) -> int:
        return min(self.job.draft_k, self.head.num_heads) if self.job.method == "medusa" else self.job.draft_k

    def eval_fn(self) -> Any:
        def evaluate() -> dict[str, float]:
            r = self.acceptance(limit=44)["all"]
            return {"tau": r["tau"], **{f"accept_{j + 1}": a for j, a in enumerate(r["accept_rate"])}}
        return evaluate

    # -- the run -----------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        j = self.job
        n_params = sum(p.numel() for p in self.head.parameters())
        # bf16 autocast only where bf16 GEMMs are native: emulated (AVX2), a step of the target's training forward
        # ran ~50x slower than in float32 (SmolLM2, batch 8 x 176)
        settings = train_settings(j, {"job": _jsonable(asdict(j)), "head_parameters": n_params},
                                  weight_decay=0.0, log_every=5, bf16=not bf16_gemm_is_emulated())
        trainer = Trainer(self.head, self.loss, self.sampler.batch, settings, eval_fn=self.eval_fn())
        log.info("training %s heads for %s (%.2fM parameters): %d steps on %d target sequences (%d tokens)",
                 j.method, j.target, n_params / 1e6, settings.total_steps, len(self.train_seqs),
                 self.train_seqs.num_tokens)

        def export(summary: dict[str, Any]) -> None:
            self.head.eval()
            summary["acceptance"] = self.acceptance()
            if self.draft_ids is not None:
                vocab = self.target.config.vocab_size
                summary["draft_vocab"] = {
                    "size": int(self.draft_ids.numel()),
                    "coverage_train": coverage(self.draft_ids, generated_tokens(self.train_seqs), vocab),
                    "coverage_held_out": coverage(self.draft_ids, generated_tokens(self.eval_seqs), vocab)}
            summary["acceptance_ngram"] = measure_ngram(self.eval_batches(), self._k())
            self.head.spec.training = {k: summary[k] for k in (
                "step", "tokens_seen", "elapsed_s", "final_loss", "train_data", "eval_data", "acceptance")}
            self.head.spec.training["job"] = {k: v for k, v in summary["job"].items()
                                              if k not in ("out_dir", "progress", "generated_dir")}
            self.head.spec.training["job"]["target"] = model_reference(j.target)  # no path of this machine
            save = save_medusa_heads if j.method == "medusa" else save_eagle_head
            summary["head_dir"] = str(save(self.head, self.out / "head", torch.bfloat16))
        return run_training(trainer, {
            "head_parameters": n_params, "job": _jsonable(asdict(j)), "train_data": _describe(self.train_seqs),
            "eval_data": _describe(self.eval_seqs), "cpu": cpu_label(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__}, export)


def _draft_rows(target: Any, draft_ids: torch.Tensor) -> torch.Tensor | None:
    """The target LM head's rows of ``draft_ids`` [N, hidden] when its logits are a plain product with a dense
    float weight (Llama-family heads: no soft-capping or scaling in compute_logits), else None (full logits)."""
    from cinq.model.llama import LlamaForCausalLM
    head = getattr(target, "lm_head", None)
    w = getattr(head, "weight", None)
    if (getattr(type(target), "compute_logits", None) is not LlamaForCausalLM.compute_logits
            or not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2
            or w.shape[0] != target.config.vocab_size
            or getattr(head, "bias", None) is not None):
        return None
    return w.detach()[draft_ids].contiguous()


def held_out_settings(job: HeadJob) -> GenerationSettings:
    """How ``job``'s held-out set is made: the test split, language-balanced, greedy, float32 (the target's argmax
    as the training-mode forward computes it)."""
    return GenerationSettings("test", job.eval_prompts, job.max_prompt, job.eval_max_tokens, 0.0, job.seed,
                              job.generator, "float32")


def held_out_batches(seqs: TargetSequences, limit: int | None = None) -> list[Batch]:
    """``seqs`` in batches of 16 for ``measure`` (``limit``: that many, spread over the languages)."""
    n = len(seqs) if limit is None else min(limit, len(seqs))
    # spread a limited subset over the languages (the set is stored language by language)
    order = np.linspace(0, len(seqs) - 1, n).round().astype(int).tolist() if limit else list(range(n))
    out = []
    for b in range(0, n, 16):
        rows = order[b:b + 16]
        tokens, lengths = seqs.padded(rows)
        out.append((tokens, lengths, torch.from_numpy(seqs.prompt_lens[rows]), [str(seqs.langs[r]) for r in rows]))
    return out


def generated_tokens(seqs: TargetSequences) -> np.ndarray:
    """The tokens the target wrote (each sequence past its prompt): what a head drafts for."""
    return np.concatenate([seqs.sequence(i)[int(seqs.prompt_lens[i]):] for i in range(len(seqs))] or [np.zeros(0)])


def _top1(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    """How often the head's top token is the target's, over ``mask``."""
    with torch.no_grad():
        same = (logits.argmax(-1) == labels.argmax(-1)) & mask
        return float(same.sum()) / max(1, int(mask.sum()))


def _describe(seqs: TargetSequences) -> dict[str, Any]:
    langs, counts = np.unique(seqs.langs, return_counts=True)
    return {"sequences": len(seqs), "tokens": seqs.num_tokens,
            "generated_tokens": int(seqs.num_tokens - seqs.prompt_lens.sum()),
            "per_language": {str(a): int(c) for a, c in zip(langs, counts)},
            "generation_s": seqs.info.get("elapsed_s")}


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def train_heads(job: HeadJob) -> dict[str, Any]:
    """Run one head-training job (resuming from ``out_dir`` when it holds a checkpoint)."""
    return HeadTrainer(job).run()
