"""The server with its engine core in its own process (``cinq serve``'s default): it serves and streams; a request
whose own processing fails in the core, or a step that raises, ends with a 500 / error event while the core goes on;
a core killed outright ends every open request with a 503 or an error event naming how it died, /health says so,
nothing hangs, and no process or socket folder is left behind."""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from cinq.engine.faults import PromptStartsWith, inject_fault, inject_step_fault
from tests.server.harness import MODEL_NAME, serve

ITEM_FAULT = [7, 7, 7]  # the core's stop check raises for these prompts
STEP_FAULT = [9, 9, 9]  # the whole step raises while one of these is in it
GOOD = [5, 72, 101, 108, 108, 111]
BODY = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0, "ignore_eos": True}


def plant_faults(core) -> None:
    """Runs in the core process (AsyncMPLLM's on_core_start)."""
    inject_fault(core, "stop_check", PromptStartsWith(tuple(ITEM_FAULT)), after_tokens=1)
    inject_step_fault(core, PromptStartsWith(tuple(STEP_FAULT)))


def child_pids(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid``, but multiprocessing's resource tracker (one per
    process that ever spawned: it ends with its parent, by design)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            tracker = b"resource_tracker" in (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and not tracker:
            out.add(int(stat.parent.name))
    return out


@pytest.fixture(scope="module")
def split(tiny_llama):
    with serve(tiny_llama, max_num_seqs=16, on_core_start=functools.partial(plant_faults)) as s:
        yield s
    assert not Path(s.llm.client.socket_dir).exists()  # its ipc sockets are gone with it
    assert s.core_pid not in child_pids(os.getpid())


def test_serves_streams_and_publishes_stats(split):
    assert split.core_pid != os.getpid() and split.core_pid in child_pids(os.getpid())
    with httpx.Client(timeout=30) as client:
        out = client.post(split.api + "/completions", json={**BODY, "prompt": GOOD, "n": 2}).json()
        assert [c["finish_reason"] for c in out["choices"]] == ["length", "length"]
        assert out["choices"][0]["text"] == out["choices"][1]["text"]  # greedy: both children the same
        stop_at = out["choices"][0]["text"][2:4]
        stopped = client.post(split.api + "/completions", json={**BODY, "prompt": GOOD, "stop": [stop_at]}).json()
        assert stopped["choices"][0]["finish_reason"] == "stop"  # found by the front end, aborted in the core
        with client.stream("POST", split.api + "/completions", json={**BODY, "prompt": GOOD, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        # chunks that reach the front end together may be sent as one: the streamed text, not the chunk count
        assert lines[-1] == "data: [DONE]" and len(lines) >= 2
        streamed = "".join(c["text"] for line in lines[:-1] for c in json.loads(line[6:])["choices"])
        assert streamed == out["choices"][0]["text"]
        assert client.get(split.url + "/health").json() == {"status": "ok"}
    stats = split.wait_idle()
    assert stats["num_kv_blocks"] == 512 and stats["generation_tokens"] >= 24 and stats["num_steps"] > 0
    # the stop string's abort reaches the core a step later: a request that ended there first counts as "length"
    assert stats["finished_by_reason"].get("stop", 0) + stats["finished_by_reason"].get("length", 0) >= 1


def test_a_request_failing_in_the_core_fails_alone(split):
    with httpx.Client(timeout=30) as client:
        bad = client.post(split.api + "/completions", json={**BODY, "prompt": ITEM_FAULT + GOOD})
        assert bad.status_code == 500
        assert bad.json()["error"]["code"] == "engine_error" and "InjectedFault" in bad.json()["error"]["message"]
        ok = client.post(split.api + "/completions", json={**BODY, "prompt": GOOD})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    assert split.wait_idle()["step_failures"] == 0


def test_a_failing_step_fails_its_requests_and_the_core_goes_on(split):
    with httpx.Client(timeout=30) as client:
        bad = client.post(split.api + "/completions", json={**BODY, "prompt": STEP_FAULT + GOOD})
        assert bad.status_code == 500 and "injected step fault" in bad.json()["error"]["message"]
        ok = client.post(split.api + "/completions", json={**BODY, "prompt": GOOD})
        assert ok.status_code == 200
    stats = split.wait_idle()
    assert stats["step_failures"] == 1 and stats["kv_cache_usage"] == 0


def test_a_killed_core_ends_every_open_request_with_a_clear_error(split):
    # Last in the module: it kills the module's core.
    long = {**BODY, "prompt": GOOD, "max_tokens": 500}  # the context is 512
    plain: dict = {}

    def non_streaming() -> None:
        r = httpx.post(split.api + "/completions", json=long, timeout=60)
        plain.update(status=r.status_code, body=r.json())

    worker = threading.Thread(target=non_streaming)
    worker.start()
    events = []
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", split.api + "/completions", json={**long, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 3:
                        os.kill(split.core_pid, signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive()
        assert events[-1] == "data: [DONE]" and "engine_unavailable" in events[-2] and "SIGKILL" in events[-2]
        assert plain["status"] == 503 and "SIGKILL" in plain["body"]["error"]["message"]
        health = client.get(split.url + "/health")
        assert health.status_code == 503 and "SIGKILL" in health.json()["error"]["message"]
        t0 = time.monotonic()
        again = client.post(split.api + "/completions", json={**BODY, "prompt": GOOD})
        assert again.status_code == 503 and time.monotonic() - t0 < 5  # refused at once, not a timeout
    # A send that races the death (before the reader saw it) fails at once too: it never waits for a peer.
    from cinq.engine.core_client import CoreDiedError
    from cinq.engine.io import EngineCoreRequest
    from cinq.sampling_params import SamplingParams
    t0 = time.monotonic()
    with pytest.raises(CoreDiedError, match="SIGKILL"):
        split.llm.client.add([EngineCoreRequest("late", GOOD, SamplingParams(), 4, time.time())])
    assert time.monotonic() - t0 < 5
