"""What ``cinq plan`` says of a candidate before anything runs: whether its weights, activations and KV budget
fit the device, and the roofline's decode step at its concurrency. The roofline is a lower bound on the step
time, so a candidate whose best case (step time / (k + 1) with k drafts all accepted) misses the TPOT SLO cannot
meet it measured either and is dropped; the rest are ranked by the roofline's cost per token, cheapest first.

The roofline cannot see what decides most on a small model (per-step overhead, a quantized kernel's real speed,
how many drafts are accepted, quality), and often ties there: ``measurement_order`` takes the kept candidates
round-robin over their weights + speculation families, each family cheapest roofline first, so a short trial
budget measures every family before refining batch sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cinq.tune.space import Candidate


@dataclass(slots=True)
class Verdict:
    """The plan's view of one candidate: kept or why not, and its roofline estimates."""

    candidate: Candidate
    kept: bool
    reason: str
    roofline_tpot_ms: float | None
    roofline_cost: float | None  # $ / M tokens at the candidate's concurrency

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.to_dict(), "label": self.candidate.label, "kept": self.kept,
                "reason": self.reason, "roofline_tpot_ms": self.roofline_tpot_ms, "roofline_cost": self.roofline_cost}


def precision_of(quant: str, dtype: str) -> Any:
    """The plan's Precision for a candidate's weights: the dtype, or intN with the variant's group size."""
    from cinq.plan.memory import Precision
    if quant == "none":
        return Precision.from_name(dtype)
    from cinq.quant.variants import one_variant
    spec = one_variant(quant)
    name = {8: "int8", 4: "int4"}.get(spec.bits)
    if name is None:  # the plan models 8- and 4-bit weights; other widths are costed as the next one up
        name = "int8" if spec.bits > 4 else "int4"
    return Precision.from_name(name, spec.group_size if spec.group_size > 0 else -1)


def judge(candidate: Candidate, model_config: Any, device: Any, dtype: str, max_model_len: int, context_len: int,
          tpot_slo_ms: float | None) -> Verdict:
    """The plan's verdict on ``candidate`` (see the module docstring)."""
    from cinq.errors import InvalidParameterError
    from cinq.plan.planner import PlanSettings, build_plan
    from cinq.plan.shapes import ModelShape
    p = precision_of(candidate.quant, dtype)
    settings = PlanSettings(max_model_len=max_model_len, concurrency=candidate.max_num_seqs, tensor_parallel_size=1,
                            max_num_batched_tokens=candidate.max_num_batched_tokens,
                            max_num_seqs=candidate.max_num_seqs, context_len=min(context_len, max_model_len))
    try:
        plan = build_plan(ModelShape("tune", model_config), device, p, settings)
    except InvalidParameterError as e:
        return Verdict(candidate, False, f"plan: {e}", None, None)
    if not plan.memory.fits or plan.at_concurrency is None:
        return Verdict(candidate, False, "weights + activations + one full sequence do not fit", None, None)
    if candidate.kv_tokens is not None and candidate.kv_tokens > plan.memory.kv_tokens:
        return Verdict(candidate, False, f"KV budget {candidate.kv_tokens} tokens > the {plan.memory.kv_tokens} "
                                         "that fit", None, None)
    step = plan.at_concurrency.step_ms
    best_tpot = step / (candidate.spec_k + 1)
    cost = plan.at_concurrency.dollars_per_million
    if tpot_slo_ms is not None and best_tpot > tpot_slo_ms:
        return Verdict(candidate, False, f"roofline TPOT {best_tpot:.2f} ms > SLO {tpot_slo_ms:g} ms", best_tpot,
                       cost)
    return Verdict(candidate, True, "kept", best_tpot, cost)


def prune(candidates: list[Candidate], model_config: Any, device: Any, dtype: str, max_model_len: int,
          context_len: int, tpot_slo_ms: float | None) -> list[Verdict]:
    """Every candidate's verdict, the kept ones first, cheapest roofline cost first."""
    verdicts = [judge(c, model_config, device, dtype, max_model_len, context_len, tpot_slo_ms) for c in candidates]
    return sorted(verdicts, key=lambda v: (not v.kept, v.roofline_cost if v.roofline_cost is not None else 1e30))


def measurement_order(verdicts: list[Verdict]) -> list[Verdict]:
    """The kept verdicts in the order to measure them (see the module docstring)."""
    families: dict[tuple[str, int], list[Verdict]] = {}
    for v in verdicts:  # already cheapest first
        if v.kept:
            families.setdefault((v.candidate.quant, v.candidate.spec_k), []).append(v)
    order, queues = [], list(families.values())
    while queues:
        order += [q.pop(0) for q in queues]
        queues = [q for q in queues if q]
    return order
