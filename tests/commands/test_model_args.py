"""Every command that takes a model answers a bad one with one line naming the argument (exit 2, no traceback),
and finds the embedded models by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cinq.assets import shipped_model_path


def cinq(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cinq.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("argv,field", [
    (["generate", "no-such-model", "-p", "hi"], "model"),
    (["chat", "no-such-model"], "model"),
    (["serve", "no-such-model", "--port", "0"], "model"),
    (["quantize", "no-such-model", "--method", "rtn", "--out", "{tmp}/q"], "model"),
    (["distill", "--teacher", "no-such-model", "--data", "{tmp}", "--out", "{tmp}/d"], "--teacher"),
    (["distill", "--heads", "eagle", "--target", "no-such-model", "--data", "{tmp}", "--out", "{tmp}/d"],
     "--target"),
    (["generate", "--speculative-config",
      '{"method": "draft_model", "model": "no-such-model", "num_speculative_tokens": 2}', "-p", "hi"],
     "speculative_config.model"),
])
def test_a_bad_model_argument_is_one_line_naming_it(argv, field, tmp_path, run_cli):
    r = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"cinq {argv[0]}: error: {field}: 'no-such-model' is neither a model folder, a GGUF "
                                f"file nor a model name (model names: cinq-tiny")
    assert "Traceback" not in r.stderr


def test_a_bad_student_and_generation_config_name_their_flags(tmp_path, run_cli):
    r = run_cli("distill", "--teacher", "cinq-tiny", "--student", "nope", "--data", str(tmp_path), "--out",
             str(tmp_path / "d"))
    assert r.returncode == 2 and r.stderr.strip().startswith("cinq distill: error: --student: 'nope' is neither")
    r = run_cli("generate", "--generation-config", str(tmp_path), "-p", "hi")
    assert r.returncode == 2 and "cinq generate: error: generation_config: " in r.stderr
    assert "Traceback" not in r.stderr


def test_generate_with_the_embedded_model_by_name_writes_a_few_lines_and_repeats_with_a_seed(run_cli):
    if shipped_model_path("cinq-tiny") is None:
        pytest.skip("cinq-tiny is not shipped in this checkout")
    argv = ("generate", "cinq-tiny", "-p", "Once upon a time", "--seed", "0", "--json", "--num-kv-blocks", "64")
    runs = [cinq(*argv), run_cli(*argv)]  # the repeat in this process: one process start fewer
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    row = json.loads(runs[0].stdout)
    assert 24 <= row["num_tokens"] <= 96  # the shipped generation config's min_new_tokens / max_new_tokens
    assert "default sampling parameters from the model's generation_config.json" in runs[0].stderr
