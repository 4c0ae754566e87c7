"""/metrics series of a data-parallel server: the router's decisions, per-replica load and state, and the fault
counters. Registered beside ``cinq.server.metrics``' engine series (which a DP server fills with all replicas'
stats added up); names carry the same ``cinq:`` prefix and a ``dp_`` stem (vLLM has no router metrics)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cinq.dp.dp_engine import DPAsyncLLM
from cinq.server.metrics import PREFIX


class DPCollector(Collector):
    """Reads ``DPAsyncLLM``'s counters and replica state at scrape time."""

    def __init__(self, llm: DPAsyncLLM, model_name: str) -> None:
        self.llm, self.model_name = llm, model_name

    def collect(self) -> Iterator[Metric]:
        llm, name = self.llm, self.model_name
        c = llm.counters
        decisions = CounterMetricFamily(PREFIX + "dp_router_decisions", "Routing decisions by reason.",
                                        labels=["model_name", "policy", "reason"])
        for reason, n in c.decisions.items():
            decisions.add_metric([name, llm.router.config.policy, reason], n)
        yield decisions
        for metric, doc, value in (
                ("dp_requests_retried", "Requests re-sent to another replica after theirs died before streaming.",
                 c.retried),
                ("dp_requests_failed", "Requests ended with an error (e.g. their replica died mid-stream).",
                 c.failed),
                ("dp_requests_completed", "Requests that delivered their finished output.", c.completed),
                ("dp_requests_aborted", "Requests their client gave up on before they finished.", c.aborted),
                ("dp_replica_restarts", "Replicas replaced after dying.", c.restarts)):
            family = CounterMetricFamily(PREFIX + metric, doc, labels=["model_name"])
            family.add_metric([name], value)
            yield family
        labels = ["model_name", "replica"]
        routed = CounterMetricFamily(PREFIX + "dp_replica_requests_routed", "Requests sent to each replica.",
                                     labels=labels)
        in_flight = GaugeMetricFamily(PREFIX + "dp_replica_requests_in_flight",
                                      "Unfinished requests per replica (the router's load signal).", labels=labels)
        up = GaugeMetricFamily(PREFIX + "dp_replica_up", "1 while the replica is alive, 0 while it restarts.",
                               labels=labels)
        running = GaugeMetricFamily(PREFIX + "dp_replica_num_requests_running", "Sequences running per replica.",
                                    labels=labels)
        waiting = GaugeMetricFamily(PREFIX + "dp_replica_num_requests_waiting", "Sequences waiting per replica.",
                                    labels=labels)
        kv = GaugeMetricFamily(PREFIX + "dp_replica_kv_cache_usage_perc", "KV-cache usage per replica.",
                               labels=labels)
        hits = CounterMetricFamily(PREFIX + "dp_replica_prefix_cache_hits",
                                   "Prompt tokens found in each replica's prefix cache (since its last start).",
                                   labels=labels)
        queries = CounterMetricFamily(PREFIX + "dp_replica_prefix_cache_queries",
                                      "Prompt tokens looked up in each replica's prefix cache (since its last "
                                      "start).", labels=labels)
        for replica, stats in zip(llm.replicas, llm.replica_stats()):
            values = [name, str(replica.index)]
            routed.add_metric(values, c.routed[replica.index])
            in_flight.add_metric(values, replica.in_flight)
            up.add_metric(values, 1.0 if replica.alive else 0.0)
            if stats is not None:
                running.add_metric(values, stats.num_running)
                waiting.add_metric(values, stats.num_waiting)
                kv.add_metric(values, stats.kv_cache_usage)
                hits.add_metric(values, stats.prefix_cache_hits)
                queries.add_metric(values, stats.prefix_cache_queries)
        yield from (routed, in_flight, up, running, waiting, kv, hits, queries)
