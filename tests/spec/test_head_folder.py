"""Head folders: the target fingerprint (tolerant of the dtype a target is served in, strict about the model),
cinq_spec parsing, and the loader's errors naming the tensor."""

from __future__ import annotations

import json

import pytest
import torch

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.spec.eagle import load_eagle_head, new_eagle_head, save_eagle_head
from cinq.spec.head_folder import HeadSpec, TargetFingerprint, read_head_config, write_head_folder
from cinq.spec.medusa import load_medusa_heads
from tests.spec.random_target import random_target


def test_fingerprint_survives_serving_dtypes_and_tells_models_apart() -> None:
    fp = TargetFingerprint.of(random_target(), "tiny")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        fp.check(random_target().to(dtype), "here")
    with pytest.raises(InvalidParameterError) as e:
        fp.check(random_target(seed=1), "here")
    assert e.value.param == "model" and fp.fingerprint in str(e.value) and "'tiny'" in str(e.value)
    assert TargetFingerprint.from_dict(fp.to_dict(), "x") == fp
    assert len(fp.probe_rows) == 8 and fp.probe_rows[0] == 0 and fp.probe_rows[-1] == 96


def test_spec_round_trips_through_json() -> None:
    spec = HeadSpec("eagle3", TargetFingerprint.of(random_target()), (1, 2, 3), {"steps": 5})
    assert HeadSpec.from_dict(json.loads(json.dumps(spec.to_dict())), "x") == spec


def test_read_head_config_refuses_other_folders_and_methods(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelLoadError, match="cinq_spec"):
        read_head_config(tmp_path, "eagle")
    save_eagle_head(new_eagle_head(random_target(), "eagle"), tmp_path)
    with pytest.raises(InvalidParameterError, match="'eagle' head"):
        read_head_config(tmp_path, "medusa")
    with pytest.raises(InvalidParameterError):
        load_medusa_heads(tmp_path, random_target(), torch.float32, "cpu")


def test_loader_names_unexpected_and_missing_tensors(tmp_path) -> None:
    target = random_target()
    head = new_eagle_head(target, "eagle")
    save_eagle_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    from cinq.model.checkpoint_names import checkpoint_state_dict
    tensors = dict(checkpoint_state_dict(head))
    write_head_folder(tmp_path, cfg, {**tensors, "layers.0.extra.weight": torch.zeros(2)})
    with pytest.raises(ModelLoadError, match="layers.0.extra.weight"):
        load_eagle_head(tmp_path, target, torch.float32, "cpu", "sdpa")
    del tensors["layers.0.mlp.up_proj.weight"]
    write_head_folder(tmp_path, cfg, tensors)
    with pytest.raises(ModelLoadError, match="up_proj"):
        load_eagle_head(tmp_path, target, torch.float32, "cpu", "sdpa")


def test_pickled_weights_are_never_read(tmp_path) -> None:
    save_eagle_head(new_eagle_head(random_target(), "eagle"), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not read")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_eagle_head(tmp_path, random_target(), torch.float32, "cpu", "sdpa")
