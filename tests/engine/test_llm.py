"""LLM: embedded models by name, the model's generation config as default sampling (vLLM's
generation_config="auto"), a fresh seed per engine unless one is given, turn markers ending a chat reply."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from cinq import LLM, SamplingParams
from cinq.assets import ASSETS_DIR, shipped_model_path
from cinq.errors import ModelLoadError
from cinq.model.generation_defaults import TURN_MARKERS

SMALL = {"dtype": "float32", "num_kv_blocks": 64, "block_size": 16}


def with_generation_config(src: Path, dst: Path, **sampling: object) -> Path:
    """A copy of ``src`` whose generation_config.json also holds ``sampling``."""
    shutil.copytree(src, dst)
    file = dst / "generation_config.json"
    gen = json.loads(file.read_text()) if file.is_file() else {}
    file.write_text(json.dumps({**gen, **sampling}))
    return dst


@pytest.fixture(scope="module")
def teacher() -> LLM:
    if shipped_model_path("cinq-tiny") is None:
        pytest.skip("cinq-tiny is not shipped in this checkout")
    return LLM("cinq-tiny", dtype="bfloat16", num_kv_blocks=256, seed=0)


def test_an_embedded_model_loads_by_name_and_none_is_the_default(teacher):
    assert teacher.engine.config.model == str(ASSETS_DIR / "cinq-tiny")
    assert LLM(None, num_kv_blocks=8).engine.config.model == str(ASSETS_DIR / "cinq-tiny")


@pytest.mark.parametrize("name", ["no/such/model", "cinq-huge"])
def test_a_bad_model_is_one_line_naming_model(name):
    why = "is neither a model folder, a GGUF file nor a model name"
    with pytest.raises(ModelLoadError, match=f"^model: '{name}' {why} \\(model names: cinq-tiny") as e:
        LLM(name)
    assert e.value.param == "model" and "\n" not in str(e.value)


def test_a_folder_without_config_json_says_so(tmp_path):
    # a folder is the loader's to vet: it names the missing (or hostile) file itself
    with pytest.raises(ModelLoadError, match="no config.json") as e:
        LLM(str(tmp_path))
    assert "\n" not in str(e.value)


def test_the_models_generation_config_is_the_default_sampling(tiny_llama, tmp_path, caplog):
    folder = with_generation_config(tiny_llama, tmp_path / "m", temperature=0.0, min_new_tokens=5, max_new_tokens=5)
    with caplog.at_level(logging.INFO, logger="cinq.engine.core"):
        llm = LLM(str(folder), **SMALL)
    assert "default sampling parameters from the model's generation_config.json" in caplog.text
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.min_tokens, defaults.max_tokens) == (0.0, 5, 5)
    prompts = ["abc", "hello there"]
    outs = llm.generate(prompts)
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 5]
    explicit = llm.generate(prompts, SamplingParams(temperature=0.0, min_tokens=5, max_tokens=5))
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in explicit]
    assert len(llm.chat([{"role": "user", "content": "hi"}])[0].outputs[0].token_ids) == 5
    # given parameters are taken whole, as vLLM does: no default leaks into them
    assert len(llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids) == 2


def test_generation_config_vllm_ignores_the_models_file(tiny_llama, tmp_path):
    folder = with_generation_config(tiny_llama, tmp_path / "m", temperature=0.0, max_new_tokens=5)
    llm = LLM(str(folder), generation_config="vllm", **SMALL)
    assert llm.engine.default_sampling_params == {}
    assert llm.get_default_sampling_params() == SamplingParams()


def test_an_unset_seed_is_drawn_per_engine_logged_and_kept(tiny_llama, caplog):
    with caplog.at_level(logging.DEBUG, logger="cinq.engine.core"):
        a, b = LLM(tiny_llama, **SMALL), LLM(tiny_llama, **SMALL)
    assert a.engine.config.seed is None and isinstance(a.engine.seed, int)
    assert a.engine.seed != b.engine.seed  # 32 random bits each
    assert f"sampling seed {a.engine.seed} (drawn at random" in caplog.text


def test_a_given_seed_repeats_unseeded_samples_across_engines(tiny_llama):
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    runs = [LLM(tiny_llama, seed=3, **SMALL) for _ in range(2)]
    assert runs[0].engine.seed == 3
    outs = [[o.outputs[0].token_ids for o in llm.generate(["a", "b", "c"], params)] for llm in runs]
    assert outs[0] == outs[1]


def test_a_quantized_models_load_line_says_its_method_and_bits(tiny_llama, tmp_path, caplog):
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    quantize_model(tiny_llama, tmp_path / "q", QuantConfig(method="rtn", bits=8, group_size=32), progress=False)
    with caplog.at_level(logging.INFO, logger="cinq.engine.core"):
        LLM(str(tmp_path / "q"), **SMALL)
    assert "(LlamaForCausalLM, RTN int8, group 32, float32, attention=" in caplog.text


def test_the_teachers_chat_turn_markers_end_a_reply(teacher):
    """The shipped teacher often opens a fake next turn (``<|user|>...``) instead of ending with ``<|end|>``:
    every turn marker is an eos id of its generation config, so the reply stops there (finish_reason "stop",
    the marker not in the text) and never holds one."""
    tok = teacher.tokenizer
    markers = {tok._tok.token_to_id(m) for m in TURN_MARKERS}
    assert markers <= set(teacher.engine.eos_token_ids)
    chats = [[{"role": "user", "content": text}] for text in ("hi", "Hello! Who are you?", "Tell me a fortune.")]
    shipped = teacher.get_default_sampling_params()
    for params in (shipped, shipped.clone(min_tokens=0)):  # with min_tokens 0 a marker may come first
        params = params.clone(skip_special_tokens=False, n=8, seed=11)
        for out in teacher.chat(chats, params):
            for c in out.outputs:
                assert not markers & set(c.token_ids[:-1]), c.text
                last = c.token_ids[-1]
                body = c.text.removesuffix(tok.id_to_token(last)) if last in markers else c.text
                assert not any(m in body for m in TURN_MARKERS), c.text
                assert c.finish_reason == ("stop" if last in markers else "length")
