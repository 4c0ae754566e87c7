"""The compute roofline of an offline throughput run: the FLOPs its requests need, over the machine's measured
peak.

FLOPs count what the workload needs, not what an engine spends on padding: every token an engine must run
through the decoder (each prompt token, and each generated token but the last, which is never fed back) costs
2 x the decoder's linear parameters; each sampled token (one per output token: a prompt's last position gives the
first) costs 2 x the LM head's; attention costs 4 x heads x head_dim per layer per (query, earlier key) pair,
causal (QK^T and PV, 2 FLOPs per multiply-add each). Norms, rotary embeddings, activations and sampling are left
out (under 1% at these shapes).

The peak is ``cinq.plan.probe.matmul_flops``: a 2048^3 float32 GEMM with the engine's thread count, the best
this CPU's BLAS does (its bf16 GEMM is emulated on CPUs without AVX512-BF16, so fp32 is the achievable peak
there; the report says which dtype was used).
"""

from __future__ import annotations

from dataclasses import dataclass

from cinq.bench.workload import BenchRequest
from cinq.model.config import ModelConfig


@dataclass(slots=True, frozen=True)
class WorkloadFlops:
    """FLOPs of one run's requests, by part."""

    decoder_linears: float
    lm_head: float
    attention: float

    @property
    def total(self) -> float:
        return self.decoder_linears + self.lm_head + self.attention


def decoder_linear_params(cfg: ModelConfig) -> int:
    """Weights of the decoder's linears (QKV, O, gate/up, down), all layers."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    return per_layer * cfg.num_hidden_layers


def workload_flops(cfg: ModelConfig, reqs: list[BenchRequest]) -> WorkloadFlops:
    """The FLOPs ``reqs`` need on a model of shape ``cfg`` (see the module docstring for what counts)."""
    fed = sum(len(r.prompt) + r.output_len - 1 for r in reqs)  # tokens through the decoder
    sampled = sum(r.output_len for r in reqs)
    # token at position p attends to p + 1 keys: sum over p < n of (p + 1) = n (n + 1) / 2
    pairs = sum(n * (n + 1) // 2 for n in (len(r.prompt) + r.output_len - 1 for r in reqs))
    per_pair = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    return WorkloadFlops(2.0 * decoder_linear_params(cfg) * fed, 2.0 * cfg.hidden_size * cfg.vocab_size * sampled,
                         float(per_pair * pairs))


def peak_flops(dtype: str = "float32") -> float:
    """The machine's achievable matmul FLOP/s now, at torch's current thread count (``cinq.plan.probe``)."""
    from cinq.plan.probe import matmul_flops
    return matmul_flops(2048, dtype)
