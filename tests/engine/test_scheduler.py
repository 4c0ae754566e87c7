"""Scheduler: token budget, decodes before prefills, chunked prefill, max_num_seqs, preemption by recompute."""

from __future__ import annotations

from cinq.engine.kv_cache import KVCacheManager
from cinq.engine.scheduler import Scheduler, SchedulerConfig
from cinq.sampling_params import SamplingParams
from cinq.step.request import Request, RequestStatus
from cinq.step.runner_output import RunnerOutput


def make(budget=32, seqs=8, blocks=64, block_size=4, max_len=256) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, seqs, max_len), KVCacheManager(blocks, block_size))


def add(s: Scheduler, rid: str, n: int, max_tokens: int = 50) -> Request:
    r = Request(rid, [(7 * i + len(rid)) % 250 for i in range(n)], SamplingParams(ignore_eos=True), max_tokens, 0.0)
    s.add_request(r)
    return r


def run_step(s: Scheduler, token: int = 5):
    out = s.schedule()
    sampled = {q.request_id: [token] for q in out.seqs if q.num_logit_rows}
    s.update(out, RunnerOutput(sampled))
    return out


def test_long_prompt_is_chunked_and_never_blocks_decodes():
    s = make(budget=16)
    add(s, "short", 4)
    run_step(s)  # prefill "short" (4 tokens)
    add(s, "long", 100)
    out = run_step(s)
    assert [(q.request_id, len(q.token_ids)) for q in out.seqs] == [("short", 1), ("long", 15)]
    assert out.seqs[1].num_logit_rows == 0  # partial chunk: nothing sampled
    for _ in range(6):
        out = run_step(s)
        assert out.seqs[0].request_id == "short" and len(out.seqs[0].token_ids) == 1
        assert out.num_batched_tokens <= 16
    assert s.requests["long"].num_computed_tokens == 100


def test_max_num_seqs_bounds_running():
    s = make(budget=100, seqs=2)
    for i in range(4):
        add(s, f"r{i}", 3)
    out = s.schedule()
    assert len(out.seqs) == 2 and len(s.waiting) == 2


def test_preemption_frees_newest_and_requeues_it_first():
    s = make(budget=64, seqs=8, blocks=10, block_size=4)
    # Each needs 7 blocks at the end (8 + 20 tokens): one at a time fits, both together do not.
    a, b = add(s, "a", 8, max_tokens=20), add(s, "b", 8, max_tokens=20)
    run_step(s)
    for _ in range(30):
        run_step(s)
        if s.num_preemptions:
            break
    assert s.num_preemptions >= 1
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert s.waiting[0] is b and a.status == RequestStatus.RUNNING
    while s.has_unfinished_requests():
        run_step(s)
    assert a.num_output_tokens == 20 and b.num_output_tokens == 20
    assert s.kv.num_free_blocks == 10


def test_finish_by_max_tokens_and_stop_token():
    s = make()
    r = add(s, "a", 3, max_tokens=3)
    p = SamplingParams(stop_token_ids=[9], min_tokens=2)
    q = Request("b", [1, 2, 3], p, 10, 0.0)
    s.add_request(q)
    for tok in (9, 9, 9):
        run_step(s, token=tok)
    assert r.status == RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 3
    assert q.status == RequestStatus.FINISHED_STOPPED and q.num_output_tokens == 2 and q.stop_reason == 9
    assert s.kv.num_free_blocks == 64


def test_abort_frees_blocks():
    s = make()
    add(s, "a", 10)
    run_step(s)
    assert s.kv.num_free_blocks < 64
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert s.kv.num_free_blocks == 64 and not s.has_unfinished_requests()
    assert s.schedule().finished_request_ids == ["a"]


def test_update_reports_plain_news_and_drops_tokens_past_a_stop():
    from cinq.step.runner_output import TokenLogprobs
    s = make()
    p = SamplingParams(stop_token_ids=[9], logprobs=0)
    s.add_request(Request("a", [1, 2, 3], p, 10, 0.0))
    out = s.schedule()
    assert out.seqs[0].num_logit_rows == 1 and out.seqs[0].num_output_tokens == 0
    lp = [TokenLogprobs(t, -0.5, 1, [], []) for t in (4, 9, 6)]
    # three tokens in one step (as a speculative step may accept): the stop token ends it, the rest is dropped
    (core,) = s.update(out, RunnerOutput({"a": [4, 9, 6]}, {"a": lp}))
    assert core.request_id == "a" and core.new_token_ids == [4, 9]
    assert [x.token_id for x in core.new_logprobs] == [4, 9]
    assert core.finish_reason == "stop" and core.stop_reason == 9 and core.finished
    assert s.kv.num_free_blocks == 64 and not s.has_unfinished_requests()


def test_scheduled_seq_carries_the_output_count_the_runner_bans_by():
    s = make()
    add(s, "a", 3)
    for expected in range(4):
        out = run_step(s)
        assert out.seqs[0].num_output_tokens == expected


def test_drafts_accepted_past_a_stop_are_not_counted_as_accepted():
    from cinq.spec.config import SpeculativeConfig
    from cinq.spec.drafter import SlotDrafter
    s = Scheduler(SchedulerConfig(32, 8, 256), KVCacheManager(64, 4),
                  SlotDrafter(SpeculativeConfig(method="medusa", model="x", num_speculative_tokens=3)))
    s.add_request(Request("a", [1, 2, 3], SamplingParams(stop_token_ids=[9]), 10, 0.0))
    s.update(s.schedule(), RunnerOutput({"a": [4]}))  # prefill, first token
    out = s.schedule()
    assert out.seqs[0].num_draft_slots == 3 and out.seqs[0].num_logit_rows == 4
    # all three drafts accepted (+ a bonus token), but the second one is the stop token
    (core,) = s.update(out, RunnerOutput({"a": [5, 9, 7, 8]}))
    assert core.new_token_ids == [5, 9] and core.finish_reason == "stop"
    assert core.num_draft_tokens == 3 and core.num_accepted_tokens == 2


def test_adaptive_k_is_told_no_step_cost_for_a_step_that_caught_up_over_undrafted_positions():
    """A proposer's catch-up over positions committed while a request did not draft is paid once when
    speculation resumes (Proposals.catch_up_s): such a step is not its arm's cost (None), only its acceptance
    counts; a step without one reports its wall time."""
    from cinq.spec.config import SpeculativeConfig
    from cinq.spec.drafter import SlotDrafter
    drafter = SlotDrafter(SpeculativeConfig(method="medusa", model="x", num_speculative_tokens=2))
    seen = []
    drafter.observe = lambda seconds, drafted, accepted: seen.append((seconds, drafted, accepted))  # type: ignore
    s = Scheduler(SchedulerConfig(32, 8, 256), KVCacheManager(64, 4), drafter)
    s.add_request(Request("a", [1, 2, 3], SamplingParams(ignore_eos=True), 10, 0.0))
    s.update(s.schedule(), RunnerOutput({"a": [4]}, elapsed_s=0.9, catch_up_s=0.1))  # prefill: not a cost sample
    s.update(s.schedule(), RunnerOutput({"a": [5, 6]}, elapsed_s=0.5, catch_up_s=0.125))
    s.update(s.schedule(), RunnerOutput({"a": [7]}, elapsed_s=0.25))
    assert seen == [(None, [2], [1]), (0.25, [2], [0])]
