"""Load the runner-side proposer a ``SpeculativeConfig`` names (the executor calls this once at start-up)."""

from __future__ import annotations

from pathlib import Path

import torch

from cinq.assets import resolve_model_path
from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaForCausalLM
from cinq.model.loader import load_model
from cinq.spec.config import SpeculativeConfig
from cinq.spec.draft_model import DraftModelProposer, check_draft_compatible
from cinq.spec.eagle import load_eagle_head
from cinq.spec.eagle_proposer import EagleProposer
from cinq.spec.medusa import load_medusa_heads
from cinq.spec.medusa_proposer import MedusaProposer
from cinq.spec.proposer import PagedKVProposer, Proposer


def resolve_spec_model(name: str) -> Path:
    """``speculative_config.model`` as a folder: a path, or the name of an embedded model ("cinq-tiny-student");
    anything else is the resolver's one-line ModelLoadError naming ``speculative_config.model``."""
    return resolve_model_path(name, "speculative_config.model")


def load_proposer(spec: SpeculativeConfig | None, target_path: str | Path, target: LlamaForCausalLM,
                  dtype: torch.dtype, device: torch.device, attention_backend: str, seed: int) -> Proposer | None:
    """The proposer that runs in the model runner for ``spec`` (None: no speculation, or n-gram, which the
    scheduler drafts itself)."""
    proposer = _load(spec, target_path, target, dtype, device, attention_backend, seed)
    if isinstance(proposer, PagedKVProposer):  # see PagedKVProposer.charge_gaps
        proposer.charge_gaps = spec.lookup_first  # type: ignore[union-attr]
    return proposer


def _load(spec: SpeculativeConfig | None, target_path: str | Path, target: LlamaForCausalLM, dtype: torch.dtype,
          device: torch.device, attention_backend: str, seed: int) -> Proposer | None:
    if spec is None or spec.method == "ngram":
        return None
    if spec.method in ("eagle", "eagle3", "medusa"):  # heads are built for the target's family
        from cinq.model.interface import check_supported
        check_supported(type(target), "eagle" if spec.method.startswith("eagle") else "medusa", "method")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed + 1)  # its own stream: drafting never shifts the target's sampling draws
    probabilistic = spec.draft_sample_method == "probabilistic"
    folder = resolve_spec_model(spec.model)  # type: ignore[arg-type]
    if spec.method == "draft_model":
        check_draft_compatible(folder, target_path, ModelConfig.from_pretrained(folder), target.config)
        draft = load_model(folder, dtype, device, attention_backend)
        return DraftModelProposer(draft, device, dtype, probabilistic, generator)
    if spec.method in ("eagle", "eagle3"):
        head = load_eagle_head(folder, target, dtype, device, attention_backend)
        if head.method != spec.method:
            raise InvalidParameterError(
                f"speculative_config: {folder} holds an {head.method!r} head, but method is {spec.method!r}",
                "method")
        return EagleProposer(head, target, device, dtype, probabilistic, generator, spec.tree_shape(),
                             spec.tree_topk or 0, spec.tree_depth or 0, spec.num_speculative_tokens)  # type: ignore
    if spec.method == "medusa":
        heads = load_medusa_heads(folder, target, dtype, device)
        if spec.speculative_token_tree is None and spec.num_speculative_tokens > heads.num_heads:  # type: ignore
            raise InvalidParameterError(
                f"speculative_config.num_speculative_tokens ({spec.num_speculative_tokens}) exceeds the "
                f"{heads.num_heads} Medusa heads in {folder}", "num_speculative_tokens")
        tree = spec.tree_shape()
        if tree is not None and tree.depth > heads.num_heads:
            raise InvalidParameterError(
                f"speculative_config.speculative_token_tree is {tree.depth} deep but {folder} has "
                f"{heads.num_heads} Medusa heads", "speculative_token_tree")
        return MedusaProposer(heads, probabilistic, generator, tree)
    raise InvalidParameterError(f"speculative_config.method {spec.method!r} is not built yet", "method")
