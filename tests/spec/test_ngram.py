from __future__ import annotations

import pytest

from cinq.spec.ngram import NgramProposer


def test_proposes_what_followed_the_most_recent_longest_match() -> None:
    prop = NgramProposer(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    # suffix [6, 7] (the 3-gram [3, 6, 7] never occurred before): latest earlier [6, 7] is at 6 -> [2, 3, 6]
    assert prop.propose(tokens) == [2, 3, 6]


def test_longer_matches_win_over_more_recent_short_ones() -> None:
    prop = NgramProposer(2, 1, 3)
    tokens = [1, 2, 3, 40, 41, 9, 3, 50, 1, 2, 3]
    # [1, 2, 3] matched at 0 (-> 40, 41) beats the more recent 1-gram [3] at 6 (-> 50)
    assert prop.propose(tokens) == [40, 41]


def test_no_match_or_too_short_proposes_nothing() -> None:
    prop = NgramProposer(4, 2, 4)
    assert prop.propose([1, 2, 3, 4, 5]) == []
    assert prop.propose([7]) == []
    assert prop.propose([]) == []


def test_continuation_is_cut_at_the_end_of_the_history() -> None:
    prop = NgramProposer(5, 1, 1)
    assert prop.propose([4, 8, 4]) == [8, 4]  # [4] at 0 is followed by only two tokens


def test_a_match_far_back_in_a_long_history_is_found() -> None:
    prop = NgramProposer(3, 2, 8)
    tokens = list(range(1000, 6000)) + [7, 7, 42, 43, 44] + list(range(6000, 20000)) + [7, 7]
    assert prop.propose(tokens) == [42, 43, 44]
    assert prop.propose_batch([[1, 2, 9, 1, 2], [3]]) == [[9, 1, 2], []]


@pytest.mark.parametrize("k,lo,hi", [(0, 1, 2), (3, 0, 2), (3, 3, 2)])
def test_bad_settings_are_refused(k: int, lo: int, hi: int) -> None:
    with pytest.raises(ValueError):
        NgramProposer(k, lo, hi)


def test_a_loop_gets_a_full_draft_from_an_earlier_occurrence() -> None:
    # the most recent occurrence of the suffix sits just before the end, with one token after it
    assert NgramProposer(3, 1, 1).propose([7, 7, 7, 7]) == [7, 7, 7]
    assert NgramProposer(3, 2, 2).propose([1, 2, 3, 1, 2, 3, 1, 2]) == [3, 1, 2]
    assert NgramProposer(4, 2, 2).propose([5, 1, 2, 9, 1, 2]) == [9, 1, 2]  # none followed by 4: the longest


def test_an_index_extended_step_by_step_drafts_what_a_fresh_search_drafts() -> None:
    # the engine's drafter keeps one index per request and extends it with the tokens added since its last draft;
    # at every length, and whatever the steps' sizes, it proposes what a search of the whole history proposes
    import random
    rng = random.Random(0)
    prop = NgramProposer(3, 2, 4)
    tokens = [rng.randrange(6) for _ in range(400)]  # a small vocabulary: many matches, loops, ties
    index, at = prop.index(), 0
    while at < len(tokens):
        at = min(len(tokens), at + rng.choice((1, 1, 2, 5)))
        index.extend(tokens[len(index):at])
        assert index.propose() == reference(tokens[:at], 3, 2, 4), at


def reference(t: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The rule, by brute force: the longest n whose suffix occurs earlier; there the latest occurrence followed
    by k tokens, else the earliest."""
    length = len(t)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        hits = [i for i in range(length - n) if t[i:i + n] == t[length - n:]]
        if hits:
            full = [i for i in hits if i + n + k <= length]
            start = (full[-1] if full else hits[0]) + n
            return t[start:start + k]
    return []
