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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORDS = ("the cat sat on a mat and looked at the sky while the rain fell over the old town hall near the river "
         "where boats drift slowly past gardens full of roses and quiet people reading books").split()
STOPS = [".", "\n", " and"]


# ---- requests ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Req:
    """One HTTP request of a run: route, JSON body (or raw bytes for big bodies), streamed or not."""

    kind: str
    path: str
    body: dict
    stream: bool
    raw: bytes | None = None  # sent as is instead of ``body`` (big bodies are built once)
    probe: int | None = None  # index of a seeded probe, compared with its solo run


@dataclass(slots=True)
class Outcome:
    kind: str
    status: int
    ok: bool
    error: str = ""
    texts: list[str] = field(default_factory=list)  # choice texts in index order (probes are compared)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _prefixes(seed: int = 7, count: int = 4) -> list[str]:
    rng = random.Random(seed)
    return [_words(rng, 60) for _ in range(count)]


PREFIXES = _prefixes()


def probe_request(k: int, model: str) -> Req:
    """The k-th seeded probe: sampled (temperature 0.9), seeded, so its text must not depend on batch mates."""
    rng = random.Random(1000 + k)
    body = {"model": model, "prompt": PREFIXES[k % len(PREFIXES)] + " " + _words(rng, 8), "max_tokens": 16,
            "temperature": 0.9, "seed": 100 + k, "n": 2 if k % 2 else 1, "logprobs": 1 if k % 3 == 0 else None,
            "stream": bool(k % 2)}
    return Req("probe", "/v1/completions", body, stream=bool(k % 2), probe=k)


def mixed_request(i: int, rng: random.Random, model: str, big_every: int = 0, big_body: bytes | None = None,
                  num_probes: int = 8, probe_every: int = 50) -> Req:
    """The i-th request of a mixed run (deterministic given ``rng``'s state)."""
    if probe_every and i % probe_every == probe_every - 1:
        return probe_request((i // probe_every) % num_probes, model)
    if big_every and big_body is not None and i % big_every == big_every // 2:
        return Req("big_body", "/v1/completions", {}, stream=False, raw=big_body)
    shared = rng.random() < 0.5
    prompt = (rng.choice(PREFIXES) + " " if shared else "") + _words(rng, rng.randint(3, 30))
    sampled = rng.random() < 0.5
    common = {"model": model, "max_tokens": rng.randint(1, 24), "temperature": 0.8 if sampled else 0.0}
    if sampled and rng.random() < 0.5:
        common["seed"] = rng.randrange(1 << 20)
    r = rng.random()
    if r < 0.15:
        return Req("completion", "/v1/completions", {**common, "prompt": prompt}, stream=False)
    if r < 0.30:
        return Req("completion_stream_logprobs", "/v1/completions",
                   {**common, "prompt": prompt, "logprobs": 2, "stream": True,
                    "stream_options": {"include_usage": True}}, stream=True)
    if r < 0.40:
        stream = rng.random() < 0.5
        return Req("completion_n2_stop", "/v1/completions",
                   {**common, "prompt": prompt, "n": 2, "stop": rng.sample(STOPS, 2), "stream": stream,
                    "temperature": 0.8, "seed": rng.randrange(1 << 20)}, stream=stream)
    if r < 0.50:
        return Req("completion_echo_logprobs", "/v1/completions",
                   {**common, "prompt": prompt, "echo": True, "logprobs": 1,
                    "max_tokens": rng.choice([0, common["max_tokens"]])}, stream=False)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}]
    if r < 0.70:
        return Req("chat_stream", "/v1/chat/completions",
                   {**common, "messages": messages, "stream": True, "logprobs": rng.random() < 0.5,
                    "stop": [rng.choice(STOPS)]}, stream=True)
    if r < 0.85:
        return Req("chat_n2_logprobs", "/v1/chat/completions",
                   {**common, "messages": messages, "n": 2, "logprobs": True, "top_logprobs": 2}, stream=False)
    return Req("chat", "/v1/chat/completions", {**common, "messages": messages}, stream=False)


def big_body(model: str, mb: int) -> bytes:
    """A completions body of about ``mb`` MB: a tiny request with a very long ``user`` field."""
    return json.dumps({"model": model, "prompt": "a big body", "max_tokens": 2,
                       "user": "u" * (mb << 20)}).encode()


async def send(client: httpx.AsyncClient, base: str, req: Req) -> Outcome:
    """Send one request and check its answer: 200, and for streams every event parsed and no error event."""
    out = Outcome(req.kind, 0, False)
    kwargs = {"content": req.raw, "headers": {"content-type": "application/json"}} if req.raw is not None \
        else {"json": req.body}
    try:
        if not req.stream:
            resp = await client.post(base + req.path, **kwargs)
            out.status = resp.status_code
            data = resp.json()
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {data.get('error', {}).get('message', '')[:120]}"
                return out
            out.texts = [c.get("text", (c.get("message") or {}).get("content")) for c in data["choices"]]
            out.ok = True
            return out
        texts: dict[int, str] = {}
        async with client.stream("POST", base + req.path, **kwargs) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread())[:120]!r}"
                return out
            done = False
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out.error = "error event: " + chunk["error"].get("message", "")[:120]
                        return out
                    for c in chunk.get("choices", []):
                        piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                        texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
        out.texts = [texts[i] for i in sorted(texts)]
        out.ok = done
        if not done:
            out.error = "stream ended without [DONE]"
    except (httpx.HTTPError, ValueError, KeyError) as e:
        out.error = f"{type(e).__name__}: {e}"[:160]
    return out


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
                    {"model": model, "prompt": _words(rng, prompt_words), "max_tokens": max_tokens,
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
    body = json.dumps({"model": model, "prompt": _words(rng, 20), "max_tokens": 400, "ignore_eos": True,
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
def to_markdown(report: dict) -> str:
    cfg = report["config"]
    lines = ["# Reliability runs", "", f"`{cfg['command']}`", "",
             f"Server: `cinq serve` ({cfg['model']}, {cfg['server_flags']}) on loopback; client on the same "
             f"machine ({cfg['machine']}).", "",
             "| run | what was tried | how much | completed | failed | aborted | preemptions | blocks free after "
             "| other |", "|---|---|---|---|---|---|---|---|---|"]
    s = report.get("soak")
    if s:
        rss = s["rss"]
        lines.append(
            f"| soak | mixed chat + completions, streaming, n=2, stops, logprobs, echo, shared prefixes, seeded "
            f"probes, {cfg['big_body_mb']} MB bodies every {cfg['big_every']} | {s['requests']} requests at "
            f"{s['concurrency']} concurrent, {s['duration_s']:.0f} s | {s['completed']} | {s['failed']} | 0 | "
            f"{s['preemptions']} | {s['free_blocks_after']}/{s['num_kv_blocks']} | RSS {rss['start_mib']:.0f} MiB at "
            f"start, {rss['after_warmup_mib']:.0f} after {cfg['warmup']} requests, max after "
            f"{rss['max_after_warmup_mib']:.0f}, end {rss['end_mib']:.0f} (**{rss['growth_after_warmup_pct']:+.1f}%** "
            f"after warm-up; bound 15%); seeded probes {s['probes_under_load']}, mismatches with solo "
            f"{s['probe_mismatches']} |")
    o = report.get("overload")
    if o:
        lines.append(f"| overload | {o['streams']} concurrent streams x {o['max_tokens']} tokens on "
                     f"{o['num_kv_blocks']} KV blocks (~{o['demand_x']:.1f}x capacity) | {o['streams']} streams, "
                     f"{o['duration_s']:.0f} s | {o['completed']} | {o['failed']} | 0 | {o['preemptions']} | "
                     f"{o['free_blocks_after']}/{o['num_kv_blocks']} | step failures {o['step_failures']} |")
    d = report.get("disconnects")
    if d:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(d["by_kind"].items()))
        lines.append(f"| disconnects | clients vanish mid-stream, before the answer, mid-body ({kinds}) | "
                     f"{d['clients']} clients in waves of 30 | - | - | {d['aborted']} | - | "
                     f"{d['free_blocks_after']}/{d['num_kv_blocks']} | slowest wave idle after "
                     f"{d['max_s_to_idle_after_wave']:.2f} s; running {d['running_after']}, waiting "
                     f"{d['waiting_after']} after |")
    lines += ["", "Failed: a non-200 answer, an error event in a stream, or a stream without `[DONE]`. Aborted: "
                  "requests the server aborted because their client vanished (a mid-body client never becomes a "
                  "request). Blocks free after: KV blocks not held by a live request once the run is over. "
                  "Mid-body clients count as aborted only if their request had started."]
    if s and s.get("errors"):
        lines += ["", "Soak errors: " + "; ".join(f"{k} x{v}" for k, v in s["errors"].items())]
    if cfg.get("note"):
        lines += ["", cfg["note"]]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    samples = report["soak"]["rss_samples"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([d for _, d, _ in samples], [r / 2**20 for _, _, r in samples], "-", lw=1)
    ax.axvline(report["config"]["warmup"], color="gray", ls=":", label="end of warm-up")
    ax.set_xlabel("requests done")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=.3)
    ax.legend()
    ax.set_title(f"cinq serve RSS over a {report['soak']['requests']}-request mixed soak")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
