"""The requests of benchmarks/reliability.py's runs: the soak's mixed chat / completions requests, the seeded
probes, the big body, and ``send``, which posts one request and checks its answer (status, every stream event, the
final ``[DONE]``)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import httpx

WORDS = ("the cat sat on a mat and looked at the sky while the rain fell over the old town hall near the river "
         "where boats drift slowly past gardens full of roses and quiet people reading books").split()
STOPS = [".", "\n", " and"]


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
    """What one request got: its HTTP status, whether the answer was whole, the error if not, the choice texts."""

    kind: str
    status: int
    ok: bool
    error: str = ""
    texts: list[str] = field(default_factory=list)  # choice texts in index order (probes are compared)


def random_words(rng: random.Random, n: int) -> str:
    """``n`` words drawn from ``WORDS``: a prompt of about ``n`` tokens."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _prefixes(seed: int = 7, count: int = 4) -> list[str]:
    rng = random.Random(seed)
    return [random_words(rng, 60) for _ in range(count)]


PREFIXES = _prefixes()


def probe_request(k: int, model: str) -> Req:
    """The k-th seeded probe: sampled (temperature 0.9), seeded, so its text must not depend on batch mates."""
    rng = random.Random(1000 + k)
    body = {"model": model, "prompt": PREFIXES[k % len(PREFIXES)] + " " + random_words(rng, 8), "max_tokens": 16,
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
    prompt = (rng.choice(PREFIXES) + " " if shared else "") + random_words(rng, rng.randint(3, 30))
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
