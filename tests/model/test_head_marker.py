"""A speculative-decoding head is told from a model by its config.json, and the loader refuses it as a model."""

from __future__ import annotations

import json

import pytest

from cinq.assets import ASSETS_DIR
from cinq.errors import ModelLoadError
from cinq.model.head_marker import speculative_head_method
from cinq.model.loader import load_model


@pytest.mark.parametrize("name,method", [("cinq-tiny-eagle", "eagle"), ("smollm2-135m-instruct-eagle3", "eagle3"),
                                         ("cinq-tiny-medusa", "medusa"), ("cinq-tiny", None)])
def test_shipped_folders(name, method):
    assert speculative_head_method(ASSETS_DIR / name) == method


def test_a_foreign_head_by_its_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert speculative_head_method(tmp_path) == "eagle3"
    assert speculative_head_method(tmp_path / "missing") is None


def test_the_loader_refuses_a_head_as_a_model():
    # through the Python API (LLM("cinq-tiny-eagle")) it failed deep in the loader: "tensor 'd2t' has no place"
    with pytest.raises(ModelLoadError, match=r"a speculative-decoding head \(eagle\), not a model") as e:
        load_model(ASSETS_DIR / "cinq-tiny-eagle")
    assert e.value.param == "model"
