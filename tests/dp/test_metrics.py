"""The DP series in /metrics: router decisions, per-replica load and state, fault counters, read from a live
2-replica DPAsyncLLM."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cinq.sampling_params import SamplingParams

pytest.importorskip("ray")


def scrape(llm) -> dict[str, list]:
    from cinq.dp.metrics import DPCollector
    registry = CollectorRegistry()
    registry.register(DPCollector(llm, "tiny"))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_router_decisions_and_replica_loads_are_exported(dp_llm, dp_loop) -> None:
    async def one(i: int) -> None:
        async for _ in dp_llm.generate([5 + i] * 40, SamplingParams(max_tokens=2, temperature=0.0), f"metrics-{i}"):
            pass

    async def run() -> None:
        for i in range(3):
            await one(i)

    dp_loop.run(run())
    series = scrape(dp_llm)
    decisions = {s.labels["reason"]: s.value for s in series["cinq:dp_router_decisions"]
                 if s.name.endswith("_total")}
    assert decisions == {k: float(v) for k, v in dp_llm.counters.decisions.items()}
    assert sum(decisions.values()) >= 3
    routed = {s.labels["replica"]: s.value for s in series["cinq:dp_replica_requests_routed"]
              if s.name.endswith("_total")}
    assert routed == {str(i): float(n) for i, n in enumerate(dp_llm.counters.routed)}
    assert {s.labels["replica"]: s.value for s in series["cinq:dp_replica_requests_in_flight"]} == {"0": 0.0, "1": 0.0}
    assert [s.value for s in series["cinq:dp_replica_up"]] == [1.0, 1.0]
    completed = [s.value for s in series["cinq:dp_requests_completed"] if s.name.endswith("_total")]
    assert completed == [float(dp_llm.counters.completed)] and completed[0] >= 3
