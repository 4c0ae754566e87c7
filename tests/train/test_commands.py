"""`cinq train` and `cinq distill` end to end on the tiny fixture corpus (the commands the model cards cite)."""

import json

from cinq.cli import main


def test_train_then_distill_with_baseline_report_and_export(tiny_corpus, tmp_path, monkeypatch,
                                                            few_arithmetic_problems):
    monkeypatch.setattr("sys.argv", ["cinq"])  # the cards record the command line
    teacher_run, card_dir = tmp_path / "t", tmp_path / "shipped-teacher"
    assert main(["train", "--data", str(tiny_corpus), "--out", str(teacher_run), "--config", "micro",
                 "--tokens", "8192", "--batch-size", "8", "--seq-len", "32", "--lr", "1e-2", "--warmup", "5",
                 "--no-progress", "--export", str(card_dir)]) == 0
    assert (card_dir / "README.md").is_file() and (card_dir / "model.safetensors").is_file()
    student = tmp_path / "student.json"
    student.write_text(json.dumps({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "num_key_value_heads": 1}))
    report = tmp_path / "results" / "distill"
    assert main(["distill", "--teacher", str(card_dir), "--student", str(student), "--data", str(tiny_corpus),
                 "--out", str(tmp_path / "kd"), "--loss", "fkl=0.9,ce=0.1", "--tokens", "4096", "--batch-size", "8",
                 "--seq-len", "32", "--no-progress", "--baseline-ce", str(tmp_path / "ce"), "--report", str(report),
                 "--include", f"same run, b=1={tmp_path / 'kd'}",
                 "--arith-problems", "4", "--export", str(tmp_path / "shipped-student")]) == 0
    table = report.with_suffix(".md").read_text()
    assert "teacher (cinq-tiny)" in table and "offpolicy:fkl=0.9,ce=0.1" in table and "CE only" in table
    assert "| same run, b=1 |" in table  # a name may hold "="
    rows = json.loads(report.with_suffix(".json").read_text())
    assert rows["CE only"]["tokens_seen"] == rows["offpolicy:fkl=0.9,ce=0.1"]["tokens_seen"] == 4096
    assert "kl_to_teacher" in rows["CE only"]
    assert "Forward KL" in (tmp_path / "shipped-student" / "README.md").read_text()


def test_train_init_from_with_a_task_mix_continues_and_keeps_the_stages(tiny_corpus, tmp_path, monkeypatch, capsys,
                                                                       few_arithmetic_problems):
    """An anneal: `cinq train --init-from` starts from the shipped weights, mixes in the generated task, and the
    exported card keeps the first stage's command and token count."""
    def cinq(*argv: str) -> int:  # the card records the command line from sys.argv
        monkeypatch.setattr("sys.argv", ["cinq", *argv])
        return main(list(argv))

    first, shipped = tmp_path / "first", tmp_path / "shipped"
    common = ["--data", str(tiny_corpus), "--config", "micro", "--batch-size", "8", "--seq-len", "32",
              "--warmup", "2", "--no-progress"]
    assert cinq("train", *common, "--out", str(first), "--tokens", "4096", "--lr", "1e-2",
                 "--export", str(shipped)) == 0
    before = json.loads((shipped / "eval.json").read_text())
    assert cinq("train", *common, "--out", str(tmp_path / "anneal"), "--tokens", "2048", "--lr", "1e-3",
                 "--init-from", str(shipped), "--task", "arithmetic-easy", "--task-fraction", "0.5",
                 "--export", str(shipped)) == 0
    training = json.loads((shipped / "training.json").read_text())
    assert [st["tokens_seen"] for st in training["stages"]] == [4096, 2048]
    assert len(training["commands"]) == 3 and "--init-from" in training["commands"][-1]
    card = (shipped / "README.md").read_text()
    assert "tokens seen, all stages | 6,144" in card
    after = json.loads((shipped / "eval.json").read_text())
    assert after["previous"]["perplexity"] == before["perplexity"] and after["perplexity"] != before["perplexity"]
    capsys.readouterr()
    assert cinq("train", *common, "--out", str(tmp_path / "bad"), "--init-from", str(shipped),
                "--task-fraction", "0.5") == 2
    assert "task" in capsys.readouterr().err  # one line naming the field, nothing trained
    assert not (tmp_path / "bad" / "summary.json").exists()
