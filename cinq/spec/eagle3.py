"""EAGLE-3 heads in the layout vLLM and SpecForge use (``LlamaForCausalLMEagle3``), with a reduced draft
vocabulary.

The head (Li et al. 2025, as vLLM's ``llama_eagle3.py`` runs it): ``fc`` [H, 3 * H_target] fuses the target's
low, middle and high states; its one decoder layer normalises the token's embedding (``input_layernorm``) and
the feature (``hidden_norm``) separately and attends over their concatenation, so its q/k/v projections take
2H inputs (cinq's Llama layer takes H: the head swaps in wider q/k/v, the layer's attention itself is
unchanged); the residual is the feature itself (or its normed form with ``norm_before_residual``); a final
``norm`` gives the state the LM head reads and, pre-norm, the feature that chains to the next draft.

Reduced draft vocabulary (EAGLE-3's ``d2t``): the head's own ``lm_head`` [N, H] covers N target tokens,
``draft_ids`` (ascending); draft token i is target token ``i + d2t[i]`` (vLLM stores offsets). Its logits reach
the sampler as full-vocabulary logits, -inf outside the N tokens: a draft distribution with no mass there is
still a distribution, so rejection sampling stays exact (a token outside is only ever produced by the target's
residual distribution).

Folder: config.json with ``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``,
``target_hidden_size``, ``norm_before_residual``, ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the
feature layers, vLLM's indices: the input of each layer, as cinq's ``states``), the decoder layer's Llama keys;
model.safetensors with ``fc.weight``, ``layers.0.*`` (HF Llama names plus ``hidden_norm``), ``norm.weight``,
``lm_head.weight``, ``d2t`` [N] int64 and ``t2d`` [V] bool. Reading also takes SpecForge's ``midlayer.*`` names
and an ``embed_tokens.weight`` copy of the target's (ignored: the target's table is used). A folder written by
cinq also carries ``cinq_spec`` (the target fingerprint, cinq/spec/head_folder.py); one from elsewhere is
checked against the target by shapes only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from cinq.kernels.metadata import AttentionMetadata
from cinq.layers.linear import make_linear
from cinq.layers.norm import RMSNorm
from cinq.layers.weight_loader import CheckpointTensor
from cinq.model.config import ModelConfig
from cinq.model.llama import STACKED_PARAMS_MAPPING, _merged_linear
from cinq.model.registry import ModelRegistry
from cinq.model.saver import hf_config_dict
from cinq.spec.draft_vocab import DraftVocab
from cinq.spec.eagle_features import HeadLayer, check_feature_layers, default_feature_layers, head_layer_config
from cinq.spec.head_folder import HeadSpec

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Spellings other writers use for the same layout (vLLM's own class name, the speculators' renaming).
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")


class Eagle3Head(HeadLayer):
    """An EAGLE-3 head in vLLM's layout (see the module docstring). ``config`` is its decoder layer's config."""

    stacked_params_mapping = STACKED_PARAMS_MAPPING
    method = "eagle3"

    def __init__(self, config: ModelConfig, feature_layers: tuple[int, ...], target_hidden_size: int,
                 draft_ids: torch.Tensor, embed_tokens: nn.Embedding,
                 target_logits: Callable[[torch.Tensor], torch.Tensor], spec: HeadSpec,
                 attention_backend: str = "sdpa", dtype: torch.dtype | None = None,
                 norm_before_residual: bool = False) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.feature_layers = tuple(feature_layers)
        self.target_hidden_size = target_hidden_size
        self.spec = spec
        self.norm_before_residual = norm_before_residual
        # tuples, not attributes nn.Module would register: the target's weights stay the target's
        self._target_embed = (embed_tokens,)
        self._target_logits = (target_logits,)
        self.vocab_size = config.vocab_size
        self.register_buffer("draft_ids", draft_ids.to(embed_tokens.weight.device, torch.long), persistent=False)
        self._ascending = bool((draft_ids[1:] > draft_ids[:-1]).all())
        self.fc = make_linear(len(self.feature_layers) * target_hidden_size, hidden, False, None, "fc", dtype)
        layer = ModelRegistry.model_class(config.architecture).decoder_layer(config, "layers.0", attention_backend,
                                                                             dtype)
        attn = layer.self_attn
        shards = {"q": ("q_proj", attn.q_size), "k": ("k_proj", attn.kv_size), "v": ("v_proj", attn.kv_size)}
        # the layer attends over concat(normed embedding, normed feature): 2H inputs (vLLM's qkv_input_size)
        attn.qkv_proj = _merged_linear(2 * hidden, shards, config.attention_bias, None, "layers.0.self_attn",
                                       "qkv_proj", dtype)
        layer.hidden_norm = RMSNorm(hidden, eps)
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = make_linear(hidden, len(draft_ids), False, None, "lm_head", dtype)

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_ids.numel())

    def fuse(self, features: list[torch.Tensor]) -> torch.Tensor:
        """The target states at ``feature_layers`` (each [..., H_target]) -> the head's input feature [..., H]."""
        if len(features) != len(self.feature_layers):
            raise ValueError(f"eagle3 head: expected {len(self.feature_layers)} feature tensors (layers "
                             f"{self.feature_layers}), got {len(features)}")
        return self.fc(torch.cat(features, dim=-1))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings from the target's table."""
        return self._target_embed[0](token_ids)

    def forward(self, token_ids: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``EagleHead.forward``: (pre-norm feature that chains, normed state for ``compute_logits``)."""
        layer = self.layers[0]
        embeds = layer.input_layernorm(self.embed(token_ids).to(feature.dtype))
        normed_feature = layer.hidden_norm(feature)
        residual = normed_feature if self.norm_before_residual else feature
        hidden, residual = self.layer_forward(positions, torch.cat([embeds, normed_feature], dim=-1), residual, meta)
        normed, prenorm = self.norm(hidden, residual)
        return prenorm, normed

    def draft_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., N] logits over the draft vocabulary."""
        return self.lm_head(normed)

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., V] float32 logits over the target's vocabulary: the draft vocabulary's, -inf elsewhere."""
        return DraftVocab(self.draft_ids, self.vocab_size).widen(self.draft_logits(normed))

    def draft_vocab(self) -> DraftVocab | None:
        """What ``draft_logits``' columns are, when their ids ascend (a folder's ``d2t`` need not: then None, and
        drafts come from ``compute_logits``)."""
        return DraftVocab(self.draft_ids, self.vocab_size) if self._ascending else None

    def hf_config(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """config.json of this head's folder (vLLM's keys, plus ``cinq_spec``)."""
        cfg = hf_config_dict(self.config, dtype)
        cfg["architectures"] = [ARCHITECTURE]
        cfg["draft_vocab_size"] = self.draft_vocab_size
        cfg["target_hidden_size"] = self.target_hidden_size
        cfg["norm_before_residual"] = self.norm_before_residual
        cfg["tie_word_embeddings"] = False
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.feature_layers),
                               "use_aux_hidden_state": True}
        cfg["cinq_spec"] = self.spec.to_dict()
        return cfg

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """The vocabulary maps written next to the weights: ``d2t`` offsets [N] and the ``t2d`` mask [V]."""
        ids = self.draft_ids.cpu()
        t2d = torch.zeros(self.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        return {"d2t": ids - torch.arange(len(ids)), "t2d": t2d}


def draft_ids_from_d2t(d2t: torch.Tensor, vocab_size: int, source: str) -> torch.Tensor:
    """Target ids of the draft tokens from vLLM's offsets, which must give distinct ids inside the vocabulary."""
    from cinq.errors import ModelLoadError
    ids = d2t.to(torch.long) + torch.arange(d2t.numel())
    if d2t.dim() != 1 or ids.min() < 0 or ids.max() >= vocab_size or ids.unique().numel() != ids.numel():
        raise ModelLoadError(f"{source}: d2t must map each draft token to a distinct target token below "
                             f"vocab_size {vocab_size}", "model")
    return ids


def renamed_tensors(tensors: Iterator[CheckpointTensor], embed_shape: tuple[int, ...], source: str
                    ) -> Iterator[CheckpointTensor]:
    """The folder's weight tensors under cinq's names (SpecForge's ``midlayer.`` is ``layers.0.``), lazily;
    ``d2t`` / ``t2d`` (read by ``stored_d2t``) and a stored copy of the target's embedding are skipped (a copy
    of another shape is refused, naming it)."""
    from cinq.errors import ModelLoadError
    for t in tensors:
        name = t.name.replace("midlayer.", "layers.0.", 1)
        if name in ("d2t", "t2d"):
            continue
        if name in ("embed_tokens.weight", "model.embed_tokens.weight"):
            if tuple(t.shape) != tuple(embed_shape):
                raise ModelLoadError(f"{source}: {t.name} has shape {list(t.shape)}, the target's embedding is "
                                     f"{list(embed_shape)}", "model")
            continue
        yield CheckpointTensor(name, t.shape, t.read, t.index)


def stored_d2t(tensors: Iterator[CheckpointTensor]) -> torch.Tensor | None:
    """The folder's ``d2t`` tensor, read; None when it stores none."""
    for t in tensors:
        if t.name == "d2t":
            return t.read(None).clone()
    return None


def new_eagle3_head(target: Any, draft_ids: torch.Tensor, feature_layers: tuple[int, ...] | None = None,
                    seed: int = 0, attention_backend: str = "sdpa", target_name: str = "") -> Eagle3Head:
    """A fresh head for ``target`` over the draft vocabulary ``draft_ids`` (float32, on the target's device):
    N(0, 0.02) matrices, unit norms, and the LM head started from the target's rows of those tokens (the head's
    normed state is trained to stand where the target's is, so the target's rows are the head start)."""
    from cinq.model.loader import default_dtype
    from cinq.spec.head_folder import TargetFingerprint
    num_layers = target.config.num_hidden_layers
    layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers("eagle3", num_layers)
    check_feature_layers("eagle3", layers, num_layers, "new head")
    ids = check_draft_ids(draft_ids, target.config.vocab_size, "new head")
    spec = HeadSpec("eagle3", TargetFingerprint.of(target, target_name), layers)
    device = target.model.embed_tokens.weight.device
    with default_dtype(torch.float32), torch.device(device):
        head = Eagle3Head(head_layer_config(target.config), layers, target.config.hidden_size, ids,
                          target.model.embed_tokens, target.compute_logits, spec, attention_backend)
    gen = torch.Generator().manual_seed(seed)
    lm_weight = getattr(target.lm_head, "weight", None)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "lm_head.weight" and lm_weight is not None:
                p.copy_(lm_weight[ids.to(lm_weight.device)].float())
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return head


def check_draft_ids(ids: torch.Tensor, vocab_size: int, source: str) -> torch.Tensor:
    """``ids`` as ascending distinct target ids inside the vocabulary, or InvalidParameterError naming the
    draft vocabulary."""
    from cinq.errors import InvalidParameterError
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() == 0 or ids.min() < 0 or ids.max() >= vocab_size or ids.unique().numel() != ids.numel():
        raise InvalidParameterError(f"{source}: the draft vocabulary must be 1 to {vocab_size} distinct target "
                                    f"token ids below {vocab_size}", "draft_vocab_size")
    return ids.sort().values


def load_eagle3_head(path: Any, cfg: dict[str, Any], target: Any, dtype: torch.dtype, device: Any,
                     attention_backend: str) -> Eagle3Head:
    """Load a vLLM-layout EAGLE-3 folder (config.json already read as ``cfg``) onto ``target``."""
    from pathlib import Path

    from cinq.errors import InvalidParameterError, ModelLoadError
    from cinq.model.loader import default_dtype
    from cinq.spec.head_folder import HeadSpec, TargetFingerprint, head_tensors, load_into
    source = str(Path(path) / "config.json")
    tc = target.config
    keys = {k: v for k, v in cfg.items() if k not in ("architectures", "cinq_spec", "eagle_config")}
    config = ModelConfig.from_dict({**keys, "architectures": ["LlamaForCausalLM"]}, source)
    target_hidden = int(cfg.get("target_hidden_size") or config.hidden_size)
    for name, mine, theirs in (("target_hidden_size", target_hidden, tc.hidden_size),
                               ("vocab_size", config.vocab_size, tc.vocab_size),
                               ("num_hidden_layers", config.num_hidden_layers, 1)):
        if mine != theirs:
            raise InvalidParameterError(f"{source}: {name} is {mine}, the target needs {theirs}", "model")
    if "cinq_spec" in cfg:
        spec = HeadSpec.from_dict(cfg["cinq_spec"], source)
        spec.target.check(target, source)
        layers = spec.feature_layers
    else:  # written elsewhere: the layer ids vLLM reads, or vLLM's default choice
        layer_ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
            or cfg.get("eagle_aux_hidden_state_layer_ids")
        layers = tuple(int(i) for i in layer_ids) if layer_ids else default_feature_layers("eagle3",
                                                                                            tc.num_hidden_layers)
        spec = HeadSpec("eagle3", TargetFingerprint.of(target, ""), layers)
    check_feature_layers("eagle3", layers, tc.num_hidden_layers, source)
    d2t = stored_d2t(head_tensors(path))
    n = int(cfg.get("draft_vocab_size") or config.vocab_size)
    if d2t is None:
        if n != config.vocab_size:
            raise ModelLoadError(f"{source}: draft_vocab_size {n} < vocab_size needs a d2t tensor", "model")
        ids = torch.arange(n)
    else:
        if tuple(d2t.shape) != (n,):
            raise ModelLoadError(f"{source}: d2t has shape {list(d2t.shape)}, draft_vocab_size is {n}", "model")
        ids = draft_ids_from_d2t(d2t, config.vocab_size, source)
    with default_dtype(dtype), torch.device(device):
        head = Eagle3Head(config, layers, target_hidden, ids, target.model.embed_tokens, target.compute_logits, spec,
                          attention_backend, dtype, bool(cfg.get("norm_before_residual", False)))
    load_into(head, path, renamed_tensors(head_tensors(path), tuple(target.model.embed_tokens.weight.shape), source))
    return head.eval()
