"""Clients that vanish at random points (mid-stream after a few events, before a non-streamed answer, in the
middle of sending the body) are all aborted within about half a second, and every KV block is free after."""

from __future__ import annotations

import asyncio

from benchmarks.reliability import disconnects
from tests.server.harness import MODEL_NAME, serve


def test_vanishing_clients_are_aborted_and_free_their_blocks(tiny_llama):
    with serve(tiny_llama, max_num_seqs=64) as server:
        before = server.stats()["finished_by_reason"].get("abort", 0)
        res = asyncio.run(disconnects(server.url, MODEL_NAME, clients=60, wave=20))
        assert res["max_s_to_idle_after_wave"] < 0.5 + 0.2, res  # half a second, plus one polling interval
        assert res["running_after"] == 0 and res["waiting_after"] == 0
        assert res["free_blocks_after"] == res["num_kv_blocks"] == server.engine.kv.num_free_blocks
        started = res["by_kind"].get("mid_stream", 0) + res["by_kind"].get("before_answer", 0)
        # every client whose request started was aborted (a mid-body client never becomes a request)
        assert started - 2 <= res["aborted"] == server.stats()["finished_by_reason"]["abort"] - before
