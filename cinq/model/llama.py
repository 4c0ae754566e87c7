"""One decoder for Llama, Mistral, Qwen2 and Qwen3; module names mirror HF, except the merged projections.

q/k/v are one ``qkv_proj`` and gate/up one ``gate_up_proj`` (one GEMM instead of three and two; outputs split
afterwards); ``STACKED_PARAMS_MAPPING`` says which checkpoint tensors fill which of their shards (the loader
and the saver both go through it). ``merge_projections=False`` keeps HF's separate projections: the offline
quantization tool works on those, and a quantized checkpoint whose q/k/v (or gate/up) are not all of one kind
loads that way too.

Two ways to call it:

* serving: ``model(input_ids [T], positions [T], meta)`` on a flat varlen batch with the paged KV cache;
* training / scoring: ``model(input_ids [B, S])`` — plain causal attention, no cache.
"""

from __future__ import annotations

import torch
from torch import nn

from cinq.distributed.parallel_state import current_shard
from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.layers.activation import gated_act
from cinq.layers.attention import Attention
from cinq.layers.linear import DenseLinear, LinearFactory, can_merge, make_linear
from cinq.layers.linear_split import LinearSplit
from cinq.layers.vocab_parallel import ParallelLMHead, token_embedding
from cinq.model.decode_layers import DecodeLayers, build_decode_layers
from cinq.layers.weight_loader import OutputShards
from cinq.layers.norm import RMSNorm
from cinq.layers.rotary import RotaryEmbedding
from cinq.model.config import ModelConfig
from cinq.model.tp_layout import TPLayout


# (model module suffix, checkpoint module suffix, shard id): checkpoint tensors that fill one shard of a merged
# linear (as vLLM's stacked_params_mapping).
STACKED_PARAMS_MAPPING: tuple[tuple[str, str, str | int], ...] = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


def _merged_linear(in_features: int, shards: dict[str | int, tuple[str, int]], bias: bool,
                   quant: LinearFactory | None, prefix: str, name: str, dtype: torch.dtype | None,
                   split: LinearSplit | None = None) -> nn.Module:
    """The merged linear ``prefix.name`` over ``shards`` (id -> (checkpoint module name, out_features))."""
    first = next(iter(shards.values()))[0]
    output_shards = OutputShards(tuple(shards), tuple(size for _, size in shards.values()))
    return make_linear(in_features, output_shards.total, bias, quant, f"{prefix}.{name}", dtype, output_shards,
                       quant_prefix=f"{prefix}.{first}", split=split)


class LlamaAttention(nn.Module):
    """Self-attention block: q/k/v projections (+ bias for Qwen2, + q/k RMSNorm for Qwen3), rope, attention.

    Under tensor parallelism (``current_shard()`` at construction) it holds this rank's heads only."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, prefix: str, backend: str,
                 dtype: torch.dtype | None = None, merge_projections: bool = True) -> None:
        super().__init__()
        tp = TPLayout.of(config, current_shard())
        self.num_heads = tp.num_heads
        self.num_kv_heads = tp.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = tp.q_size, tp.kv_size
        hidden, bias = config.hidden_size, config.attention_bias
        names = [f"{prefix}.{p}" for p in ("q_proj", "k_proj", "v_proj")]
        if merge_projections and can_merge(quant, names):
            shards = {"q": ("q_proj", self.q_size), "k": ("k_proj", self.kv_size), "v": ("v_proj", self.kv_size)}
            self.qkv_proj = _merged_linear(hidden, shards, bias, quant, prefix, "qkv_proj", dtype, tp.qkv_split())
        else:
            self.qkv_proj = None
            self.q_proj = make_linear(hidden, self.q_size, bias, quant, names[0], dtype, split=tp.proj_split("q"))
            self.k_proj = make_linear(hidden, self.kv_size, bias, quant, names[1], dtype, split=tp.proj_split("k"))
            self.v_proj = make_linear(hidden, self.kv_size, bias, quant, names[2], dtype, split=tp.proj_split("v"))
        self.o_proj = make_linear(self.q_size, hidden, False, quant, f"{prefix}.o_proj", dtype,
                                  split=tp.row(config.q_size))
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_position_embeddings, config.rope_theta,
                                          config.rope_scaling)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5, backend)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata | None) -> torch.Tensor:
        lead = x.shape[:-1]
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v, meta)
        return self.o_proj(o.reshape(*lead, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, prefix: str, dtype: torch.dtype | None = None,
                 merge_projections: bool = True) -> None:
        super().__init__()
        tp = TPLayout.of(config, current_shard())
        h, i, b = config.hidden_size, tp.intermediate_size, config.mlp_bias
        self.intermediate_size = i
        names = [f"{prefix}.gate_proj", f"{prefix}.up_proj"]
        if merge_projections and can_merge(quant, names):
            shards = {0: ("gate_proj", i), 1: ("up_proj", i)}
            self.gate_up_proj = _merged_linear(h, shards, b, quant, prefix, "gate_up_proj", dtype, tp.mlp_split())
        else:
            self.gate_up_proj = None
            self.gate_proj = make_linear(h, i, b, quant, names[0], dtype, split=tp.mlp_split((None,)))
            self.up_proj = make_linear(h, i, b, quant, names[1], dtype, split=tp.mlp_split((None,)))
        self.down_proj = make_linear(i, h, b, quant, f"{prefix}.down_proj", dtype,
                                     split=tp.row(config.intermediate_size))
        self.act = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split([self.intermediate_size, self.intermediate_size], dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(gated_act(self.act, gate, up))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm decoder block; the residual is carried alongside so norms fuse the add."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, prefix: str, backend: str,
                 dtype: torch.dtype | None = None, merge_projections: bool = True) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, quant, f"{prefix}.self_attn", backend, dtype, merge_projections)
        self.mlp = LlamaMLP(config, quant, f"{prefix}.mlp", dtype, merge_projections)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


def hidden_state_ids(output_hidden_states: bool, state_ids: tuple[int, ...] | None, num_layers: int
                     ) -> tuple[int, ...]:
    """The indices of the states a forward returns (layer i's input, or ``num_layers``: the final normed state):
    all of them with ``output_hidden_states``, or ``state_ids``, checked."""
    if state_ids is None:
        return tuple(range(num_layers + 1)) if output_hidden_states else ()
    if any(not 0 <= i <= num_layers for i in state_ids):
        raise InvalidParameterError(f"state_ids must be indices from 0 to {num_layers} (layer inputs, then the "
                                    f"final state); got {list(state_ids)}", "state_ids")
    return tuple(state_ids)


def pick_states(wanted: tuple[int, ...], inputs: dict[int, torch.Tensor], final: torch.Tensor) -> list[torch.Tensor]:
    """The states ``wanted`` names, in its order, from the layer inputs kept and the final state."""
    return [inputs[i] if i in inputs else final for i in wanted]


class LlamaModel(nn.Module):
    """Embedding, decoder stack and final norm."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, backend: str,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.embed_tokens = token_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, quant, f"model.layers.{i}", backend, dtype)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self._decode_layers: DecodeLayers | None | bool = False  # False: not built yet (cinq/model/decode_layers.py)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata | None,
                output_hidden_states: bool = False, state_ids: tuple[int, ...] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(final normed state, states): with ``output_hidden_states`` every layer's input and the final state
        (index L), or only the indices ``state_ids`` names, in its order (EAGLE-3 reads 3 of 31)."""
        wanted = hidden_state_ids(output_hidden_states, state_ids, len(self.layers))
        inputs = sorted({i for i in wanted if i < len(self.layers)})
        hidden = self.embed_tokens(input_ids)
        if meta is not None and hidden.is_cpu and not torch.compiler.is_compiling():
            fused = self.decode_layers()
            out = fused.run(hidden, positions, meta, tuple(inputs)) if fused is not None else None
            if out is not None:  # the whole stack in one native call, bit-identical to the loop below
                hidden, residual, captured = out
                hidden, _ = self.norm(hidden, residual)
                return hidden, pick_states(wanted, dict(zip(inputs, captured)), hidden)
        residual = None
        states: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in inputs:
                states[i] = hidden if residual is None else hidden + residual
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden, pick_states(wanted, states, hidden)

    def decode_layers(self) -> DecodeLayers | None:
        """The stack's fused decode program, built at the first serving step (the KV caches are bound by then) and
        again when the runner binds new caches; None where it does not apply."""
        fused = self._decode_layers
        if fused is False or (fused is not None and fused.stale()):
            fused = self._decode_layers = build_decode_layers(self)
        return fused


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head. ``forward`` returns final hidden states; ``compute_logits`` projects the rows you need.
    Follows ``cinq/model/interface.py``'s ``CausalLM`` (the reference implementation of it).

    ``quant``: the checkpoint's quantization format (None: dense); ``dtype``: the compute dtype of quantized
    linears (default: torch's default dtype, which dense parameters are created in)."""

    stacked_params_mapping = STACKED_PARAMS_MAPPING
    model_cls: type[nn.Module] = LlamaModel  # a family reusing this head over its own decoder stack overrides it
    unsupported: dict[str, str] = {}  # engine feature -> why it is refused (interface.check_supported)

    @classmethod
    def decoder_layer(cls, config: ModelConfig, prefix: str, attention_backend: str = "sdpa",
                      dtype: torch.dtype | None = None, merge_projections: bool = True,
                      layer_index: int = 0) -> nn.Module:
        """One decoder block of this family, dense (the EAGLE head's layer; calibration's block, unmerged)."""
        return LlamaDecoderLayer(config, None, prefix, attention_backend, dtype, merge_projections)

    @classmethod
    def embed_scale(cls, config: ModelConfig) -> float | None:
        """What the token embedding is multiplied by before the first block (None: nothing)."""
        return None

    def __init__(self, config: ModelConfig, quant: LinearFactory | None = None, attention_backend: str = "sdpa",
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_cls(config, quant, attention_backend, dtype)
        # The LM head stays dense unless the checkpoint says it is quantized (GPTQ's "lm_head": true, which the
        # format's quantizes("lm_head") reports); a quantized head is never tied: the embedding lookup needs the
        # dense matrix.
        shard = current_shard()
        if shard.size == 1:
            self.lm_head = make_linear(config.hidden_size, config.vocab_size, False, quant, "lm_head", dtype)
        elif quant is not None and quant.quantizes("lm_head"):
            raise InvalidParameterError(f"tensor_parallel_size {shard.size} with a quantized LM head is not "
                                        f"supported; serve it with tensor_parallel_size 1", "tensor_parallel_size")
        else:
            self.lm_head = ParallelLMHead(config.hidden_size, config.vocab_size, shard)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config says so (re-run after ``to_empty``)."""
        if self.config.tie_word_embeddings and isinstance(self.lm_head, DenseLinear):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                meta: AttentionMetadata | None = None) -> torch.Tensor:
        """Final hidden states, shaped like ``input_ids`` plus a hidden dimension."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
        hidden, _ = self.model(input_ids, positions, meta)
        return hidden

    def forward_with_hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                                   meta: AttentionMetadata | None = None, state_ids: tuple[int, ...] | None = None
                                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward that also returns every layer's input and the final normed state (as HF), or only the indices
        ``state_ids`` names; served with ``meta`` (EAGLE's features), training-mode without."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
        return self.model(input_ids, positions, meta, output_hidden_states=True, state_ids=state_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in float32 (sampling and logprobs want the precision)."""
        return self.lm_head(hidden).float()

    def set_attention_backend(self, name: str) -> None:
        """Switch every layer to the backend registered as ``name``."""
        from cinq.kernels.backends import get_backend
        for layer in self.model.layers:
            layer.self_attn.attn.backend = get_backend(name)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
