"""`cinq quantize` and `cinq eval` from the command line."""

from __future__ import annotations

import json

import pytest

from cinq.cli import main


@pytest.fixture
def calib_file(tmp_path):
    from cinq.tasks import arithmetic_problems
    path = tmp_path / "calib.txt"
    path.write_text("".join(p.text() for p in arithmetic_problems(60, seed=5, split="validation")))
    return path


def test_quantize_refuses_to_run_without_calibration_text(trained_tiny, tmp_path, capsys):
    rc = main(["quantize", str(trained_tiny), "--method", "gptq", "--out", str(tmp_path / "q")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--calib FILE is required" in err and "local file" in err
    assert not (tmp_path / "q").exists()


def test_quantize_then_eval(trained_tiny, tmp_path, calib_file, capsys):
    out = tmp_path / "gptq"
    rc = main(["quantize", str(trained_tiny), "--method", "gptq", "--bits", "4", "--group-size", "32",
               "--calib", str(calib_file), "--calib-samples", "8", "--calib-seq-len", "64", "--out", str(out),
               "--n-problems", "2", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text
    assert "| float | float |" in text and "| gptq | gptq (gptq) | 4 |" in text  # the report rows
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["group_size"] == 32
    assert json.loads((out / "quantize_config.json").read_text())["bits"] == 4

    report_dir = tmp_path / "report"
    rc = main(["eval", f"bf16={trained_tiny}", f"gptq={out}", "--ppl", str(calib_file), "--n-problems", "2",
               "--max-new-tokens", "8", "--tasks", "arithmetic-easy", "--out", str(report_dir)])
    assert rc == 0
    data = json.loads((report_dir / "quality.json").read_text())
    assert data["task"] == "arithmetic-easy" and all(r["n_problems"] == 2 and r["n_steps"] >= 4 for r in data["rows"])
    assert [r["label"] for r in data["rows"]] == ["bf16", "gptq"]
    assert all(r["perplexity"] > 1 for r in data["rows"])
    assert (report_dir / "quality.md").is_file() and (report_dir / "quality.png").is_file()


def test_eval_rejects_unknown_tasks(capsys):
    assert main(["eval", "--tasks", "mmlu"]) == 2
    assert "unknown task" in capsys.readouterr().err
    assert main(["eval", "--tasks", "arithmetic,arithmetic-easy"]) == 2
    assert "one task per report" in capsys.readouterr().err


def test_quantize_leaves_the_lm_head_dense_unless_asked(tmp_path, trained_tiny, capsys):
    """The head is quantized round-to-nearest; on SmolLM2-135M (tied embedding) that doubled GPTQ's perplexity
    loss, so it is opt-in (--lm-head); --no-lm-head, the old way to say the default, is still accepted."""
    from cinq.model.saver import init_random_model, save_model
    from tests.quant.conftest import tiny_config

    src = tmp_path / "vocab512"  # a vocabulary that packs (multiple of 8), unlike trained_tiny's 263 bytes
    save_model(init_random_model(tiny_config(vocab=512), seed=0), src)
    for flags, want in (([], False), (["--no-lm-head"], False), (["--lm-head"], True),
                        (["--lm-head", "--format", "gptq_v2"], True)):
        out = tmp_path / f"q{len(list(tmp_path.iterdir()))}"
        assert main(["quantize", str(src), "--method", "rtn", "--group-size", "32", "--out", str(out),
                     "--no-eval", "--no-progress", *flags]) == 0
        qc = json.loads((out / "config.json").read_text())["quantization_config"]
        assert qc["lm_head"] is want, flags
        assert ("LM head quantized" in capsys.readouterr().out) is want
    out = tmp_path / "bytes"  # asked for, a head whose 263 rows cannot pack is refused, naming it
    assert main(["quantize", str(trained_tiny), "--method", "rtn", "--group-size", "32", "--out", str(out),
                 "--no-eval", "--no-progress", "--lm-head"]) != 0
    assert "lm_head" in capsys.readouterr().err
