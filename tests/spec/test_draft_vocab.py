"""The reduced draft vocabulary: the N most frequent tokens (ties and unseen ids by lowest id), and coverage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.sampling_params import SamplingParams
from cinq.spec.draft_vocab import DraftVocab, coverage, frequent_tokens
from cinq.spec.proposer import DraftSampling, draw_drafts


def test_most_frequent_first_then_lowest_ids() -> None:
    tokens = np.array([7, 7, 7, 3, 3, 9, 9, 1], dtype=np.uint16)
    assert frequent_tokens(tokens, 1, 10).tolist() == [7]
    assert frequent_tokens(tokens, 3, 10).tolist() == [3, 7, 9]  # 3 and 9 tie at two: both fit
    assert frequent_tokens(tokens, 4, 10).tolist() == [1, 3, 7, 9]
    assert frequent_tokens(tokens, 6, 10).tolist() == [0, 1, 2, 3, 7, 9]  # never seen: lowest ids next


def test_coverage_is_the_share_inside() -> None:
    tokens = np.array([7, 7, 7, 3, 3, 9, 9, 1])
    assert coverage(torch.tensor([7, 3]), tokens, 10) == pytest.approx(5 / 8)
    assert coverage(torch.arange(10), tokens, 10) == 1.0


@pytest.mark.parametrize("n", [0, 11])
def test_a_size_outside_the_vocabulary_is_refused(n: int) -> None:
    with pytest.raises(InvalidParameterError) as e:
        frequent_tokens(np.array([1, 2]), n, 10)
    assert e.value.param == "draft_vocab_size"


def test_drafts_over_a_draft_vocabulary_are_those_of_its_widened_logits() -> None:
    """Greedy drafts taken over the draft vocabulary's columns are the full-vocabulary argmax with -inf elsewhere,
    the first of tied maxima included (ascending ids); sampled ones widen first and draw exactly the same."""
    gen = torch.Generator().manual_seed(0)
    vocab = DraftVocab(torch.tensor([1, 4, 5, 9, 12, 13]), 16)
    for trial in range(40):
        logits = torch.randint(0, 3, (5, 6), generator=gen).to(torch.bfloat16)  # ties on purpose
        wide = vocab.widen(logits)
        assert wide.shape == (5, 16) and wide.dtype == torch.float32
        assert vocab.argmax(logits).tolist() == wide.argmax(-1).tolist(), trial
        greedy = [DraftSampling(SamplingParams(temperature=0), None)] * 5
        assert draw_drafts(logits, greedy, True, gen, vocab) == (wide.argmax(-1).tolist(), None)
        sampled = [DraftSampling(SamplingParams(temperature=0.8), None)] * 5
        a = draw_drafts(logits, sampled, True, torch.Generator().manual_seed(trial), vocab)
        b = draw_drafts(wide, sampled, True, torch.Generator().manual_seed(trial))
        assert a[0] == b[0] and torch.equal(a[1], b[1])
        assert all(t in vocab.ids.tolist() for t in a[0])
