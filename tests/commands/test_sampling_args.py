"""The sampling flags of `cinq generate` / `cinq chat`: a flag left out is the model's generation config, then
SamplingParams' default (--max-tokens: the command's own length)."""

from __future__ import annotations

import argparse
import json
import shutil

from cinq.commands.engine_args import add_engine_args
from cinq.commands.sampling_args import add_sampling_args, sampling_params_from_args
from cinq.sampling_params import SamplingParams


def parse(*argv: str, max_tokens: int = 64) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    add_sampling_args(p, max_tokens=max_tokens)
    return p.parse_args(list(argv))


def model_with(tiny_llama, tmp_path, **sampling):
    folder = tmp_path / "m"
    shutil.copytree(tiny_llama, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, **sampling}))
    return str(folder)


def test_left_out_flags_come_from_the_models_generation_config(tiny_llama, tmp_path):
    m = model_with(tiny_llama, tmp_path, temperature=0.6, top_p=0.8, max_new_tokens=40, min_new_tokens=10)
    p = sampling_params_from_args(parse(m))
    assert (p.temperature, p.top_p, p.max_tokens, p.min_tokens) == (0.6, 0.8, 40, 10)
    assert p.top_k == SamplingParams().top_k and p.repetition_penalty == 1.0  # not in the file: cinq's defaults


def test_flags_win_and_a_smaller_max_tokens_lowers_the_models_minimum(tiny_llama, tmp_path):
    m = model_with(tiny_llama, tmp_path, temperature=0.6, max_new_tokens=40, min_new_tokens=10)
    p = sampling_params_from_args(parse(m, "--temperature", "0", "--max-tokens", "4"))
    assert (p.temperature, p.max_tokens, p.min_tokens) == (0.0, 4, 4)


def test_without_model_defaults_the_commands_length_and_sampling_params_defaults(tiny_llama, tmp_path):
    m = model_with(tiny_llama, tmp_path, temperature=0.6, max_new_tokens=40)
    for args in (parse(str(tiny_llama), max_tokens=256), parse(m, "--generation-config", "vllm", max_tokens=256)):
        p = sampling_params_from_args(args)
        assert p == SamplingParams(max_tokens=256)


def test_given_defaults_are_used_as_they_are(tiny_llama):
    p = sampling_params_from_args(parse(str(tiny_llama)), defaults={"temperature": 0.1, "max_tokens": 3})
    assert (p.temperature, p.max_tokens) == (0.1, 3)
