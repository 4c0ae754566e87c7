"""Errors from the option classes behind `cinq tune` and `cinq bench` name the flag the user typed, not the
option's field or another command's flag."""

from __future__ import annotations

import argparse

import pytest

from cinq.commands.flag_errors import naming_flags, parser_flags, with_flag
from cinq.errors import InvalidParameterError, ModelLoadError


@pytest.mark.parametrize("message,param,flag,said", [
    ("num_requests must be an integer >= 1, got 0", "num_requests", "--num-prompts",
     "--num-prompts must be an integer >= 1, got 0"),
    ("--variants: unknown method 'bogus'", "variants", "--quant", "--quant: unknown method 'bogus'"),
    ("student: 'x' is neither a model folder", "student", "--student", "--student: 'x' is neither a model folder"),
    ("prefix_len + suffix_len = 9 exceeds max_model_len 8", "prefix_len", "--prefix-len",
     "--prefix-len: prefix_len + suffix_len = 9 exceeds max_model_len 8"),
    ("cinq bench spec needs --speculative-config", "speculative_config", "--speculative-config",
     "cinq bench spec needs --speculative-config"),  # named already
])
def test_with_flag(message, param, flag, said):
    assert with_flag(message, param, flag) == said


def test_naming_flags_keeps_the_class_and_passes_others():
    with pytest.raises(ModelLoadError, match="^--student: 'x'") as e:
        with naming_flags({"student": "--student"}):
            raise ModelLoadError("student: 'x' is not a model", "student")
    assert e.value.param == "student"
    with pytest.raises(InvalidParameterError, match="^seed must"):
        with naming_flags({"student": "--student"}):
            raise InvalidParameterError("seed must be an integer", "seed")


def test_parser_flags_take_the_long_spelling():
    p = argparse.ArgumentParser()
    p.add_argument("-n", "--num-prompts", type=int)
    p.add_argument("model")
    assert parser_flags(p) == {"num_prompts": "--num-prompts"}


def test_tune_names_quant_not_variants(run_cli):
    r = run_cli("tune", "cinq-tiny", "--quant", "bogus:9")
    assert r.returncode == 2
    assert r.stderr.strip() == ("cinq tune: error: --quant: unknown method 'bogus' in 'bogus:9'; methods: rtn, gptq, "
                                "awq, smoothquant, nf4, fp8")
    r = run_cli("tune", "cinq-tiny", "--max-num-seqs-values", "0")
    assert r.returncode == 2 and r.stderr.startswith("cinq tune: error: --max-num-seqs-values must be ")


@pytest.mark.parametrize("argv,said", [
    (["throughput", "--num-prompts", "0", "--no-baseline"], "--num-prompts must be an integer >= 1, got 0"),
    (["spec", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "--input-len", "0"],
     "--input-len must be an integer >= 1, got 0"),
    (["serve", "--num-prompts", "0", "--no-baseline"], "--num-prompts must be an integer >= 1, got 0"),
])
def test_bench_names_its_flags(argv, said, run_cli):
    r = run_cli("bench", *argv)
    assert r.returncode == 2, r.stderr
    assert [line for line in r.stderr.splitlines() if not line.startswith("INFO")] == [f"cinq bench: error: {said}"]
