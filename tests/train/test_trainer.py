import json
import math

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.train.data import BatchSampler, TokenSplit
from cinq.train.pretrain import causal_lm_loss
from cinq.train.presets import model_config, new_model
from cinq.train.schedule import lr_at
from cinq.train.tokenizer_train import load_tokenizer, special_ids
from cinq.train.trainer import Trainer, TrainSettings


def _model(corpus, seed=0):
    tok = load_tokenizer(corpus / "tokenizer")
    ids = special_ids(tok)
    return new_model(model_config("micro", tok.get_vocab_size(), ids["bos"], ids["eos"], 256), seed)


def _trainer(corpus, out, steps, stop_at=None, lr=1e-2, decay_frac=1.0):
    model = _model(corpus)
    sampler = BatchSampler(TokenSplit.load(corpus, "train").tokens, 4, 32, seed=0)
    settings = TrainSettings(out_dir=str(out), total_steps=steps, batch_size=4, seq_len=32, lr=lr, warmup_steps=3,
                             log_every=1, eval_every=0, progress=False, stop_at_step=stop_at,
                             decay_frac=decay_frac)
    return Trainer(model, lambda b, s: (causal_lm_loss(model, b), {}), sampler.batch, settings), model


def test_wsd_schedule_is_flat_until_the_decay():
    a = [lr_at(s, 100, 1.0, 10, 0.1, decay_frac=0.25) for s in range(100)]
    b = [lr_at(s, 60, 1.0, 10, 0.1, decay_frac=0.25) for s in range(60)]
    assert a[:47] == b[:47] and a[40] == 1.0 and a[99] < 0.11 and b[59] < 0.15


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-6)  # half way through the cosine
    assert lr_at(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)


def test_a_short_run_decreases_the_loss(tiny_corpus, tmp_path):
    trainer, _ = _trainer(tiny_corpus, tmp_path, 40)
    summary = trainer.run()
    losses = [h["loss"] for h in trainer.history]
    assert summary["finished"] and summary["tokens_seen"] == 40 * 4 * 32
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    hist = json.loads((tmp_path / "history.json").read_text())
    assert hist["step"] == 40 and len(hist["history"]) == 40


def test_resuming_continues_the_same_trajectory(tiny_corpus, tmp_path):
    straight, _ = _trainer(tiny_corpus, tmp_path / "a", 10)
    straight.run()
    first, _ = _trainer(tiny_corpus, tmp_path / "b", 10, stop_at=4)
    assert not first.run()["finished"]
    assert (tmp_path / "b" / "checkpoint.safetensors").is_file()
    second, model = _trainer(tiny_corpus, tmp_path / "b", 10)  # a fresh process would build the same objects
    summary = second.run()
    assert summary["finished"] and second.step == 10
    a = [h["loss"] for h in straight.history]
    b = [h["loss"] for h in second.history]
    assert len(b) == 10
    assert b == pytest.approx(a, rel=1e-6, abs=1e-6)
    for (n1, p1), (n2, p2) in zip(straight.model.state_dict().items(), model.state_dict().items()):
        assert torch.allclose(p1, p2, atol=1e-6), n1


def test_resume_with_other_settings_is_refused(tiny_corpus, tmp_path):
    _trainer(tiny_corpus, tmp_path, 8, stop_at=5)[0].run()  # past warmup (3): in the cosine
    with pytest.raises(InvalidParameterError, match="total_steps"):
        _trainer(tiny_corpus, tmp_path, 10)[0].run()
    with pytest.raises(InvalidParameterError, match=r"lr=0\.01.*lr=0\.02") as err:
        _trainer(tiny_corpus, tmp_path, 8, lr=2e-2)[0].run()
    assert err.value.param == "lr"
    with pytest.raises(InvalidParameterError, match="decay_frac"):
        _trainer(tiny_corpus, tmp_path, 8, decay_frac=0.5)[0].run()


def test_budget_change_in_the_constant_phase_matches_a_run_planned_with_it(tiny_corpus, tmp_path):
    planned, _ = _trainer(tiny_corpus, tmp_path / "a", 12, decay_frac=0.5)
    planned.run()
    first, _ = _trainer(tiny_corpus, tmp_path / "b", 20, stop_at=5, decay_frac=0.5)
    first.run()
    resized, _ = _trainer(tiny_corpus, tmp_path / "b", 12, decay_frac=0.5)
    resized.run()
    assert [h["loss"] for h in resized.history] == pytest.approx([h["loss"] for h in planned.history], rel=1e-6)
    assert [h["lr"] for h in resized.history] == [h["lr"] for h in planned.history]


def test_bad_settings_raise():
    with pytest.raises(InvalidParameterError, match="total_steps"):
        TrainSettings(out_dir="x", total_steps=0, batch_size=1, seq_len=8)
    with pytest.raises(InvalidParameterError, match="warmup_steps"):
        TrainSettings(out_dir="x", total_steps=5, batch_size=1, seq_len=8, warmup_steps=6)
    assert math.isfinite(lr_at(0, 1, 1e-3, 0))
    with pytest.raises(InvalidParameterError, match="decay_frac"):
        TrainSettings(out_dir="x", total_steps=5, batch_size=1, seq_len=8, warmup_steps=1, decay_frac=0)


def test_resume_from_another_model_layout_is_refused(tiny_corpus, tmp_path):
    # a checkpoint from before q/k/v were merged names q_proj/k_proj/v_proj: refused by name, not a torch KeyError
    from cinq.train.checkpoint import load_checkpoint, save_checkpoint
    _trainer(tiny_corpus, tmp_path, 8, stop_at=2)[0].run()
    path = tmp_path / "checkpoint.safetensors"
    state = load_checkpoint(path)
    state["model"] = {k.replace("qkv_proj", "q_proj"): v for k, v in state["model"].items()}
    save_checkpoint(path, state)
    with pytest.raises(InvalidParameterError, match="another model layout") as err:
        _trainer(tiny_corpus, tmp_path, 8)[0].run()
    assert err.value.param == "checkpoint"
