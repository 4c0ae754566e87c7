"""Gemma 3 (text): the Llama decoder with Gemma's differences, one file (registered in cinq/model/registry.py).

What differs from ``llama.py`` (module names mirror HF's ``Gemma3ForCausalLM``):

* (1 + w) RMSNorm, computed in float32 (``GemmaRMSNorm``); checkpoints store w (zero-centred). GGUF files store
  1 + w (llama.cpp's converter adds 1): cinq/model/gguf/weights.py subtracts it back, as transformers does.
* four norms per block: input, post-attention, pre- and post-feed-forward (the residual add comes after the
  post norms), and q/k norms before rope;
* interleaved layers: ``config.layer_types`` says which are ``sliding_attention`` (window
  ``config.sliding_window``, rope base ``rope_local_theta``) and which ``full_attention`` (rope base
  ``rope_theta``); the window travels to the attention backend through the metadata (``Attention``);
* attention scale ``query_pre_attn_scalar ** -0.5``; GeGLU with gelu-tanh (``hidden_act``);
* the embedding multiplied by sqrt(hidden) (rounded to the compute dtype, as HF does); tied LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cinq.kernels.cpu_native import rms_norm_scaled_native
from cinq.kernels.metadata import AttentionMetadata
from cinq.model.decode_layers import GemmaDecodeLayers, build_gemma_decode_layers
from cinq.layers.attention import Attention
from cinq.layers.linear import LinearFactory
from cinq.layers.norm import RMSNorm
from cinq.layers.rotary import RotaryEmbedding
from cinq.layers.vocab_parallel import token_embedding
from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, hidden_state_ids, pick_states


class GemmaRMSNorm(RMSNorm):
    """y = x / rms(x) * (1 + w), all in float32 then cast back (HF's Gemma3RMSNorm). With ``residual``:
    (norm(x + residual), x + residual), the same contract as ``layers/norm.RMSNorm``."""

    init_weight = 0.0  # w = 0 is the identity scale (saver.init_random_model)

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self._scale: tuple[int, int, torch.Tensor] | None = None  # (weight's data_ptr, version, 1 + w in float32)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # bf16 inference on the CPU: the native kernel, one call for the ~10 ATen ops below (109 norms per step of
        # Gemma 3 270M); rounded the same way
        fused = rms_norm_scaled_native(x, residual, self.scale(), self.eps) if not self.training else None
        if fused is not None:
            return fused[0] if residual is None else fused
        if residual is not None:
            x = x + residual
            residual = x
        y = (F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps) * (1.0 + self.weight.float())).to(x.dtype)
        return y if residual is None else (y, residual)

    def scale(self) -> torch.Tensor:
        """1 + w in float32, kept until the weight changes (loading writes it in place after construction)."""
        w = self.weight
        key = (w.data_ptr(), w._version)
        if self._scale is None or self._scale[:2] != key:
            with torch.no_grad():
                self._scale = (*key, 1.0 + w.detach().float())
        return self._scale[2]


class Gemma3Attention(LlamaAttention):
    """Llama's projections (merged, tensor-parallel) with Gemma's q/k norms, scale, rope base and window."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, prefix: str, backend: str,
                 dtype: torch.dtype | None, merge_projections: bool, layer_index: int) -> None:
        super().__init__(config, quant, prefix, backend, dtype, merge_projections)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        window = config.layer_window(layer_index)
        theta = config.rope_local_theta if window is not None and config.rope_local_theta else config.rope_theta
        # HF Gemma 3 scales only the global layers' rope (rope_scaling applies to full_attention)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_position_embeddings, theta,
                                          None if window is not None else config.rope_scaling)
        scalar = config.query_pre_attn_scalar or config.head_dim
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, scalar ** -0.5, backend,
                              sliding_window=window)


class Gemma3DecoderLayer(nn.Module):
    """Sandwich-norm block: x + post_attn(attn(in(x))), then + post_ffw(mlp(pre_ffw(.))). Called like Llama's
    block, ``(positions, hidden, residual, meta) -> (hidden, residual)``; here the residual stream is complete
    after each block (the hidden returned is the stream itself and ``residual`` is None) so the calibration and
    EAGLE code that carries (hidden, residual) pairs works unchanged."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, prefix: str, backend: str,
                 dtype: torch.dtype | None = None, merge_projections: bool = True, layer_index: int = 0) -> None:
        super().__init__()
        eps, h = config.rms_norm_eps, config.hidden_size
        self.self_attn = Gemma3Attention(config, quant, f"{prefix}.self_attn", backend, dtype, merge_projections,
                                         layer_index)
        self.mlp = LlamaMLP(config, quant, f"{prefix}.mlp", dtype, merge_projections)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata | None) -> tuple[torch.Tensor, None]:
        if residual is not None:
            hidden = hidden + residual
        x = self.self_attn(positions, self.input_layernorm(hidden), meta)
        hidden = hidden + self.post_attention_layernorm(x)
        x = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(x), None


class Gemma3Model(nn.Module):
    """Scaled embedding, decoder stack, final norm."""

    def __init__(self, config: ModelConfig, quant: LinearFactory | None, backend: str,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.embed_tokens = token_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, quant, f"model.layers.{i}", backend, dtype, layer_index=i)
            for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embed_scale = config.hidden_size ** 0.5
        self._decode_layers: GemmaDecodeLayers | None | bool = False  # False: not built yet

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata | None,
                output_hidden_states: bool = False, state_ids: tuple[int, ...] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """As ``LlamaModel.forward``."""
        wanted = hidden_state_ids(output_hidden_states, state_ids, len(self.layers))
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        if meta is not None and not wanted and hidden.is_cpu and not torch.compiler.is_compiling():
            fused = self.decode_layers()
            out = fused.run_gemma(hidden, positions, meta) if fused is not None else None
            if out is not None:  # the whole stack in one native call, bit-identical to the loop below
                return self.norm(out), []
        states: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in wanted:
                states[i] = hidden
            hidden, _ = layer(positions, hidden, None, meta)
        hidden = self.norm(hidden)
        return hidden, pick_states(wanted, states, hidden)

    def decode_layers(self) -> GemmaDecodeLayers | None:
        """The stack's fused decode program (cinq/model/decode_layers.py), built at the first serving step and again
        when the runner binds new caches; None where it does not apply."""
        fused = self._decode_layers
        if fused is False or (fused is not None and fused.stale()):
            fused = self._decode_layers = build_gemma_decode_layers(self)
        return fused


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text decoder + tied LM head (``cinq/model/interface.py``'s ``CausalLM``)."""

    model_cls = Gemma3Model
    unsupported = {
        "eagle": "EAGLE heads are trained for Llama-family targets only (no Gemma 3 head layer)",
        "medusa": "Medusa heads are trained for Llama-family targets only",
        "compile": "the compiled decode step is validated for Llama-family models only",
        # both fold scales into the norm before the linears: Gemma's norms are (1 + w) and its MLP reads
        # pre_feedforward_layernorm, not post_attention_layernorm (GPTQ and RTN fold nothing: they work)
        "awq": "AWQ folds its scales into Llama's norms; Gemma 3's (1 + w) sandwich norms are not handled "
               "(use gptq or rtn)",
        "smoothquant": "SmoothQuant folds its scales into Llama's norms; Gemma 3's (1 + w) sandwich norms are "
                       "not handled (use gptq or rtn)",
    }

    @classmethod
    def decoder_layer(cls, config: ModelConfig, prefix: str, attention_backend: str = "sdpa",
                      dtype: torch.dtype | None = None, merge_projections: bool = True,
                      layer_index: int = 0) -> nn.Module:
        return Gemma3DecoderLayer(config, None, prefix, attention_backend, dtype, merge_projections, layer_index)

    @classmethod
    def embed_scale(cls, config: ModelConfig) -> float | None:
        return config.hidden_size ** 0.5
