"""Memory for serving a model: weights by precision, KV cache per token and per sequence, an activation
estimate, and whether it all fits a card (or how many cards tensor parallelism needs).

Conventions (each one is what cinq, or vLLM, does):
- weights are counted from the shape alone. Quantized precisions (int8, int4) quantize the decoder's linears
  in GPTQ's layout (cinq's default format): ``qweight`` K*N*bits/8, ``qzeros`` groups*N*bits/8, fp16 ``scales``
  groups*N*2 and an int32 ``g_idx`` of K; embeddings and the LM head stay in the compute dtype, norms and
  biases too. For GPTQ folders this is byte for byte what cinq's loader allocates (tested against the meta
  model); AWQ files (no ``g_idx``) and cinq's W8A8 (int8 weights, fp32 scale per row) differ from it by well
  under 1% of the weights.
- the KV cache holds K and V for every layer: 2 * layers * kv_heads * head_dim * bytes per token, in the compute
  dtype (bf16 for every weight precision but float32). Tensor parallelism splits the KV heads over the cards;
  when there are fewer KV heads than cards each card keeps one (replicated, as vLLM does).
- usable memory per card is ``memory * gpu_memory_utilization`` (vLLM's 0.9 by default) less a fixed reservation
  (CUDA context and libraries); weights, the activation peak and the KV cache share what is left.
- the activation peak is one engine step of ``max_num_batched_tokens`` tokens: the residual stream and the norm
  output, q/k/v, the attention output, gate/up and the activated MLP input, in the compute dtype, plus fp32
  logits and probabilities for the rows that sample (at most ``max_num_seqs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig

GIB = 1 << 30
FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
INT_BITS = {"int8": 8, "int4": 4}
PRECISIONS = tuple(FLOAT_BYTES) + tuple(INT_BITS)


@dataclass(slots=True, frozen=True)
class Precision:
    """How the weights are stored: a float dtype, or ``bits``-bit integers in groups of ``group_size`` input rows
    (-1: one group per output channel) with bf16 compute."""

    name: str
    bits: int
    group_size: int = -1

    @property
    def quantized(self) -> bool:
        return self.name in INT_BITS

    @property
    def compute_bytes(self) -> int:
        """Bytes of an activation, a dense weight and a KV element: float32 stays float32, else 2."""
        return 4 if self.name == "float32" else 2

    @classmethod
    def from_name(cls, name: str, group_size: int | None = None, field: str = "dtype") -> Precision:
        """``bfloat16`` / ``float16`` / ``float32`` / ``int8`` / ``int4``; int precisions take ``group_size``
        (default 128 for int4, per channel for int8, cinq quantize's choices)."""
        if name in FLOAT_BYTES:
            if group_size is not None:
                raise InvalidParameterError(f"group_size applies to int8 / int4 weights, not {name}", "group_size")
            return cls(name, FLOAT_BYTES[name] * 8)
        if name not in INT_BITS:
            raise InvalidParameterError(f"{field} must be one of {', '.join(PRECISIONS)}; got {name!r}", field)
        group = group_size if group_size is not None else (128 if name == "int4" else -1)
        if group == 0 or group < -1:
            raise InvalidParameterError(f"group_size must be -1 (per channel) or >= 1, got {group}", "group_size")
        return cls(name, INT_BITS[name], group)

    @classmethod
    def from_quantization_config(cls, qc: dict) -> Precision:
        """The precision a checkpoint's ``quantization_config`` stores (read by the loader's own parser)."""
        if qc.get("quant_method") == "gguf":  # a GGUF file's blocks (cinq/model/gguf/plan.py says their bits)
            bits = int(qc.get("bits", 16))
            return cls.from_name("bfloat16") if bits == 16 else cls({8: "int8", 4: "int4"}[bits], bits,
                                                                     int(qc.get("group_size", 32)))
        from cinq.layers.quantization.format import QuantFormat
        fmt = QuantFormat.from_hf(qc)
        name = {8: "int8", 4: "int4"}.get(int(fmt.bits or 0))
        if name is None:
            raise InvalidParameterError(f"quantization_config: {fmt.bits}-bit weights are not planned (int8, int4)",
                                        "quantization_config")
        return cls(name, int(fmt.bits), fmt.group_size)


def linear_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(in_features, out_features) of one decoder layer's linears as cinq builds them (q/k/v and gate/up
    merged)."""
    h = cfg.hidden_size
    return [(h, cfg.q_size + 2 * cfg.kv_size), (cfg.q_size, h), (h, 2 * cfg.intermediate_size),
            (cfg.intermediate_size, h)]


def linear_bytes(in_features: int, out_features: int, p: Precision) -> int:
    """Bytes of one linear's weight (no bias) at precision ``p`` (GPTQ layout when quantized)."""
    if not p.quantized:
        return in_features * out_features * p.compute_bytes
    groups = math.ceil(in_features / (in_features if p.group_size <= 0 else p.group_size))
    return (in_features * out_features * p.bits // 8 + groups * out_features * p.bits // 8
            + groups * out_features * 2 + in_features * 4)


def decoder_param_count(cfg: ModelConfig) -> int:
    """Parameters of the decoder layers and the final norm (no embedding, no LM head)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = sum(k * n for k, n in linear_shapes(cfg)) + 2 * h
    if cfg.attention_bias:
        per_layer += cfg.q_size + 2 * cfg.kv_size
    if cfg.mlp_bias:
        per_layer += 2 * i + h
    if cfg.qk_norm:
        per_layer += 2 * cfg.head_dim
    return cfg.num_hidden_layers * per_layer + h


def tied_head(cfg: ModelConfig) -> bool:
    """The LM head is the input embedding (a GGUF file serves its tied head from the embedding's own blocks, as an
    untied linear over the same bytes)."""
    return cfg.tie_word_embeddings or bool((cfg.quantization_config or {}).get("tied_head"))


def param_count(cfg: ModelConfig) -> int:
    """Every parameter, a tied embedding counted once."""
    embed = cfg.vocab_size * cfg.hidden_size
    return decoder_param_count(cfg) + embed * (1 if tied_head(cfg) else 2)


@dataclass(slots=True, frozen=True)
class WeightBytes:
    """A model's weight bytes by part (whole model, before any tensor-parallel split)."""

    embedding: int  # the input embedding (also the LM head when tied)
    lm_head: int  # 0 when tied
    decoder: int  # decoder layers + final norm

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.decoder

    @property
    def read_per_step(self) -> int:
        """Bytes one decode step streams: every decoder weight and the LM head; of an untied input embedding
        only the batch's rows are read, so it does not count."""
        return self.decoder + (self.lm_head or self.embedding)


def weight_bytes(cfg: ModelConfig, p: Precision) -> WeightBytes:
    """Weight bytes of ``cfg`` at precision ``p`` (see the module docstring for the layout)."""
    dense = p.compute_bytes
    embed = cfg.vocab_size * cfg.hidden_size * dense
    linears = sum(linear_bytes(k, n, p) for k, n in linear_shapes(cfg)) * cfg.num_hidden_layers
    others = (decoder_param_count(cfg) - cfg.num_hidden_layers * sum(k * n for k, n in linear_shapes(cfg))) * dense
    return WeightBytes(embed, 0 if tied_head(cfg) else embed, linears + others)


def kv_heads_per_card(cfg: ModelConfig, tensor_parallel_size: int) -> int:
    """KV heads each card holds: split evenly, at least one (replicated when there are fewer heads than cards)."""
    return max(1, math.ceil(cfg.num_key_value_heads / tensor_parallel_size))


def kv_bytes_per_token(cfg: ModelConfig, p: Precision, tensor_parallel_size: int = 1) -> int:
    """KV-cache bytes one token takes on one card: 2 (K and V) * layers * kv heads * head_dim * bytes."""
    return 2 * cfg.num_hidden_layers * kv_heads_per_card(cfg, tensor_parallel_size) * cfg.head_dim * p.compute_bytes


def activation_bytes(cfg: ModelConfig, p: Precision, max_num_batched_tokens: int, max_num_seqs: int,
                     tensor_parallel_size: int = 1) -> int:
    """Peak activation bytes of one step on one card (estimate: see the module docstring)."""
    tp = tensor_parallel_size
    per_token = (2 * cfg.hidden_size + (cfg.q_size + 2 * cfg.kv_size) // tp + cfg.q_size // tp
                 + 3 * cfg.intermediate_size // tp) * p.compute_bytes
    sampled_rows = min(max_num_seqs, max_num_batched_tokens)
    return max_num_batched_tokens * per_token + sampled_rows * cfg.vocab_size * 4 * 2


@dataclass(slots=True, frozen=True)
class MemoryPlan:
    """Per-card memory at one tensor-parallel degree, in bytes."""

    tensor_parallel_size: int
    usable: int  # memory * gpu_memory_utilization - reserved
    weights: int  # this card's share of the weights
    activations: int
    kv_per_token: int
    kv_per_sequence: int  # at max_model_len
    kv_budget: int  # what is left for the KV cache (negative: the weights and activations alone do not fit)
    max_num_sequences: int  # full-length sequences the KV budget holds

    @property
    def fits(self) -> bool:
        """Weights, activations and at least one full-length sequence fit."""
        return self.max_num_sequences >= 1

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_budget) // self.kv_per_token


def plan_memory(cfg: ModelConfig, p: Precision, memory_gib: float, reserved_gib: float, max_model_len: int,
                tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                max_num_batched_tokens: int = 2048, max_num_seqs: int = 256) -> MemoryPlan:
    """The memory plan of one card when the model is split over ``tensor_parallel_size`` cards."""
    tp = tensor_parallel_size
    usable = int(memory_gib * GIB * gpu_memory_utilization - reserved_gib * GIB)
    weights = math.ceil(weight_bytes(cfg, p).total / tp)
    act = activation_bytes(cfg, p, max_num_batched_tokens, max_num_seqs, tp)
    per_token = kv_bytes_per_token(cfg, p, tp)
    budget = usable - weights - act
    per_seq = per_token * max_model_len
    return MemoryPlan(tp, usable, weights, act, per_token, per_seq, budget, max(0, budget) // per_seq)


def valid_tp_sizes(cfg: ModelConfig, limit: int = 64) -> list[int]:
    """Tensor-parallel degrees the model splits evenly over: the powers of two that cinq's loader accepts (heads,
    KV heads and MLP divided, ``ModelConfig.tensor_parallel_problems``)."""
    return [tp for tp in (1 << k for k in range(limit.bit_length())) if tp <= limit
            and not cfg.tensor_parallel_problems(tp)]


def min_tensor_parallel_size(cfg: ModelConfig, p: Precision, memory_gib: float, reserved_gib: float,
                             max_model_len: int, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 2048, max_num_seqs: int = 256) -> int | None:
    """The smallest valid tensor-parallel degree at which one full-length sequence fits, or None (not even at
    the largest degree the heads allow, up to 64)."""
    for tp in valid_tp_sizes(cfg):
        if plan_memory(cfg, p, memory_gib, reserved_gib, max_model_len, tp, gpu_memory_utilization,
                       max_num_batched_tokens, max_num_seqs).fits:
            return tp
    return None
