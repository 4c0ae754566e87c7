"""GeneratingRunControls: the sampling fields the distillation and head-training jobs share, checked once."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.train.training_run import GENERATORS, GeneratingRunControls


@pytest.mark.parametrize("generator", GENERATORS)
def test_the_known_generators_pass(generator):
    GeneratingRunControls(generator=generator).check_generator()


def test_another_generator_is_refused_by_name():
    with pytest.raises(InvalidParameterError, match="generator must be one of .*'vllm'") as e:
        GeneratingRunControls(generator="vllm").check_generator()
    assert e.value.param == "generator"
