"""save_model's generation_config.json: cinq's chat models get the turn markers as eos ids and cinq's defaults."""

from __future__ import annotations

import json

from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.generation_defaults import CINQ_SAMPLING_DEFAULTS
from cinq.model.saver import init_random_model, save_model


def tiny_config(bos: int, eos: int, vocab: int = 300) -> ModelConfig:
    return ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "bos_token_id": bos,
        "eos_token_id": eos})


def gen_of(folder) -> dict:
    return json.loads((folder / "generation_config.json").read_text())


def test_a_model_with_cinqs_trained_tokenizer_layout_gets_turn_markers_and_defaults(tmp_path):
    # cinq/train/tokenizer_train.py puts the specials first: <|bos|> 0 ... <|user|> 3 <|assistant|> 4
    # <|system|> 5 <|end|> 6 (what cinq/train/export.py saves, before it copies the tokenizer)
    out = save_model(init_random_model(tiny_config(0, 6)), tmp_path / "m")
    gen = gen_of(out)
    assert gen["eos_token_id"] == [6, 3, 4, 5] and gen["bos_token_id"] == 0
    assert {k: gen[k] for k in CINQ_SAMPLING_DEFAULTS} == CINQ_SAMPLING_DEFAULTS
    assert ModelConfig.from_pretrained(out).eos_token_ids == [6, 3, 4, 5]  # the engine stops on every one


def test_other_layouts_keep_a_plain_generation_config_unless_the_tokenizer_is_named(tmp_path):
    tok = build_byte_tokenizer()  # specials after the 256 bytes
    bos, end = tok.token_to_id("<|bos|>"), tok.token_to_id("<|end|>")
    model = init_random_model(tiny_config(bos, end))
    assert gen_of(save_model(model, tmp_path / "plain")) == {"bos_token_id": bos, "eos_token_id": [end]}
    save_byte_tokenizer(tmp_path / "tok")
    gen = gen_of(save_model(model, tmp_path / "chat", tokenizer=tmp_path / "tok"))
    markers = [tok.token_to_id(m) for m in ("<|user|>", "<|assistant|>", "<|system|>")]
    assert gen["eos_token_id"] == [end, *markers] and gen["temperature"] == CINQ_SAMPLING_DEFAULTS["temperature"]
