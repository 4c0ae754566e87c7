"""The reduced draft vocabulary: the N most frequent tokens (ties and unseen ids by lowest id), and coverage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.spec.draft_vocab import coverage, frequent_tokens


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
