"""One measured run of an engine configuration over a workload at one request rate, in process: requests arrive
at seeded Poisson times (``rate = inf``: all at once), the engine steps while any is unfinished, and every
request's time to first token and time per output token are taken from its own metrics, counted from its
scheduled arrival (a request due while a step runs still waits from when it was due, as a client would).

Besides latency and tokens/s it samples, every step, the KV blocks live requests hold (peak, in bytes with the
executor's own bytes per block) and the share of those blocks' slots that hold no computed token (KV waste:
the partly filled last blocks, and slots reserved for drafts not yet verified) and the mean number of running
requests per step (the batch the run actually reached). Each request's emission times are kept too, for
inter-token latency (ITL: the gaps between a request's successive tokens, a step that emits several tokens at once
counting as that many equal gaps)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cinq.bench.drive import run_until_done
from cinq.bench.latency_stats import percentile
from cinq.bench.workload import BenchRequest
from cinq.config import EngineConfig
from cinq.outputs import mean_acceptance_length
from cinq.engine.core import module_bytes  # noqa: F401 (re-export: the benchmarks' weight-bytes column)
from cinq.errors import InvalidParameterError

if TYPE_CHECKING:
    from cinq.engine.protocol import OfflineEngine


@dataclass(slots=True)
class RateRun:
    """What one run measured. Latencies in milliseconds (p50 / p99 over requests)."""

    rate: float
    num_requests: int
    output_tokens: int
    seconds: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    peak_kv_blocks: int
    kv_bytes_per_block: int
    kv_waste: float  # slots of held blocks without a computed token / slots of held blocks, over all steps
    tau: float | None  # speculative decoding: tokens per verify step (None without drafts)
    prefix_cache_hit_rate: float
    weight_bytes: int
    mean_running: float = 0.0  # running requests per engine step, averaged over the run's steps
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    ttft_s: list[float] = field(default_factory=list, repr=False)  # per request, seconds from its arrival
    token_times: list[list[float]] = field(default_factory=list, repr=False)  # per request: one time per token

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def peak_kv_bytes(self) -> int:
        return self.peak_kv_blocks * self.kv_bytes_per_block

    def summary(self) -> dict[str, Any]:
        """Everything but the outputs, for the JSON."""
        return {"rate": self.rate, "num_requests": self.num_requests, "output_tokens": self.output_tokens,
                "seconds": self.seconds, "tok_s": self.tok_s, "ttft_p50_ms": self.ttft_p50_ms,
                "ttft_p99_ms": self.ttft_p99_ms, "tpot_p50_ms": self.tpot_p50_ms, "tpot_p99_ms": self.tpot_p99_ms,
                "peak_kv_blocks": self.peak_kv_blocks, "peak_kv_bytes": self.peak_kv_bytes,
                "kv_waste": self.kv_waste, "tau": self.tau, "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "weight_bytes": self.weight_bytes, "mean_running": self.mean_running}

    def itl_ms(self, indices: list[int] | None = None) -> list[float]:
        """Inter-token gaps in milliseconds of the requests at ``indices`` (default: all), pooled."""
        gaps = []
        for i in range(len(self.token_times)) if indices is None else indices:
            times = self.token_times[i]
            gaps += [1000 * (b - a) for a, b in zip(times, times[1:])]
        return gaps


def check_fixed_rate(rate: float) -> None:
    """A benchmark's fixed request rate (its rate = inf run is always made besides): a finite number > 0."""
    if not rate > 0 or math.isinf(rate):
        raise InvalidParameterError(f"request_rate must be a finite number > 0 (rate = inf is always run), got "
                                    f"{rate}", "request_rate")


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each of ``n`` requests arrives: a seeded Poisson process of ``rate``
    requests per second; all at 0 for ``rate = inf``."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run_at_rate(engine: Any, requests: list[BenchRequest], rate: float, seed: int = 0,
                offsets: list[float] | None = None) -> RateRun:
    """Serve ``requests`` (greedy, exactly ``output_len`` tokens each) arriving at ``rate`` on ``engine`` (an
    ``OfflineEngine``, its core here or in its own process, with nothing in flight); see the module docstring. ``offsets`` (seconds after the start, one per
    request, ascending) replaces the Poisson arrivals of ``rate`` for a workload with its own timing."""
    from cinq.sampling_params import SamplingParams
    if offsets is None:
        offsets = arrival_offsets(len(requests), rate, seed)
    if len(offsets) != len(requests) or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise InvalidParameterError(f"offsets must give one ascending arrival time per request ({len(requests)}), "
                                    f"got {len(offsets)}", "offsets")
    before = engine.get_stats()
    finished: dict[str, Any] = {}
    due: dict[str, float] = {}
    held_slots = held_tokens = peak_blocks = steps = running_sum = 0
    emitted: dict[str, list[float]] = {}
    nxt = 0
    wall0, t0 = time.time(), time.perf_counter()
    while nxt < len(requests) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < len(requests) and offsets[nxt] <= now:
            rid = f"r{nxt}"
            req = requests[nxt]
            due[rid] = wall0 + offsets[nxt]
            engine.add_request(rid, req.prompt, SamplingParams(temperature=0.0, max_tokens=req.output_len,
                                                               ignore_eos=True), arrival_time=due[rid])
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, offsets[nxt] - (time.perf_counter() - t0)))
            continue
        outs = engine.step()
        now_wall = time.time()
        for out in outs:
            _record_emission(emitted.setdefault(out.request_id, []), len(out.outputs[0].token_ids), now_wall)
            if out.finished:
                finished[out.request_id] = out
        # the batch this step served: what still runs plus what it finished; the KV held, as the core publishes it
        st = engine.get_stats()
        running_sum += st.num_running + sum(1 for out in outs if out.finished)
        steps += 1
        held_slots += st.kv_slots_held
        held_tokens += st.kv_tokens_held
        peak_blocks = max(peak_blocks, round(st.kv_cache_usage * st.num_kv_blocks))
    seconds = time.perf_counter() - t0
    after = engine.get_stats()
    ttft, tpot, outputs, token_times = [], [], [], []
    for i in range(len(requests)):
        out = finished[f"r{i}"]
        m = out.metrics
        ids = out.outputs[0].token_ids
        outputs.append(list(ids))
        token_times.append(emitted.get(f"r{i}", []))
        ttft.append(m.first_token_time - due[f"r{i}"])
        if len(ids) > 1:
            tpot.append((m.last_token_time - m.first_token_time) / (len(ids) - 1))
    drafts = after.spec_decode_num_drafts - before.spec_decode_num_drafts
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    return RateRun(rate, len(requests), sum(len(o) for o in outputs), seconds,
                   1000 * percentile(ttft, 50), 1000 * percentile(ttft, 99),
                   1000 * percentile(tpot, 50), 1000 * percentile(tpot, 99), peak_blocks,
                   engine.info.kv_bytes_per_block,
                   1 - held_tokens / held_slots if held_slots else 0.0,
                   mean_acceptance_length(accepted, drafts), hits / queries if queries else 0.0,
                   engine.info.weight_bytes, running_sum / steps if steps else 0.0, outputs, ttft, token_times)


def rotated(items: list[Any], n: int) -> list[Any]:
    """``items`` started at position ``n`` (mod their count): the order of round ``n`` when configurations take
    turns on a machine whose speed drifts."""
    k = n % len(items) if items else 0
    return items[k:] + items[:k]


def median_by(summaries: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Of several rounds' summaries, the one whose ``key`` is the median (the upper one of an even count)."""
    return sorted(summaries, key=lambda s: s[key])[len(summaries) // 2]


def _record_emission(times: list[float], num_tokens: int, now: float) -> None:
    """Extend one request's emission times to ``num_tokens`` tokens at ``now``; several new tokens in one step
    (speculation) share the gap since its previous token equally, so ITL is per token, not per step."""
    new = num_tokens - len(times)
    if new <= 0:
        return
    last = times[-1] if times else now
    times += [last + (now - last) * (j + 1) / new for j in range(new)]


def build_engine(config: EngineConfig, warmup_prompt_len: int = 8, engine_core: str = "inproc") -> OfflineEngine:
    """An offline engine for ``config`` (its core here, or in its own process: ``engine_core``) after one warm-up
    request (kernels built, allocator warm; a long warm-up prompt also warms the prefill shapes of long prompts);
    the warm-up prompt (the last vocabulary id repeated) shares no prefix-cache block with a real prompt. The
    caller shuts it down."""
    from cinq.engine.protocol import make_llm_engine
    from cinq.sampling_params import SamplingParams
    engine = make_llm_engine(config, engine_core)
    try:
        engine.add_request("warmup", [engine.vocab_size - 1] * warmup_prompt_len,
                           SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        run_until_done(engine)
    except BaseException:
        engine.shutdown()
        raise
    return engine
