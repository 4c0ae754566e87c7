"""Online serving in the style of ``vllm bench serve``: Poisson arrivals at several request rates against an
OpenAI-compatible server, streaming completions; TTFT, TPOT, ITL (mean / median / p99), request and output-token
throughput, and the machine's load average during each run.

By default it starts ``cinq serve`` itself with the engine flags given (on a free loopback port) and afterwards
measures the offline engine (``LLMEngine``, all requests at once, same engine config) on the rate=inf workload as
the baseline: the ratio says what the HTTP + async + streaming path costs at saturation. The server's engine core
runs in its own process (``--engine-core process``, cinq serve's default): CPU cores are reported for the front
end (HTTP, detokenization, SSE) and the core (the step loop) apart. With the baseline it also measures the process
hop's latency for one request of one token (``cinq.bench.core_hop``).

Workload: random token-id prompts (lengths uniform in [input_len/2, 3*input_len/2]), outputs uniform in
[output_len/2, 3*output_len/2] (ignore_eos), greedy. The client (httpx, async) reads the SSE stream itself; with
``stream_options.continuous_usage_stats`` every chunk says how many tokens the request has, so TTFT and
inter-token latencies are exact per engine step. Every rate gets fresh prompts (no prefix-cache hits across
runs), after one full-size warm-up pass on other prompts."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.bench.latency_stats import summarize_ms
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.serve_client import ClientResult, run_rate
from cinq.bench.workload import BenchRequest, around, random_requests
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, bounded_each, check_bounds


@dataclass(slots=True)
class ServeOptions:
    """The workload, the rates and where the server is."""

    request_rates: tuple[float, ...] = bounded_each((2.0, 8.0, 32.0, float("inf")), gt=0)  # inf: all at once
    num_prompts: int = bounded(64, ge=1)
    input_len: int = bounded(128, ge=1)
    output_len: int = bounded(64, ge=1)
    seed: int = 0
    baseline: bool = True
    base_url: str | None = None  # a running server to measure instead of starting one
    served_model_name: str | None = None
    tag: str = "default-model"
    note: str = ""
    command: str = ""  # the command line, for the report
    engine_core: str = "process"  # cinq serve --engine-core
    hop: bool = True  # with the baseline: the process hop's latency, one request of one token

    def validate(self) -> None:
        check_bounds(self)


def run_serve(config: EngineConfig, options: ServeOptions, progress: bool = True) -> BenchResult:
    """Measure the server at each rate, then (unless off, or measuring someone else's server) the offline
    engine on the rate=inf workload."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise InvalidParameterError("cinq bench serve needs httpx (pip install httpx)", "httpx") from None
    options.validate()
    vocab = _vocab_size(config)
    workloads = [random_requests(options.num_prompts, vocab, around(options.input_len), around(options.output_len),
                                 options.seed + 1 + i) for i in range(len(options.request_rates))]
    # one full-size pass first, on other prompts, so that one-time costs land on no measured run
    warmup = random_requests(options.num_prompts, vocab, around(options.input_len), around(options.output_len),
                             options.seed + 1000)
    proc, base_url = None, options.base_url
    if base_url is None:
        proc, base_url, core_pid = start_server(config, ["--max-waiting-requests", str(10 * options.num_prompts),
                                                         "--engine-core", options.engine_core])
    else:
        core_pid = None
    runs = []
    try:
        asyncio.run(run_rate(base_url, options.served_model_name, warmup, float("inf"), options.seed))
        for rate, reqs in zip(options.request_rates, workloads):
            bar = progress_bar(len(reqs), f"rate {rate:g}", progress)
            client0, server0, core0 = time.process_time(), process_cpu_s(proc), pid_cpu_s(core_pid)
            with LoadSampler() as load:
                results, duration = asyncio.run(run_rate(base_url, options.served_model_name, reqs, rate,
                                                         options.seed, on_done=lambda: bar.update(1)))
            bar.close()
            run = summarize(rate, results, duration, load.samples)
            # CPU seconds per wall second: on a machine of few cores the client's share is taken from the server
            run["client_cores"] = (time.process_time() - client0) / duration
            if proc is not None:
                run["server_cores"] = (process_cpu_s(proc) - server0) / duration
            if core_pid is not None:
                run["core_cores"] = (pid_cpu_s(core_pid) - core0) / duration
            runs.append(run)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    data: dict[str, Any] = {
        "config": {"model": model_label(config.model), "dtype": config.dtype, "tag": options.tag,
                   "num_prompts": options.num_prompts, "input_len": options.input_len,
                   "output_len": options.output_len, "command": options.command, "note": options.note,
                   "engine_core": options.engine_core},
        "machine": machine_info(), "runs": runs}
    if options.baseline and options.base_url is None:
        at = [r["request_rate"] for r in runs].index("inf") if "inf" in [r["request_rate"] for r in runs] else -1
        base = offline_baseline(config, workloads[at], warmup)
        data["baseline"] = base
        data["ratio_server_over_offline"] = runs[at]["output_throughput"] / base["output_throughput"]
        data["ratio_rate"] = runs[at]["request_rate"]
        if options.hop:
            from cinq.bench.core_hop import measure_hop
            data["hop"] = measure_hop(config)
    return _result(data)


def _vocab_size(config: EngineConfig) -> int:
    from cinq.config import resolve_model
    from cinq.model.config import ModelConfig
    return ModelConfig.from_pretrained(resolve_model(config.model)).vocab_size


class LoadSampler:
    """Samples the 1-minute load average once a second while a run lasts."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(1.0)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summarize(rate: float, results: list[ClientResult], duration: float, load: list[float]) -> dict[str, Any]:
    """vLLM's serving metrics for one rate."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "request_rate": "inf" if rate == float("inf") else rate, "completed": len(ok),
        "failed": len(results) - len(ok), "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration, "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": summarize_ms([r.ttft for r in ok]), "tpot_ms": summarize_ms(tpot),
        "itl_ms": summarize_ms([x for r in ok for x in r.itl]), "e2e_ms": summarize_ms([r.latency for r in ok]),
        "load_avg_1m": {"mean": statistics.fmean(load) if load else float("nan"), "max": max(load, default=0.0)},
    }


def start_server(config: EngineConfig, server_flags: list[str]) -> tuple[subprocess.Popen, str, int | None]:
    """``cinq serve`` with this engine config on a free loopback port, in a child process running this copy
    of cinq; returns it, its URL once it listens and its engine core's pid (None: the core is in the server's
    process)."""
    from cinq.config_argv import engine_argv
    cmd = [sys.executable, "-m", "cinq.cli", "serve", *engine_argv(config), "--port", "0", *server_flags]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    banner = []
    while True:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            proc.wait()
            raise RuntimeError("cinq serve exited:\n" + "".join(banner[-20:]))
        banner.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining
            core = re.search(r"engine core in process (\d+)", "".join(banner))
            return proc, m.group(1), int(core.group(1)) if core else None


def process_cpu_s(proc: subprocess.Popen | None) -> float:
    """User + system CPU seconds of a child process so far (Linux /proc; 0 elsewhere or without one)."""
    return pid_cpu_s(proc.pid if proc is not None else None)


def pid_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far, its own threads only (Linux /proc; 0 otherwise)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def offline_baseline(config: EngineConfig, reqs: list[BenchRequest], warmup: list[BenchRequest]) -> dict[str, Any]:
    """The same workload through the engine directly, all requests queued at once (no HTTP, no asyncio), after
    the same full-size warm-up pass the server got. The step loop runs in its own thread, as in AsyncLLM: on a
    busy 2-core machine torch's CPU ops ran many times slower from the main thread than from another thread, so a
    main-thread loop would not be a fair baseline."""
    from cinq.bench.drive import run_until_done
    from cinq.engine.engine import LLMEngine
    from cinq.sampling_params import OutputKind, SamplingParams
    engine = LLMEngine(config)
    result: dict[str, Any] = {}

    def loop() -> None:
        for i, r in enumerate(warmup):
            engine.add_request(f"warm-{i}", r.prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                                     ignore_eos=True))
        run_until_done(engine)
        start, cpu0 = time.perf_counter(), time.process_time()
        for i, r in enumerate(reqs):
            engine.add_request(str(i), r.prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                                ignore_eos=True, output_kind=OutputKind.FINAL_ONLY))
        outs = run_until_done(engine)
        duration = time.perf_counter() - start
        produced = sum(len(o.outputs[0].token_ids) for o in outs.values())
        result.update(duration_s=duration, output_tokens=produced, output_throughput=produced / duration,
                      request_throughput=len(reqs) / duration, cores=(time.process_time() - cpu0) / duration)

    thread = threading.Thread(target=loop, name="offline-engine")
    thread.start()
    thread.join()
    return result


def _result(data: dict[str, Any]) -> BenchResult:
    cfg, m = data["config"], data["machine"]
    f = lambda d: f"{d['mean']:.0f} / {d['median']:.0f} / {d['p99']:.0f}"  # noqa: E731
    table = Table("Server, streaming /v1/completions", [
        "rate (req/s)", "done", "req/s", "out tok/s", "TTFT mean / med / p99 (ms)", "TPOT mean / med / p99 (ms)",
        "ITL mean / med / p99 (ms)", "CPU cores used: front end / core / client", "load avg (mean / max)"])

    def cores(r: dict[str, Any]) -> str:
        front = f"{r['server_cores']:.2f}" if "server_cores" in r else "-"
        core = f"{r['core_cores']:.2f}" if "core_cores" in r else "-"
        return f"{front} / {core} / {r.get('client_cores', float('nan')):.2f}"

    for r in data["runs"]:
        table.rows.append([_rate(r["request_rate"]), f"{r['completed']}/{r['completed'] + r['failed']}",
                           r["request_throughput"], r["output_throughput"], f(r["ttft_ms"]), f(r["tpot_ms"]),
                           f(r["itl_ms"]), cores(r),
                           f"{r['load_avg_1m']['mean']:.1f} / {r['load_avg_1m']['max']:.1f}"])
    base = data.get("baseline")
    if base:
        table.rows.append(["offline engine (baseline)", f"{cfg['num_prompts']}/{cfg['num_prompts']}",
                           base["request_throughput"], base["output_throughput"], "", "", "",
                           f"{base.get('cores', float('nan')):.2f} (engine)", ""])
        table.rows.append([f"server at rate {data['ratio_rate']} / offline", "", "",
                           data["ratio_server_over_offline"], "", "", "", "", ""])
        headline = (f"server at rate {data['ratio_rate']} / offline engine = "
                    f"{data['ratio_server_over_offline']:.2f}x output tokens/s")
    else:
        headline = "no offline baseline (--no-baseline, or --base-url names a server this run did not start)"
    hop = data.get("hop")
    if hop:
        table.rows.append(["1 request, 1 token: core in process / in-process (ms, median)", "", "", "",
                           f"{hop['process']['median']:.1f} / {hop['inproc']['median']:.1f}", "", "",
                           f"hop: {hop['overhead_ms']:+.1f} ms", ""])
    setup = (f"`{cfg['command']}`\n\nModel: {cfg['model']} ({cfg['dtype']}); {cfg['num_prompts']} requests per "
             f"rate, prompt lengths {around(cfg['input_len'])} tokens, outputs {around(cfg['output_len'])} tokens "
             f"(ignore_eos, greedy), streaming /v1/completions via httpx. Machine: {m['cpu']}, {m['cpus']} CPUs. "
             f"Server and offline engine each ran one full-size warm-up pass on other prompts first; every rate "
             f"gets fresh prompts (no prefix-cache hits across runs).")
    notes = [cfg["note"]] if cfg["note"] else []
    notes.append("TTFT: send to first streamed token; TPOT: (latency - TTFT) / (output tokens - 1) per request; "
                 "ITL: gaps between a request's streamed chunks as the client reads them (vLLM's definition; a "
                 "chunk is one engine step, or several merged when a reader falls behind, so at saturation the "
                 "median can be ~0). The client runs on the same machine as the server; the load average column "
                 "says how busy the machine was (other jobs included). CPU cores used: CPU seconds per wall second "
                 "of the server's front end process (HTTP, detokenization, SSE), of its engine core process (the step "
                 "loop; '-' when the core runs inside the server) and of the benchmark's client (this process) "
                 "during the run, and of the offline engine during its run: where cores are few, what the client "
                 "uses the server cannot.")

    def plot(fig: Any) -> None:
        runs = data["runs"]
        labels = [_rate(r["request_rate"]) for r in runs]
        x = list(range(len(runs)))
        axes = fig.subplots(1, 3)
        for ax, key, title in [(axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")]:
            for stat, style in [("median", "o-"), ("p99", "s--")]:
                ax.plot(x, [r[key][stat] for r in runs], style, label=stat)
            ax.set_title(title)
            ax.legend()
        axes[2].plot(x, [r["output_throughput"] for r in runs], "o-", label="server")
        if base:
            axes[2].axhline(base["output_throughput"], color="gray", ls=":", label="offline engine")
        axes[2].set_title("output tokens/s")
        axes[2].legend()
        for ax in axes:
            ax.set_xticks(x, labels)
            ax.set_xlabel("request rate (req/s)")
            ax.grid(alpha=.3)

    return BenchResult("serve", f"Serving benchmark ({cfg['tag']})", setup, [table], headline, data, notes, plot)


def _rate(rate: float | str) -> str:
    return rate if isinstance(rate, str) else f"{rate:g}"
