"""The prefix-caching workloads: one prefix shared by every request, chat histories that grow turn by turn."""

from __future__ import annotations

import pytest

from cinq.bench.prefix_workload import PrefixWorkloadOptions, build_prefix_workload, footprint_blocks, min_blocks
from cinq.errors import InvalidParameterError

OPTS = PrefixWorkloadOptions(prefix_len=32, num_requests=5, suffix_len=8, num_conversations=3, num_turns=3,
                             turn_len=10, reply_len=6, output_len=4)


def test_shared_requests_share_exactly_the_prefix():
    work = build_prefix_workload(list(range(1000)), OPTS)
    prompts = [r.prompt for r in work.shared]
    assert len(prompts) == 5 and all(len(p) == 40 and p[:32] == prompts[0][:32] for p in prompts)
    assert len({tuple(p[32:]) for p in prompts}) == 5  # each its own question
    assert all(r.output_len == 4 for r in work.shared)


def test_each_chat_turn_extends_the_previous_prompt_by_the_reply_and_a_new_message():
    work = build_prefix_workload(list(range(1000)), OPTS)
    assert [len(rnd) for rnd in work.chat_rounds] == [3, 3, 3]
    for conv in range(3):
        turns = [rnd[conv].prompt for rnd in work.chat_rounds]
        assert [len(t) for t in turns] == [10, 26, 42]
        assert turns[1][:10] == turns[0] and turns[2][:26] == turns[1]
    warm = {t for r in work.warmup for t in r.prompt}
    assert not warm & {t for r in work.shared for t in r.prompt}  # warm-up text is other text


def test_footprint_counts_shared_blocks_once():
    work = build_prefix_workload(list(range(1000)), OPTS)
    # 32-token prefix = 2 full blocks of 16 shared by all; each request: 8 + 4 tokens -> one tail block
    assert footprint_blocks(work.rounds("shared_prefix"), 16) == 2 + 5
    assert min_blocks(work.rounds("shared_prefix"), 16) == 3  # 44 tokens
    assert footprint_blocks(work.rounds("shared_prefix"), 16) < sum(-(-44 // 16) for _ in range(5))


def test_validate_names_what_does_not_fit():
    with pytest.raises(InvalidParameterError) as e:
        OPTS.validate(max_model_len=40)
    assert e.value.param == "prefix_len"
    with pytest.raises(InvalidParameterError) as e:
        PrefixWorkloadOptions(num_turns=0).validate(4096)
    assert e.value.param == "num_turns"
