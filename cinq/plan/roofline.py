"""Roofline speeds: how fast decode and prefill can go when only memory bandwidth, FLOP/s and the
tensor-parallel all-reduces limit them.

A decode step of B sequences at context c, on each of the tp cards:
- reads ``read_per_step / tp`` weight bytes (memory.WeightBytes) and B * c * kv_per_token KV bytes,
- does B * (2 * matrix weights + 4 * layers * c * q_size) / tp FLOPs: 2 per weight of every linear and of
  the LM head, and QK^T plus PV over the context,
- and takes max(bytes / bandwidth, FLOPs / peak) + the all-reduces.
At B = 1 that is memory-bound everywhere; the crossover batch is where the two terms meet. The KV reads grow
with B as fast as the FLOPs do (attention does ~2 FLOPs per KV byte per query head sharing it), so at long
contexts decode may never turn compute-bound: then there is no crossover.

All-reduce cost model (tensor parallelism, Megatron-style: two all-reduces per layer, after o_proj and after
down_proj, of the step's hidden states in the compute dtype): a ring all-reduce of S bytes over p cards sends
2 (p - 1) / p * S bytes per card over the link, plus a fixed latency per all-reduce (launch and
synchronisation; ``Device.link_latency_us``). Communication is not overlapped with compute, which is what
decode at small batch does in practice.

Prefill of a P-token prompt: 2 FLOPs per matrix weight per token plus causal attention, 2 * layers * P^2 *
q_size; compute-bound except for very short prompts, and the same all-reduces on P rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.plan.devices import Device
from cinq.plan.memory import Precision, kv_bytes_per_token, linear_shapes, weight_bytes


def check_tensor_parallel(device: Device, tensor_parallel_size: int) -> None:
    """Tensor parallelism needs a link to all-reduce over: the CPUs (and custom devices) in the table have none."""
    if tensor_parallel_size < 1:
        raise InvalidParameterError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}",
                                    "tensor_parallel_size")
    if tensor_parallel_size > 1 and device.link_gbs is None:
        raise InvalidParameterError(f"tensor_parallel_size {tensor_parallel_size} needs a device with an "
                                    f"interconnect; {device.name} has none in the table", "tensor_parallel_size")


def allreduce_seconds(device: Device, tensor_parallel_size: int, nbytes: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``tensor_parallel_size`` cards (0 on one card)."""
    tp = tensor_parallel_size
    if tp == 1:
        return 0.0
    check_tensor_parallel(device, tp)
    return device.link_latency_us * 1e-6 + 2 * (tp - 1) / tp * nbytes / (device.link_gbs * 1e9)  # type: ignore


def matrix_weights(cfg: ModelConfig) -> int:
    """Weights that multiply every token: the decoder's linears and the LM head (not the embedding lookup)."""
    return cfg.num_hidden_layers * sum(k * n for k, n in linear_shapes(cfg)) + cfg.vocab_size * cfg.hidden_size


def decode_flops_per_token(cfg: ModelConfig, context_len: int) -> float:
    """FLOPs of one decoded token at ``context_len``: 2 per matrix weight + QK^T and PV over the context."""
    return 2.0 * matrix_weights(cfg) + 4.0 * cfg.num_hidden_layers * context_len * cfg.q_size


@dataclass(slots=True, frozen=True)
class StepTime:
    """One step's time on each card and what bounds it."""

    batch: int  # sequences (decode) or prompt tokens (prefill)
    memory_s: float
    compute_s: float
    comm_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


def decode_step(cfg: ModelConfig, p: Precision, device: Device, batch: int, context_len: int,
                tensor_parallel_size: int = 1) -> StepTime:
    """Roofline time of one decode step of ``batch`` sequences, each at ``context_len`` tokens of context."""
    tp = tensor_parallel_size
    check_tensor_parallel(device, tp)
    weights = weight_bytes(cfg, p).read_per_step / tp
    kv = batch * context_len * kv_bytes_per_token(cfg, p, tp)
    flops = batch * decode_flops_per_token(cfg, context_len) / tp
    comm = 2 * cfg.num_hidden_layers * allreduce_seconds(device, tp, batch * cfg.hidden_size * p.compute_bytes)
    return StepTime(batch, (weights + kv) / (device.bandwidth_gbs * 1e9), flops / (device.tflops * 1e12), comm)


def decode_tokens_per_s(cfg: ModelConfig, p: Precision, device: Device, batch: int, context_len: int,
                        tensor_parallel_size: int = 1) -> float:
    """Output tokens per second of ``batch`` sequences decoding together (all cards together)."""
    return batch / decode_step(cfg, p, device, batch, context_len, tensor_parallel_size).seconds


def crossover_batch(cfg: ModelConfig, p: Precision, device: Device, context_len: int,
                    tensor_parallel_size: int = 1) -> int | None:
    """The smallest batch at which decode turns compute-bound, or None when the KV reads keep it memory-bound
    at any batch (solves (W + B K) / bandwidth = B F / peak for B)."""
    tp = tensor_parallel_size
    bw, peak = device.bandwidth_gbs * 1e9, device.tflops * 1e12
    weights = weight_bytes(cfg, p).read_per_step / tp
    per_seq_memory = context_len * kv_bytes_per_token(cfg, p, tp) / bw
    per_seq_compute = decode_flops_per_token(cfg, context_len) / tp / peak
    if per_seq_compute <= per_seq_memory:
        return None
    b = weights / bw / (per_seq_compute - per_seq_memory)
    return max(1, int(b) + (0 if b == int(b) else 1))


def prefill_step(cfg: ModelConfig, p: Precision, device: Device, prompt_len: int,
                 tensor_parallel_size: int = 1) -> StepTime:
    """Roofline time to prefill one ``prompt_len``-token prompt in one step."""
    tp = tensor_parallel_size
    check_tensor_parallel(device, tp)
    flops = (2.0 * matrix_weights(cfg) * prompt_len
             + 2.0 * cfg.num_hidden_layers * prompt_len ** 2 * cfg.q_size) / tp
    memory = weight_bytes(cfg, p).read_per_step / tp + prompt_len * kv_bytes_per_token(cfg, p, tp)
    comm = 2 * cfg.num_hidden_layers * allreduce_seconds(device, tp, prompt_len * cfg.hidden_size * p.compute_bytes)
    return StepTime(prompt_len, memory / (device.bandwidth_gbs * 1e9), flops / (device.tflops * 1e12), comm)
