"""Fine-tuning a saved model on a generated task: the task's loss falls, the run resumes and exports."""

from __future__ import annotations

import json

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.model.loader import load_model
from benchmarks.finetune import FinetuneJob, finetune_on_task, task_tokens
from cinq.train.pretrain import causal_lm_loss
from cinq.train.tokenizer_train import load_tokenizer, special_ids


def test_task_tokens_wrap_each_problem_and_reject_unknown_tasks(teacher):
    tok = load_tokenizer(teacher)
    ids = special_ids(tok)
    stream = task_tokens(tok, "arithmetic-easy", 5, seed=0)
    assert stream[0] == ids["bos"] and stream[-1] == ids["eos"]
    assert int((stream == ids["bos"]).sum()) == 5
    with pytest.raises(InvalidParameterError, match="task"):
        task_tokens(tok, "chess", 5, seed=0)


def test_finetune_lowers_the_task_loss_and_exports(teacher, tmp_path):
    tok = load_tokenizer(teacher)
    held_out = torch.from_numpy(task_tokens(tok, "arithmetic-easy", 40, seed=0, split="validation")[:8 * 33].astype("int64")).view(8, 33)
    with torch.no_grad():
        before = float(causal_lm_loss(load_model(teacher, dtype="float32"), held_out))
    job = FinetuneJob(base=str(teacher), out_dir=str(tmp_path / "ft"), n_problems=300, token_budget=60 * 8 * 32,
                      batch_size=8, seq_len=32, lr=3e-3, warmup_steps=5, progress=False)
    summary = finetune_on_task(job)
    assert summary["finished"] and summary["step"] == 60
    tuned = load_model(tmp_path / "ft" / "model", dtype="float32")
    with torch.no_grad():
        after = float(causal_lm_loss(tuned, held_out))
    assert after < before - 0.1
    assert (tmp_path / "ft" / "model" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "ft" / "summary.json").read_text())["task"] == "arithmetic-easy"
    # Rerunning the finished job resumes from its checkpoint and does no more steps.
    assert finetune_on_task(job)["step"] == 60
