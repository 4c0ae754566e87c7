"""EngineCore alone (no text, no front end): requests in as token ids, EngineCoreOutputs out with the core's own
stats; aborts by reason, a failed step, and the wire format that carries all of it to another process."""

from __future__ import annotations

import time

import pytest

from cinq.config import EngineConfig
from cinq.engine.core import EngineCore
from cinq.engine.io import EngineCoreOutputs, EngineCoreRequest
from cinq.engine.serial import ADD, OUTPUTS, CoreError, decode, encode, error_from_wire, error_to_wire
from cinq.errors import ModelLoadError
from cinq.sampling_params import SamplingParams
from cinq.step.request import RequestStatus

GREEDY = SamplingParams(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def core(tiny_llama) -> EngineCore:
    return EngineCore(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", num_kv_blocks=32, block_size=8))


def request(rid: str, n_out: int, prompt: list[int] | None = None) -> EngineCoreRequest:
    return EngineCoreRequest(rid, prompt or [5, 6, 7, 8, 9], GREEDY, n_out, time.time())


def run(core: EngineCore) -> list[EngineCoreOutputs]:
    steps = []
    while core.has_unfinished_requests():
        steps.append(core.step())
    return steps


def test_a_request_runs_to_its_length_and_the_core_counts_it(core):
    before = core.get_stats()
    core.add_request(request("a", 4))
    steps = run(core)
    assert steps[0].first_scheduled_ids == ["a"]
    tokens = [t for s in steps for o in s.outputs for t in o.new_token_ids]
    assert len(tokens) == 4 and steps[-1].outputs[-1].finish_reason == "length"
    after = core.get_stats()
    assert after.generation_tokens - before.generation_tokens == 4
    assert after.finished_by_reason["length"] - before.finished_by_reason.get("length", 0) == 1
    assert after.kv_slots_held == after.kv_tokens_held == 0 and after.kv_cache_usage == 0


def test_held_kv_is_published_while_requests_run(core):
    core.add_request(request("held", 6, list(range(10, 23))))
    core.step()  # the 13-token prompt: 2 blocks of 8
    st = core.get_stats()
    assert st.num_running == 1 and st.kv_slots_held == 16 and st.kv_tokens_held == 13
    core.abort_requests(["held"])


def test_aborts_count_by_reason(core):
    before = dict(core.get_stats().finished_by_reason)
    for rid in ("x", "y", "z"):
        core.add_request(request(rid, 50))
    core.step()
    assert core.abort_requests(["x", "y", "nobody"]) == ["x", "y"]  # one client abort of two sequences
    assert core.abort_requests(["z"], RequestStatus.FINISHED_STOPPED) == ["z"]  # a stop string the front end saw
    assert core.abort_requests(["z"]) == []  # already ended: nothing counted
    after = core.get_stats().finished_by_reason
    assert after["abort"] - before.get("abort", 0) == 1 and after["stop"] - before.get("stop", 0) == 1
    assert not core.has_unfinished_requests() and core.get_stats().kv_cache_usage == 0


def test_a_failed_step_ends_what_the_core_held(core):
    core.add_request(request("f1", 50))
    core.add_request(request("f2", 50))
    core.step()
    out = core.fail_all(RuntimeError("boom"))
    assert sorted(out.failed_request_ids) == ["f1", "f2"] and out.step_error == "RuntimeError: boom"
    assert core.num_step_failures == 1 and not core.has_unfinished_requests()
    assert out.stats is not None and out.stats.kv_cache_usage == 0


def test_messages_cross_the_wire_intact(core):
    req = request("w", 3)
    kind, body = decode(encode(ADD, [req]))
    assert kind == ADD and body == [req]
    core.add_request(req)
    step = core.step()
    step.stats = core.get_stats()
    kind, body = decode(encode(OUTPUTS, step))
    assert kind == OUTPUTS and body == step
    run(core)
    with pytest.raises(ValueError, match="malformed"):
        decode([b"?", b""])


def test_start_up_errors_cross_as_themselves():
    err = error_from_wire(error_to_wire(ModelLoadError("config.json: bad", "model")))
    assert isinstance(err, ModelLoadError) and str(err) == "config.json: bad" and err.param == "model"
    other = error_from_wire(CoreError("MemoryError", "out of memory"))
    assert isinstance(other, RuntimeError) and str(other) == "MemoryError: out of memory"


def test_step_read_bytes_leaves_out_an_unshared_embedding_table():
    """The roofline's bytes: a tied embedding is the LM head (read every step); an untied one is read a row per
    token, so only the linears count; a proposer's modules count as the target's."""
    import types

    import torch

    from cinq.engine.core import served_weight_bytes, step_read_bytes

    def model(tied: bool) -> torch.nn.Module:
        m = torch.nn.Module()
        m.embed = torch.nn.Embedding(100, 8)  # 3,200 bytes
        m.layer = torch.nn.Linear(8, 8, bias=False)  # 256 bytes
        m.head = torch.nn.Linear(8, 100, bias=False)  # 3,200 bytes unless it is the embedding's
        if tied:
            m.head.weight = m.embed.weight
        return m

    tied = types.SimpleNamespace(model=model(True), proposer=None)
    assert served_weight_bytes(tied) == step_read_bytes(tied) == 3200 + 256
    untied = types.SimpleNamespace(model=model(False), proposer=None)
    assert served_weight_bytes(untied) == 3200 + 256 + 3200
    assert step_read_bytes(untied) == 256 + 3200
    head = torch.nn.Linear(8, 8, bias=False)
    with_head = types.SimpleNamespace(model=model(False), proposer=types.SimpleNamespace(head=head))
    assert step_read_bytes(with_head) == 256 + 3200 + 256
    # packed into one arena (every tensor then shares one storage): the same bytes
    from cinq.engine.weight_arena import pack_weights
    from cinq.host_memory import huge_pages_available
    for ex in (tied, untied):
        before = step_read_bytes(ex), served_weight_bytes(ex)
        if huge_pages_available():
            assert pack_weights(ex.model, min_bytes=0) is not None
            assert (step_read_bytes(ex), served_weight_bytes(ex)) == before


def test_start_up_says_which_speculation_is_in_force(tiny_llama, caplog):
    with caplog.at_level("INFO", logger="cinq.engine.core"):
        spec = EngineCore(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", num_kv_blocks=16, block_size=8,
                                                   speculative_config={"method": "ngram", "num_speculative_tokens": 3}))
    spec.shutdown()
    assert "speculative decoding: ngram, num_speculative_tokens 3" in caplog.text


def test_a_kv_cache_smaller_than_max_model_len_is_said_at_start_up(tiny_llama, caplog):
    with caplog.at_level("WARNING", logger="cinq.engine.core"):
        small = EngineCore(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", num_kv_blocks=4, block_size=8,
                                                    max_model_len=64))
        small.shutdown()
        assert "the KV cache holds 32 tokens (num_kv_blocks 4 x block_size 8), fewer than max_model_len 64" \
            in caplog.text
        caplog.clear()
        enough = EngineCore(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", num_kv_blocks=8, block_size=8,
                                                     max_model_len=64))
        enough.shutdown()
    assert "fewer than max_model_len" not in caplog.text
