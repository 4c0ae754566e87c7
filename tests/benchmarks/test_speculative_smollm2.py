"""The method sets benchmarks/speculative_smollm2.py measures: every workload names its arms (an arm set that
went missing once made the chat and copy runs measure nothing), each a valid speculative_config."""

from __future__ import annotations

import pytest

from benchmarks.speculative_smollm2 import OFF, methods
from cinq.spec.config import SpeculativeConfig


@pytest.mark.parametrize("workload, head, trees, must", [
    ("chat", None, False, {"ngram k=4", "ngram adaptive k<=4"}),
    ("chat", "h", False, {"eagle3 k=3", "eagle3 adaptive k<=4", "eagle3+lookup k=3", OFF}),
    ("copy", None, False, {"ngram k=2", "ngram k=8", "ngram adaptive k<=8", "ngram k=6 lookup 1-4"}),
    ("copy", "h", False, {"eagle3+lookup k=4", "eagle3+lookup adaptive k<=8"}),
    ("chat", "h", True, {"eagle3 chain k=3", "eagle3 dynamic tree (top-2, depth 3, 6 nodes)"}),
])
def test_every_workload_names_its_arms(workload, head, trees, must):
    arms = methods(workload, head, trees)
    assert must <= set(arms)
    for cfg in arms.values():
        assert SpeculativeConfig.from_dict(cfg).method in ("ngram", "eagle3")
        assert cfg["method"] == "ngram" or cfg["model"] == head
