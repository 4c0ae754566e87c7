"""Prometheus metrics under vLLM's names with a ``cinq:`` prefix, so vLLM's Grafana dashboards work after a
find-and-replace of the prefix.

Engine state and counters are read from the engine's stats snapshot at scrape time (no double bookkeeping);
latency histograms are observed once per finished request from its ``RequestMetrics``. ``prompt_tokens`` is the
server's own count, as vLLM's is: every admitted request's whole prompt, once (the engine's count leaves out the
prefix-cache hits and counts a preempted prompt again; ``prefix_cache_hits`` says how much was cached).

The speculative-decoding counters ``spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens``
carry, besides the series without a language (all requests, as vLLM has it), one series per language tag that
requests were sent with (``language="de"``; "*" gathers the tags past the engine's cap). Untagged requests are in
the unlabelled series only, so select ``{language=""}`` for the totals: summing over every series counts tagged
requests twice. tau per language = 1 + accepted / drafts of that language's series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cinq.outputs import EngineStats, RequestOutput

PREFIX = "cinq:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket edges in seconds: from sub-millisecond steps on a GPU to minutes-long CPU requests.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 10.0, 20.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0)
FINISH_REASONS = ("stop", "length", "abort")


class _EngineCollector(Collector):
    """Gauges and counters straight from the engine's latest stats snapshot."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str, prompt_tokens: Callable[[], int]) -> None:
        self.stats, self.model_name, self.prompt_tokens = stats, model_name, prompt_tokens

    def collect(self) -> Iterator[Metric]:
        s, labels = self.stats(), ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        yield gauge("num_requests_running", "Sequences in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Sequences waiting to be scheduled.", s.num_waiting)
        yield gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", s.kv_cache_usage)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        yield counter("num_preemptions", "Preemptions (a running sequence's blocks taken back).", s.num_preemptions)
        yield counter("prompt_tokens", "Prompt tokens of the requests admitted: each request's whole prompt, once "
                      "(prefix-cache hits included).", self.prompt_tokens())
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens)
        def by_language(name: str, doc: str, total: int, attr: str) -> CounterMetricFamily:
            c = counter(name, doc + " Without language: all requests; with it: those sent with that tag.", total)
            for language, counts in sorted(s.spec_decode_by_language.items()):
                c.add_sample(c.name + "_total", {"model_name": self.model_name, "language": language},
                             getattr(counts, attr))
            return c

        yield by_language("spec_decode_num_drafts", "Speculative verify steps that carried drafts.",
                          s.spec_decode_num_drafts, "num_drafts")
        yield by_language("spec_decode_num_draft_tokens", "Draft tokens proposed.", s.spec_decode_num_draft_tokens,
                          "num_draft_tokens")
        yield by_language("spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                          s.spec_decode_num_accepted_tokens, "num_accepted_tokens")
        per_pos = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted, by position in the draft.", labels=labels + ["position"])
        for pos, n in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
            per_pos.add_metric(values + [str(pos)], n)
        yield per_pos
        success = CounterMetricFamily(PREFIX + "request_success", "Finished requests by finish reason.",
                                      labels=labels + ["finished_reason"])
        for reason in sorted(set(FINISH_REASONS) | set(s.finished_by_reason)):
            success.add_metric(values + [reason], s.finished_by_reason.get(reason, 0))
        yield success


class ServerMetrics:
    """One registry per server (so several servers can live in one process, as in the tests)."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        self.prompt_tokens = 0  # read at scrape time; added to on the event loop, as scrapes run there too
        self.registry.register(_EngineCollector(stats, model_name, lambda: self.prompt_tokens))
        self.model_name = model_name

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets,
                             registry=self.registry).labels(model_name)

        self.ttft = hist("time_to_first_token_seconds", "Arrival to first generated token.", TTFT_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds",
                         "Mean time between a request's output tokens after the first.", TPOT_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduling.", REQUEST_BUCKETS)
        # Sequences per request (n) for requests with n > 1, from add to finish or release: a streamed request's
        # final output holds only the completions that changed in its last step, so its n cannot be read there.
        self._num_seqs: dict[str, int] = {}

    def track(self, request_id: str, n: int, num_prompt_tokens: int = 0) -> None:
        """Count an admitted request's prompt; remember its ``n`` until it finishes (or ``release`` drops it:
        aborted, never finishes)."""
        self.prompt_tokens += num_prompt_tokens
        if n > 1:
            self._num_seqs[request_id] = n

    def release(self, request_id: str) -> None:
        self._num_seqs.pop(request_id, None)

    def observe_finished(self, out: RequestOutput) -> None:
        """Record the latencies of a finished request (hooked to AsyncLLM.finished_callbacks)."""
        m = out.metrics
        if m is None:
            return
        if m.first_scheduled_time is not None:
            self.queue.observe(max(m.first_scheduled_time - m.arrival_time, 0.0))
        if m.first_token_time is not None:
            self.ttft.observe(max(m.first_token_time - m.arrival_time, 0.0))
        if m.finished_time is not None:
            self.e2e.observe(max(m.finished_time - m.arrival_time, 0.0))
        # Per sequence: n completions decode side by side, so their tokens share the same wall time. n is the
        # request's, not len(out.outputs): a streamed (delta) final output lists only what changed last.
        n = self._num_seqs.pop(out.request_id, None) or max(len(out.outputs), 1)
        per_seq = m.num_generation_tokens / n
        if m.first_token_time is not None and m.last_token_time is not None and per_seq > 1:
            self.tpot.observe(max(m.last_token_time - m.first_token_time, 0.0) / (per_seq - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
