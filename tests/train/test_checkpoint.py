"""Checkpoints round-trip nested state through safetensors (no pickle), including int-keyed optimizer state."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from cinq.train.checkpoint import load_checkpoint, save_checkpoint


def test_optimizer_and_tied_weights_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: two names, one storage
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7, "elapsed_s": 1.5,
             "history": [{"loss": 2.0}], "name": None}
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, state)
    assert not (tmp_path / "ck.safetensors.tmp").exists()
    with safe_open(str(path), framework="pt") as f:  # a plain safetensors file
        assert "cinq_state" in f.metadata()
    back = load_checkpoint(path)
    assert back["step"] == 7 and back["elapsed_s"] == 1.5 and back["history"] == [{"loss": 2.0}]
    assert back["name"] is None
    assert list(back["optimizer"]["state"]) == list(opt.state_dict()["state"])  # int keys stay ints
    for k, v in model.state_dict().items():
        assert torch.equal(back["model"][k], v)
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt2.load_state_dict(back["optimizer"])
    assert opt2.param_groups[0]["betas"][1] == 0.95
    assert torch.equal(opt2.state[model[0].weight]["exp_avg"], opt.state[model[0].weight]["exp_avg"])


def test_missing_file_is_none_and_foreign_files_are_refused(tmp_path):
    assert load_checkpoint(tmp_path / "nope.safetensors") is None
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(ValueError, match="not a cinq checkpoint"):
        load_checkpoint(tmp_path / "w.safetensors")
    with pytest.raises(TypeError, match="set"):
        save_checkpoint(tmp_path / "bad.safetensors", {"x": {1, 2}})
