"""One plan: a model shape on a device at a precision, context length, concurrency and tensor-parallel degree,
put together from memory.py, roofline.py and cost.py. ``build_plan`` is what `cinq plan` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.option_fields import bounded, check_bounds
from cinq.plan.cost import dollars_per_million_tokens
from cinq.plan.devices import Device
from cinq.plan.memory import (MemoryPlan, Precision, kv_bytes_per_token, min_tensor_parallel_size, param_count,
                              plan_memory, valid_tp_sizes, weight_bytes)
from cinq.plan.roofline import check_tensor_parallel, crossover_batch, decode_step, prefill_step
from cinq.plan.shapes import ModelShape


@dataclass(slots=True, frozen=True)
class PlanSettings:
    """What the plan is asked for (vLLM's names where it has them)."""

    max_model_len: int = bounded(ge=1, integer=True)
    concurrency: int = bounded(1, ge=1)
    tensor_parallel_size: int | None = bounded(None, ge=1, integer=True)  # None: the smallest degree that fits
    gpu_memory_utilization: float = bounded(0.9, gt=0, le=1)
    max_num_batched_tokens: int = bounded(2048, ge=1)
    max_num_seqs: int = bounded(256, ge=1)
    context_len: int | None = None  # tokens of context while decoding (and the prompt prefilled); None: max_model_len

    @property
    def decode_context(self) -> int:
        return self.max_model_len if self.context_len is None else self.context_len

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.context_len is not None and not 1 <= self.context_len <= self.max_model_len:
            raise InvalidParameterError(f"context_len must be in [1, max_model_len = {self.max_model_len}], got "
                                        f"{self.context_len}", "context_len")


@dataclass(slots=True, frozen=True)
class Throughput:
    """Decode at one batch size, on all cards together."""

    batch: int
    tokens_per_s: float
    step_ms: float
    bound: str
    comm_ms: float
    dollars_per_million: float | None


@dataclass(slots=True, frozen=True)
class TensorParallelRow:
    """One tensor-parallel degree: does it fit, and what it gives."""

    tensor_parallel_size: int
    fits: bool
    max_num_sequences: int
    batch1: Throughput | None
    at_concurrency: Throughput | None


@dataclass(slots=True)
class Plan:
    """Everything `cinq plan` reports (bytes are exact integers, speeds roofline estimates)."""

    model: str
    config: ModelConfig
    num_params: int
    device: Device
    precision: Precision
    settings: PlanSettings
    tensor_parallel_size: int
    min_tensor_parallel_size: int | None
    weight_bytes_total: int
    kv_bytes_per_token_total: int  # the whole model's KV per token (before any split)
    memory: MemoryPlan  # per card at tensor_parallel_size
    batch1: Throughput | None  # None when it does not fit
    at_concurrency: Throughput | None
    crossover_batch: int | None  # at the decode context
    crossover_batch_weights_only: int | None  # context 0: the weights alone
    prefill_tokens_per_s: float
    prefill_ttft_s: float  # one prompt of the decode context's length, alone
    tp_sweep: list[TensorParallelRow] = field(default_factory=list)


def _throughput(shape: ModelShape, p: Precision, device: Device, batch: int, context_len: int,
                tp: int) -> Throughput:
    step = decode_step(shape.config, p, device, batch, context_len, tp)
    tok_s = batch / step.seconds
    return Throughput(batch, tok_s, step.seconds * 1e3, step.bound, step.comm_s * 1e3,
                      dollars_per_million_tokens(tok_s, device.price_per_hour, tp))


def _speeds(shape: ModelShape, p: Precision, device: Device, s: PlanSettings, mem: MemoryPlan
            ) -> tuple[Throughput | None, Throughput | None]:
    """Batch 1 and the concurrency asked for (capped by the KV cache and max_num_seqs), every sequence decoding
    at ``decode_context`` tokens (by default max_model_len: the worst case)."""
    if not mem.fits:
        return None, None
    tp = mem.tensor_parallel_size
    batch = min(s.concurrency, mem.max_num_sequences, s.max_num_seqs)
    return (_throughput(shape, p, device, 1, s.decode_context, tp),
            _throughput(shape, p, device, batch, s.decode_context, tp))


def build_plan(shape: ModelShape, device: Device, precision: Precision, settings: PlanSettings,
               sweep_up_to: int = 8) -> Plan:
    """The plan of ``shape`` on ``device``; the tensor-parallel sweep covers the valid degrees up to
    ``sweep_up_to`` (and the one asked for) on devices with an interconnect."""
    cfg, s = shape.config, settings
    if s.max_model_len > cfg.max_position_embeddings:  # the engine refuses it (engine/core.py): so does the plan
        raise InvalidParameterError(f"max_model_len ({s.max_model_len}) exceeds what the model supports "
                                    f"({cfg.max_position_embeddings})", "max_model_len")

    def memory(tp: int) -> MemoryPlan:
        return plan_memory(cfg, precision, device.memory_gib, device.reserved_gib, s.max_model_len, tp,
                           s.gpu_memory_utilization, s.max_num_batched_tokens, s.max_num_seqs)

    min_tp = min_tensor_parallel_size(cfg, precision, device.memory_gib, device.reserved_gib, s.max_model_len,
                                      s.gpu_memory_utilization, s.max_num_batched_tokens, s.max_num_seqs)
    if device.link_gbs is None and min_tp is not None and min_tp > 1:
        min_tp = None  # no interconnect: more cards cannot help
    tp = s.tensor_parallel_size or min_tp or 1
    check_tensor_parallel(device, tp)
    if cfg.num_attention_heads % tp:
        raise InvalidParameterError(f"tensor_parallel_size {tp} must divide num_attention_heads "
                                    f"({cfg.num_attention_heads})", "tensor_parallel_size")
    mem = memory(tp)
    batch1, at_conc = _speeds(shape, precision, device, s, mem)
    prefill = prefill_step(cfg, precision, device, s.decode_context, tp)
    sweep: list[TensorParallelRow] = []
    if device.link_gbs is not None:
        for t in sorted(set(t for t in valid_tp_sizes(cfg) if t <= sweep_up_to) | {tp}):
            m = memory(t)
            b1, bc = _speeds(shape, precision, device, s, m)
            sweep.append(TensorParallelRow(t, m.fits, m.max_num_sequences, b1, bc))
    return Plan(
        model=shape.name, config=cfg, num_params=param_count(cfg), device=device, precision=precision, settings=s,
        tensor_parallel_size=tp, min_tensor_parallel_size=min_tp,
        weight_bytes_total=weight_bytes(cfg, precision).total,
        kv_bytes_per_token_total=kv_bytes_per_token(cfg, precision), memory=mem, batch1=batch1,
        at_concurrency=at_conc, crossover_batch=crossover_batch(cfg, precision, device, s.decode_context, tp),
        crossover_batch_weights_only=crossover_batch(cfg, precision, device, 0, tp),
        prefill_tokens_per_s=s.decode_context / prefill.seconds, prefill_ttft_s=prefill.seconds, tp_sweep=sweep)
