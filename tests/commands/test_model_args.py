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


@pytest.mark.parametrize("name,method,target", [
    ("smollm2-135m-instruct-eagle3", "eagle3", "smollm2-135m-instruct"),
    ("cinq-tiny-eagle", "eagle", "cinq-tiny"),
    ("cinq-tiny-medusa", "medusa", "cinq-tiny"),
])
def test_a_speculative_head_given_as_the_model_says_where_it_goes(name, method, target, run_cli):
    if shipped_model_path(name) is None:
        pytest.skip(f"{name} is not shipped in this checkout")
    r = run_cli("generate", name, "-p", "hi")
    assert r.returncode == 2, r.stderr
    spec = json.dumps({"method": method, "model": name, "num_speculative_tokens": 3})
    assert r.stderr.strip() == (f"cinq generate: error: model: {name} is a speculative-decoding head, not a model: "
                                f"give its target model ({target}) and pass the head in --speculative-config "
                                f"'{spec}'")


def test_heads_are_found_by_their_config_not_their_name(tmp_path):
    from cinq.assets import ASSETS_DIR
    from cinq.commands.model_args import speculative_head_method
    assert speculative_head_method(ASSETS_DIR / "cinq-tiny") is None
    assert speculative_head_method(ASSETS_DIR / "cinq-tiny-eagle3") == "eagle3"
    assert speculative_head_method(tmp_path / "missing") is None  # the loader reports it
    for archs, method in ((["LlamaForCausalLMEagle3"], "eagle3"), (["EagleLlamaForCausalLM"], "eagle"),
                          (["MedusaModel"], "medusa"), (["Qwen2ForCausalLM"], None)):
        folder = tmp_path / archs[0]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": archs}))  # vLLM's heads: no cinq_spec
        assert speculative_head_method(folder) == method
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    assert speculative_head_method(tmp_path / "bad") is None


def test_a_foreign_head_folder_is_refused_too(tmp_path, run_cli):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["EagleLlamaForCausalLM"]}))
    r = run_cli("generate", str(tmp_path), "-p", "hi")
    assert r.returncode == 2
    assert r.stderr.startswith(f"cinq generate: error: model: {tmp_path} is a speculative-decoding head, not a "
                               f"model: give its target model and pass the head in --speculative-config")


def test_model_help_lists_the_names_the_cli_accepts(run_cli):
    from cinq.assets import embedded_model_names
    from cinq.real_models import REAL_MODELS
    text = " ".join(run_cli("generate", "--help").stdout.split()).replace("- ", "-")  # lines wrap at hyphens
    model_help = text[text.index("positional arguments:"):text.index("options:")]
    for name in [*embedded_model_names(), *REAL_MODELS]:
        assert name in model_help
    assert "GGUF file" in model_help and "Hugging Face model folder" in model_help
    # the heads are named as heads, not among the models
    models = model_help[:model_help.index("speculative heads")]
    assert "cinq-tiny-student" in models and "eagle" not in models and "medusa" not in models


def test_the_package_docstring_says_speculative_decoding_is_built():
    import cinq
    from cinq.spec.config import BUILT_METHODS
    assert "planned" not in cinq.__doc__
    said = {"ngram": "n-gram", "draft_model": "draft model", "eagle": "EAGLE", "eagle3": "EAGLE-3",
            "medusa": "Medusa"}
    assert set(said) == set(BUILT_METHODS)
    assert all(word in " ".join(cinq.__doc__.split()) for word in said.values())
