"""Online serving benchmark in the style of `vllm bench serve`: Poisson arrivals at several request rates against
an OpenAI-compatible server, streaming completions; reports TTFT, TPOT, ITL (mean / median / p99), request and
output-token throughput, and the machine's load average during each run.

By default it starts `cinq serve` itself (on the embedded default model, or --model) on a free loopback port,
and afterwards measures the offline engine (`LLMEngine`, all requests at once, same model and engine flags) on
the same workload as the baseline: the ratio says what the HTTP + async + streaming path costs at saturation.

Workload: random token-id prompts (lengths uniform in [input_len/2, 3*input_len/2]), outputs of fixed
per-request lengths (uniform in [output_len/2, 3*output_len/2], ignore_eos), greedy. The client is httpx
(async), reading the SSE stream itself; with stream_options.continuous_usage_stats every chunk says how many
tokens the request has so far, so TTFT and inter-token latencies are exact per engine step.

    python benchmarks/serving.py                         # default model, rates 2,8,32,inf
    python benchmarks/serving.py --model runs/llama-30m --tag llama30m
    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --no-baseline
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before the offline baseline imports torch: see cinq/process_env.py
RESULTS = ROOT / "benchmarks" / "results"


@dataclass
class Result:
    """One request as the client saw it."""

    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def workload(n: int, input_len: int, output_len: int, seed: int, vocab: int = 256) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(0, vocab) for _ in range(rng.randint(input_len // 2, input_len * 3 // 2))],
             rng.randint(max(output_len // 2, 1), output_len * 3 // 2)) for _ in range(n)]


async def one_request(client: httpx.AsyncClient, url: str, model: str | None, prompt: list[int],
                      max_tokens: int) -> Result:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if model:
        body["model"] = model
    res = Result(ok=False, prompt_len=len(prompt))
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                usage = chunk.get("usage") or {}
                tokens = usage.get("completion_tokens", res.output_len)
                if chunk.get("choices") and tokens > res.output_len:
                    now = time.perf_counter()
                    if res.output_len == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.output_len = tokens
        res.latency = time.perf_counter() - start
        res.ok = res.output_len == max_tokens
        if not res.ok:
            res.error = f"got {res.output_len} tokens, asked {max_tokens}"
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


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


async def run_rate(base_url: str, model: str | None, reqs: list[tuple[list[int], int]], rate: float,
                   seed: int) -> tuple[list[Result], float]:
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=len(reqs) + 8, max_keepalive_connections=len(reqs) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for prompt, out_len in reqs:
            tasks.append(asyncio.ensure_future(one_request(client, url, model, prompt, out_len)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    values = sorted(values)
    p99 = values[min(len(values) - 1, max(0, int(round(0.99 * (len(values) - 1)))))]
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "p99": p99}


def summarize(rate: float, results: list[Result], duration: float, load: list[float]) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    return {
        "request_rate": "inf" if rate == float("inf") else rate, "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5], "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": {k: 1000 * v for k, v in _stats([r.ttft for r in ok]).items()},
        "tpot_ms": {k: 1000 * v for k, v in _stats(tpot).items()},
        "itl_ms": {k: 1000 * v for k, v in _stats([x for r in ok for x in r.itl]).items()},
        "e2e_ms": {k: 1000 * v for k, v in _stats([r.latency for r in ok]).items()},
        "load_avg_1m": {"mean": statistics.fmean(load) if load else float("nan"), "max": max(load, default=0.0)},
    }


def start_server(model: str | None, engine_flags: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "cinq.cli", "serve", *([model] if model else []), "--port", "0", *engine_flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("cinq serve exited:\n" + "".join(banner))
        banner.append(line)
        print("  " + line.rstrip())
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining
            return proc, m.group(1)


def offline_baseline(model: str | None, dtype: str, max_num_seqs: int, reqs: list[tuple[list[int], int]],
                     warmup: list[tuple[list[int], int]], num_threads: int | None = None) -> dict:
    """The same workload through the engine directly, all requests queued at once (no HTTP, no asyncio), after
    the same full-size warm-up pass the server got. The step loop runs in its own thread, as in AsyncLLM: on a
    busy 2-core machine torch's CPU ops run many times slower from the main thread than from another thread
    (measured while writing this; see the note in results), so a main-thread loop would not be a fair baseline."""
    from cinq.assets import default_model_path
    from cinq.config import EngineConfig
    from cinq.engine.engine import LLMEngine
    from cinq.sampling_params import OutputKind, SamplingParams
    engine = LLMEngine(EngineConfig(model=model or str(default_model_path()), dtype=dtype, max_num_seqs=max_num_seqs,
                                    num_threads=num_threads))
    result: dict = {}

    def loop() -> None:
        for i, (prompt, out_len) in enumerate(warmup):
            engine.add_request(f"warm-{i}", prompt, SamplingParams(temperature=0, max_tokens=out_len,
                                                                   ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        start = time.perf_counter()
        for i, (prompt, out_len) in enumerate(reqs):
            engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True,
                                                              output_kind=OutputKind.FINAL_ONLY))
        produced = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
        duration = time.perf_counter() - start
        result.update(duration_s=duration, output_tokens=produced, output_throughput=produced / duration,
                      request_throughput=len(reqs) / duration)

    thread = threading.Thread(target=loop, name="offline-engine")
    thread.start()
    thread.join()
    return result


def to_markdown(report: dict) -> str:
    cfg = report["config"]
    lines = [f"# Serving benchmark ({cfg['tag']})", "",
             f"`{cfg['command']}`", "",
             f"Model: {cfg['model']} ({cfg['dtype']}); {cfg['num_prompts']} requests per rate, prompt lengths "
             f"{cfg['input_len'] // 2}-{cfg['input_len'] * 3 // 2} tokens, outputs {max(cfg['output_len'] // 2, 1)}-"
             f"{cfg['output_len'] * 3 // 2} tokens (ignore_eos, greedy), streaming /v1/completions via httpx. "
             f"Machine: {cfg['machine']}. Server and offline engine each ran one full-size warm-up pass on "
             f"other prompts first; every rate gets fresh prompts (no prefix-cache hits across runs).", "",
             "| rate (req/s) | done | req/s | out tok/s | TTFT mean / med / p99 (ms) | TPOT mean / med / p99 (ms) "
             "| ITL mean / med / p99 (ms) | load avg (mean / max) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        f = lambda d: f"{d['mean']:.0f} / {d['median']:.0f} / {d['p99']:.0f}"  # noqa: E731
        lines.append(f"| {r['request_rate']} | {r['completed']}/{r['completed'] + r['failed']} | "
                     f"{r['request_throughput']:.2f} | {r['output_throughput']:.1f} | {f(r['ttft_ms'])} | "
                     f"{f(r['tpot_ms'])} | {f(r['itl_ms'])} | {r['load_avg_1m']['mean']:.1f} / "
                     f"{r['load_avg_1m']['max']:.1f} |")
    base = report.get("baseline")
    if base:
        lines += ["", f"Baseline, offline `LLMEngine` on the same {cfg['num_prompts']} requests queued at once: "
                      f"{base['output_throughput']:.1f} output tok/s ({base['request_throughput']:.2f} req/s). "
                      f"Server at rate=inf / offline: **{report['ratio_inf_vs_offline']:.2f}x** output tokens/s."]
    if cfg.get("note"):
        lines += ["", cfg["note"]]
    lines += ["", "TTFT: send to first streamed token; TPOT: (latency - TTFT) / (output tokens - 1) per request; "
                  "ITL: gaps between a request's streamed chunks as the client reads them (vLLM's definition; a chunk "
                  "is one engine step, or several merged when a reader falls behind, so at saturation, where the "
                  "client shares the 2 cores, several arrive per wake-up and the median can be ~0). The client runs "
                  "on the same machine as the server; the load average column says how busy the machine was (other "
                  "jobs included)."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = report["runs"]
    labels = [str(r["request_rate"]) for r in runs]
    x = range(len(runs))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in [(axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")]:
        for stat, style in [("median", "o-"), ("p99", "s--")]:
            ax.plot(x, [r[key][stat] for r in runs], style, label=stat)
        ax.set_title(title)
        ax.legend()
    axes[2].plot(x, [r["output_throughput"] for r in runs], "o-", label="server")
    if report.get("baseline"):
        axes[2].axhline(report["baseline"]["output_throughput"], color="gray", ls=":", label="offline engine")
    axes[2].set_title("output tokens/s")
    axes[2].legend()
    for ax in axes:
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=.3)
    fig.suptitle(f"cinq serve — {report['config']['tag']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    ap.add_argument("--base-url", default=None, help="benchmark this running server instead of starting one")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--rates", default="2,8,32,inf", help="comma-separated request rates (req/s); inf = all at once")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (server and baseline)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--tag", default="default-model")
    ap.add_argument("--note", default="", help="a line for the markdown (e.g. how --model was built)")
    ap.add_argument("--quick", action="store_true", help="16 requests, rates 8,inf (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.rates = 16, "8,inf"
    rates = [float(r) for r in args.rates.split(",")]
    # Fresh prompts for every rate: the server's prefix cache must not turn later runs into cache hits.
    workloads = [workload(args.num_prompts, args.input_len, args.output_len, args.seed + 1 + i)
                 for i in range(len(rates))]
    # One full-size pass first, on other prompts, so that one-time costs (allocations, first use of each batch
    # shape, connection set-up) land on no measured run.
    warmup = workload(args.num_prompts, args.input_len, args.output_len, args.seed + 1000)
    proc = None
    base_url = args.base_url
    if base_url is None:
        flags = ["--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
                 "--max-waiting-requests", str(10 * args.num_prompts)]
        if args.num_threads:
            flags += ["--num-threads", str(args.num_threads)]
        proc, base_url = start_server(args.model, flags)
    runs = []
    try:
        asyncio.run(run_rate(base_url, args.served_model_name, warmup, float("inf"), args.seed))
        for rate, reqs in zip(rates, workloads):
            with LoadSampler() as load:
                results, duration = asyncio.run(run_rate(base_url, args.served_model_name, reqs, rate, args.seed))
            runs.append(summarize(rate, results, duration, load.samples))
            r = runs[-1]
            print(f"rate {r['request_rate']}: {r['completed']} ok, {r['failed']} failed, "
                  f"{r['request_throughput']:.2f} req/s, {r['output_throughput']:.1f} out tok/s, TTFT median "
                  f"{r['ttft_ms']['median']:.0f} ms, TPOT median {r['tpot_ms']['median']:.1f} ms, ITL median "
                  f"{r['itl_ms']['median']:.1f} ms, load {r['load_avg_1m']['mean']:.1f}", flush=True)
            if r["errors"]:
                print("  errors:", r["errors"])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    report = {"config": {**{k: v for k, v in vars(args).items() if k != "base_url"},
                         "model": args.model or "embedded default model",
                         "command": "python benchmarks/serving.py " + " ".join(sys.argv[1:]),
                         "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"},
              "runs": runs}
    if not args.no_baseline and args.base_url is None:
        inf_runs = [r for r in runs if r["request_rate"] == "inf"]
        # The offline engine gets the workload of the rate=inf run (else the last one), in a fresh engine.
        same = workloads[[str(r["request_rate"]) for r in runs].index("inf")] if inf_runs else workloads[-1]
        base = offline_baseline(args.model, args.dtype, args.max_num_seqs, same, warmup, args.num_threads)
        report["baseline"] = base
        if inf_runs:
            report["ratio_inf_vs_offline"] = inf_runs[0]["output_throughput"] / base["output_throughput"]
            print(f"offline engine: {base['output_throughput']:.1f} out tok/s; server at rate=inf / offline = "
                  f"{report['ratio_inf_vs_offline']:.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "serving" if args.tag == "default-model" else f"serving_{args.tag}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(to_markdown(report))
    plot(report, RESULTS / f"{stem}.png")
    print(to_markdown(report))
    print(f"wrote {RESULTS / stem}.{{md,json,png}}")


if __name__ == "__main__":
    main()
