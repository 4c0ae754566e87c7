"""ship_head (cinq/train/spec_head_card.py): a finished head run copied to a folder with its model card and its
training figures (training.json), which benchmarks/head_before_after.py reads where the run folder is gone."""

from __future__ import annotations

import json
from pathlib import Path

from cinq.train.spec_head_card import TRAINING_FILE, ship_head, training_record


def fake_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "head").mkdir(parents=True)
    target = {"name": "target.gguf", "hidden_size": 8, "vocab_size": 32, "num_hidden_layers": 2,
              "fingerprint": "abc123"}
    (run / "head" / "config.json").write_text(json.dumps(
        {"draft_vocab_size": 16, "torch_dtype": "bfloat16",
         "cinq_spec": {"method": "eagle3", "feature_layers": [0, 1, 2], "target": target}}))
    (run / "head" / "model.safetensors").write_bytes(b"weights")
    lang = {"tau": 1.5, "accept_rate": [0.4, 0.1], "steps": 10}
    summary = {
        "job": {"method": "eagle3", "train_prompts": 18, "data_dir": "chat", "max_prompt": 80, "max_tokens": 96,
                "sample_temperature": 0.7, "batch_size": 8, "lr": 0.003, "warmup_steps": 50, "eval_max_tokens": 96},
        "acceptance": {"k": 2, "per_language": {"en": lang}, "all": lang},
        "head_dir": str(run / "head"), "head_parameters": 1234, "step": 7, "elapsed_s": 61.04,
        "train_data": {"sequences": 18, "tokens": 2000, "generated_tokens": 1500, "per_language": {"en": 18}},
        "eval_data": {"sequences": 4}, "cpu": "test CPU", "torch_threads": 2, "final_loss": 2.5,
        "draft_vocab": {"size": 16, "coverage_train": 0.99, "coverage_held_out": 0.9},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_shipped_head_keeps_its_weights_card_and_training_figures(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    dest = ship_head(run, tmp_path / "shipped", ["cinq distill --heads eagle3 ..."])
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    card = (dest / "README.md").read_text()
    assert "| steps | 7 x 8 whole sequences |" in card and "cinq distill --heads eagle3 ..." in card
    record = json.loads((dest / TRAINING_FILE).read_text())
    assert record == {"train_prompts": 18, "train_tokens": 2000, "steps": 7, "elapsed_s": 61.0, "tau": 1.5,
                      "prompt_mix": "balanced"}  # a run recorded before the option existed was balanced
    assert record == json.loads(json.dumps(training_record(json.loads((run / "summary.json").read_text()))))


def test_the_shipped_smollm2_head_has_its_training_figures() -> None:
    """benchmarks/head_before_after.py compares against the shipped head by its training.json."""
    from cinq.assets import ASSETS_DIR
    record = json.loads((ASSETS_DIR / "smollm2-135m-instruct-eagle3" / TRAINING_FILE).read_text())
    assert {"train_prompts", "train_tokens", "steps", "tau"} <= set(record)
    assert record["steps"] > 0 and record["train_tokens"] > 0
