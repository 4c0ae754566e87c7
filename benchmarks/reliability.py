"""Reliability runs against a live `cinq serve` on loopback: a long mixed soak, overload at 4x the KV capacity
and clients that vanish at random points. Reports what was tried, how much, and what was lost (completed /
failed / aborted requests, preemptions, KV blocks free at the end, the server's RSS curve), and writes
`benchmarks/results/reliability.{md,json,png}`.

    python benchmarks/reliability.py                          # all three, 10,000-request soak (long: run in the
                                                              # background with nohup)
    python benchmarks/reliability.py --only soak --soak-requests 3000 --tag quick

The soak's requests mix chat and completions, streaming and not, n = 2, stop strings, logprobs, echo (with
prompt scoring), prompts sharing long prefixes, seeded sampling, and every ``--big-every``-th request carries a
``--big-body-mb`` MB body (a long ``user`` field). Seeded "probe" requests recur through the soak and are sent
again alone at the end: their outputs must be identical (batch invariance). The helpers here (``mixed_request``,
``run_mixed``, ``overload``, ``disconnects``) are reused by ``tests/reliability``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from benchmarks.reliability_report import plot, to_markdown  # noqa: E402
from benchmarks.reliability_requests import (Outcome, Req, big_body, mixed_request, probe_request,  # noqa: E402
                                             random_words, send)


# ---- server and sampling ------------------------------------------------------------------------------------------
def start_server(model: str | None, flags: list[str]) -> tuple[subprocess.Popen, str]:
    """`cinq serve` on a free loopback port; returns the process and its base URL once it listens."""
    cmd = [sys.executable, "-m", "cinq.cli", "serve", *([model] if model else []), "--port", "0", *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = []
    for line in proc.stdout:  # type: ignore[union-attr]
        banner.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining
            return proc, m.group(1)
    raise RuntimeError("cinq serve exited:\n" + "".join(banner))


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class RSSSampler:
    """Samples a process's RSS every ``interval`` s with the number of requests done so far."""

    def __init__(self, pid: int, progress: list[int], interval: float = 0.5) -> None:
        self.pid, self.progress, self.interval = pid, progress, interval
        self.samples: list[tuple[float, int, int]] = []  # (seconds, requests done, rss bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - self._t0, self.progress[0], rss_bytes(self.pid)))
            except OSError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def stats(base: str) -> dict:
    return httpx.get(base + "/stats", timeout=30).json()


def wait_idle(base: str, timeout: float = 30.0) -> tuple[dict, float]:
    """Poll /stats until nothing runs or waits and no block is held; returns the stats and the seconds waited."""
    t0 = time.monotonic()
    while True:
        s = stats(base)
        if s["num_requests_running"] == 0 and s["num_requests_waiting"] == 0 and s["kv_cache_usage"] == 0:
            return s, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return s, time.monotonic() - t0
        time.sleep(0.02)


# ---- the runs ---------------------------------------------------------------------------------------------------
async def run_mixed(base: str, model: str, n: int, concurrency: int, seed: int = 0, big_every: int = 0,
                    big_mb: int = 50, progress: list[int] | None = None, log_every: int = 0) -> dict:
    """``n`` mixed requests from ``concurrency`` workers; then every probe seen is re-sent alone and compared."""
    rng = random.Random(seed)
    body = big_body(model, big_mb) if big_every else None
    reqs = [mixed_request(i, rng, model, big_every, body) for i in range(n)]
    progress = progress if progress is not None else [0]
    outcomes: list[Outcome | None] = [None] * n
    nxt = iter(range(n))
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        async def worker() -> None:
            for i in nxt:
                outcomes[i] = await send(client, base, reqs[i])
                progress[0] += 1
                if log_every and progress[0] % log_every == 0:
                    print(f"  {progress[0]}/{n} requests, {time.monotonic() - t0:.0f}s", flush=True)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        duration = time.monotonic() - t0
        solo: dict[int, Outcome] = {}
        for k in sorted({r.probe for r in reqs if r.probe is not None}):
            solo[k] = await send(client, base, probe_request(k, model))
    done = [o for o in outcomes if o is not None]
    mismatches = sum(1 for r, o in zip(reqs, done) if r.probe is not None and o.ok and solo[r.probe].ok
                     and o.texts != solo[r.probe].texts)
    return {"requests": n, "concurrency": concurrency, "duration_s": duration,
            "completed": sum(o.ok for o in done), "failed": sum(not o.ok for o in done),
            "by_kind": dict(Counter(o.kind for o in done)),
            "errors": dict(Counter(o.error for o in done if not o.ok).most_common(5)),
            "probes_under_load": sum(r.probe is not None for r in reqs), "probe_mismatches": mismatches,
            "probe_solo_failed": sum(not o.ok for o in solo.values())}


async def overload(base: str, model: str, streams: int = 128, prompt_words: int = 40, max_tokens: int = 80) -> dict:
    """``streams`` concurrent streaming completions that together need several times the KV cache."""
    rng = random.Random(3)
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    before = stats(base)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        reqs = [Req("overload", "/v1/completions",
                    {"model": model, "prompt": random_words(rng, prompt_words), "max_tokens": max_tokens,
                     "ignore_eos": True, "temperature": 0.0, "stream": True}, stream=True) for _ in range(streams)]
        t0 = time.monotonic()
        outs = await asyncio.gather(*(send(client, base, r) for r in reqs))
        duration = time.monotonic() - t0
        tokenized = await client.post(base + "/tokenize", json={"model": model, "prompt": reqs[0].body["prompt"]})
        prompt_tokens = tokenized.json().get("count", 0) if tokenized.status_code == 200 else 0
    after, _ = wait_idle(base)
    return {"streams": streams, "max_tokens": max_tokens, "prompt_tokens": prompt_tokens, "duration_s": duration,
            "completed": sum(o.ok for o in outs), "failed": sum(not o.ok for o in outs),
            "errors": dict(Counter(o.error for o in outs if not o.ok).most_common(3)),
            "preemptions": after["num_preemptions"] - before["num_preemptions"],
            "num_kv_blocks": after["num_kv_blocks"],
            "free_blocks_after": round(after["num_kv_blocks"] * (1 - after["kv_cache_usage"])),
            "step_failures": after["step_failures"]}


async def _vanish(base: str, model: str, how: str, rng: random.Random) -> None:
    """One client that goes away: mid-stream after a few events, before a whole answer, or mid-body."""
    host, port = re.match(r"http://([^:/]+):(\d+)", base).groups()  # type: ignore[union-attr]
    body = json.dumps({"model": model, "prompt": random_words(rng, 20), "max_tokens": 400, "ignore_eos": True,
                       "stream": how == "mid_stream"}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    if how == "mid_body":
        writer.write(head + body[:len(body) // 2])
        await writer.drain()
        await asyncio.sleep(rng.uniform(0.0, 0.2))
    else:
        writer.write(head + body)
        await writer.drain()
        if how == "mid_stream":
            events = rng.randint(0, 8)
            while events > 0:
                line = await asyncio.wait_for(reader.readline(), 30)
                if not line:
                    break
                events -= line.startswith(b"data: ")
        else:
            await asyncio.sleep(rng.uniform(0.0, 0.3))
    writer.transport.abort()  # vanish: no FIN handshake, like a killed client


async def disconnects(base: str, model: str, clients: int = 150, wave: int = 30) -> dict:
    """``clients`` clients in waves that vanish at random points; after each wave, the seconds until the server
    holds no request and no block."""
    rng = random.Random(5)
    before = stats(base)
    idle_after: list[float] = []
    kinds = Counter()
    for start in range(0, clients, wave):
        hows = [rng.choice(["mid_stream", "before_answer", "mid_body"]) for _ in range(min(wave, clients - start))]
        kinds.update(hows)
        await asyncio.gather(*(_vanish(base, model, h, random.Random(rng.random())) for h in hows))
        _, waited = await asyncio.to_thread(wait_idle, base, 30.0)
        idle_after.append(waited)
    after, _ = wait_idle(base)
    return {"clients": clients, "by_kind": dict(kinds),
            "aborted": after["finished_by_reason"].get("abort", 0) - before["finished_by_reason"].get("abort", 0),
            "max_s_to_idle_after_wave": max(idle_after), "num_kv_blocks": after["num_kv_blocks"],
            "free_blocks_after": round(after["num_kv_blocks"] * (1 - after["kv_cache_usage"])),
            "running_after": after["num_requests_running"], "waiting_after": after["num_requests_waiting"]}


def rss_summary(samples: list[tuple[float, int, int]], warmup: int) -> dict:
    """RSS at start, after ``warmup`` requests, max after it and at the end; growth after warm-up in percent."""
    if not samples:
        return {}
    at_warm = next((r for _, d, r in samples if d >= warmup), samples[-1][2])
    after = [r for _, d, r in samples if d >= warmup] or [samples[-1][2]]
    mib = 1 << 20
    return {"start_mib": samples[0][2] / mib, "after_warmup_mib": at_warm / mib,
            "max_after_warmup_mib": max(after) / mib,
            "end_mib": samples[-1][2] / mib, "growth_after_warmup_pct": 100 * (max(after) - at_warm) / at_warm}


# ---- report -----------------------------------------------------------------------------------------------------
def _run_on_server(model: str | None, flags: list[str], fn) -> tuple[dict, list[tuple[float, int, int]]]:
    proc, base = start_server(model, flags)
    progress = [0]
    try:
        with RSSSampler(proc.pid, progress) as sampler:
            result = asyncio.run(fn(base, progress))
        return result, sampler.samples
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded cinq-tiny)")
    ap.add_argument("--only", choices=["soak", "overload", "disconnects"], action="append")
    ap.add_argument("--soak-requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--kv-cache-memory", type=float, default=0.6, help="GiB of KV for the soak server")
    ap.add_argument("--big-every", type=int, default=100)
    ap.add_argument("--big-body-mb", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--tag", default="reliability")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    only = set(args.only or ["soak", "overload", "disconnects"])
    model_name = Path(args.model).name if args.model else "cinq-tiny"
    soak_flags = ["--kv-cache-memory", str(args.kv_cache_memory), "--served-model-name", model_name]
    report: dict = {"config": {
        "command": "python benchmarks/reliability.py " + " ".join(a for a in sys.argv[1:]
                                                                  if a not in (args.note, "--note")),
        "model": model_name,
        "server_flags": " ".join(soak_flags), "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "soak_requests": args.soak_requests, "concurrency": args.concurrency, "big_every": args.big_every,
        "big_body_mb": args.big_body_mb, "warmup": args.warmup, "note": args.note}}
    out = RESULTS / args.tag
    if args.only and out.with_suffix(".json").exists():  # a partial rerun keeps the other runs of the record
        previous = json.loads(out.with_suffix(".json").read_text())
        report = {**previous, "config": {**previous["config"], "note": args.note or previous["config"]["note"]}}
    if "overload" in only:
        print("overload: 128 streams on 256 blocks", flush=True)
        res, _ = _run_on_server(args.model, ["--num-kv-blocks", "256", "--max-num-seqs", "128",
                                             "--served-model-name", model_name],
                                lambda base, _: overload(base, model_name))
        res["demand_x"] = res["streams"] * -(-(res["prompt_tokens"] + res["max_tokens"]) // 16) / res["num_kv_blocks"]
        report["overload"] = res
        print(json.dumps(res), flush=True)
    if "disconnects" in only:
        print("disconnects: 150 vanishing clients", flush=True)
        res, _ = _run_on_server(args.model, ["--served-model-name", model_name],
                                lambda base, _: disconnects(base, model_name))
        report["disconnects"] = res
        print(json.dumps(res), flush=True)
    if "soak" in only:
        print(f"soak: {args.soak_requests} mixed requests at {args.concurrency} concurrent", flush=True)

        async def soak(base: str, progress: list[int]) -> dict:
            res = await run_mixed(base, model_name, args.soak_requests, args.concurrency, big_every=args.big_every,
                                  big_mb=args.big_body_mb, progress=progress, log_every=500)
            after, _ = wait_idle(base)
            res.update(preemptions=after["num_preemptions"], num_kv_blocks=after["num_kv_blocks"],
                       free_blocks_after=round(after["num_kv_blocks"] * (1 - after["kv_cache_usage"])),
                       step_failures=after["step_failures"], finished_by_reason=after["finished_by_reason"])
            return res

        res, samples = _run_on_server(args.model, soak_flags, soak)
        res["rss"] = rss_summary(samples, args.warmup)
        res["rss_samples"] = samples
        report["soak"] = res
        print(json.dumps({k: v for k, v in res.items() if k != "rss_samples"}), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(to_markdown(report))
    if "soak" in report:
        plot(report, out.with_suffix(".png"))
    print(to_markdown(report))


if __name__ == "__main__":
    main()
