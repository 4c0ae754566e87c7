"""`cinq eval` end to end: a model and two quantized variants through the engine, resumed on a second run;
embedded model names; one-line errors."""

from __future__ import annotations

import json

from cinq.cli import main
from tests.quant.conftest import arithmetic_text


def test_two_variants_end_to_end_and_resume(trained_tiny, tmp_path, capsys):
    ppl = tmp_path / "ppl.jsonl"  # the corpus format: "text" fields
    ppl.write_text("".join(json.dumps({"text": arithmetic_text(2, seed=s, split="test")}) + "\n" for s in (1, 2)))
    out = tmp_path / "study"
    argv = ["eval", str(trained_tiny), "--variants", "rtn:4,3;awq:8", "--group-sizes", "32", "--ppl", str(ppl),
            "--tasks", "arithmetic-easy", "--n-problems", "2", "--decode-tokens", "4", "--decode-repeats", "1",
            "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "[2/3] rtn-w4-g32:" in captured.err and "[3/3] rtn-w3-g32:" in captured.err and "ETA" in captured.err
    md = (out / "quality.md").read_text()
    assert md == captured.out.split("\nwrote ")[0].rstrip("\n") + "\n"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "(bf16 kernel: dequantized at load)" in rows["rtn-w3-g32"]
    assert "dequantized" not in rows["rtn-w4-g32"] and "baseline" in rows[trained_tiny.name]
    assert "awq-w8-g32: the AWQ GEMM format stores 4-bit weights only" in md and "## Findings" in md
    data = json.loads((out / "quality.json").read_text())
    assert [r["label"] for r in data["rows"]] == [trained_tiny.name, "rtn-w4-g32", "rtn-w3-g32"]
    assert data["rows"][2]["bits"] == 3 and data["rows"][2]["n_problems"] == 2
    assert data["rows"][2]["decode_tokens_per_s"] > 0 and data["rows"][2]["kernels"] == ["dequantized_at_load"]
    assert data["rows"][1]["weight_bytes"] > data["rows"][2]["weight_bytes"]  # packed 3-bit is smaller
    assert (out / "quality.png").is_file()

    assert main(argv + ["--no-progress"]) == 0  # resumed: every row from the cache
    again = capsys.readouterr()
    assert "cached" not in again.err and "[1/3]" not in again.err
    assert json.loads((out / "quality.json").read_text()) == data
    assert main(argv) == 0
    assert capsys.readouterr().err.count(": cached") == 3


def test_embedded_model_names_and_one_line_errors(capsys):
    assert main(["eval", "cinq-tiny", "--tasks", "none", "--decode-tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert "| cinq-tiny | float |" in out
    assert main(["eval", "no-such-model", "--tasks", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0] and "cinq-tiny" in err[0]
    assert main(["eval", "cinq-tiny", "--variants", "rtn:4"]) == 2
    assert "--variants needs --out" in capsys.readouterr().err
