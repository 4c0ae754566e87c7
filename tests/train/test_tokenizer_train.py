import json

import pytest

from cinq.errors import InvalidParameterError
from cinq.model.byte_tokenizer import SPECIALS
from cinq.model.tokenizer import Tokenizer
from cinq.train.tokenizer_train import (load_tokenizer, repair_bos_post_processor, save_tokenizer, special_ids,
                                       train_bpe)

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Der schnelle braune Fuchs springt. " * 3,
         "Быстрая коричневая лиса. " * 3, "12 + 345 = 357\nAnswer: 357"] * 20


def test_vocab_size_specials_and_digits():
    tok = train_bpe(TEXTS, vocab_size=320)
    assert tok.get_vocab_size() == 320
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    assert tok.encode("345", add_special_tokens=False).tokens == ["3", "4", "5"]
    text = "Быстрая лиса 12 <|user|>"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
    assert train_bpe(TEXTS, vocab_size=320).to_str() == tok.to_str()  # deterministic


def test_bad_vocab_size_raises():
    with pytest.raises(InvalidParameterError, match="vocab_size"):
        train_bpe(TEXTS, vocab_size=100)


def test_saved_tokenizer_loads_in_cinq_and_transformers(tiny_corpus):
    folder = tiny_corpus / "tokenizer"
    ids = special_ids(load_tokenizer(folder))
    cinq_tok = Tokenizer.from_pretrained(folder)
    text = "Der Hund lief 42 mal."
    enc = cinq_tok.encode(text)
    assert enc[0] == ids["bos"] and cinq_tok.decode(enc) == text
    assert cinq_tok.eos_token_ids == [ids["eos"]]
    chat = cinq_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|bos|><|user|>hi<|end|><|assistant|>"
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.encode(text, add_special_tokens=False) == enc[1:]
    assert hf.encode(text) == enc  # the BOS comes from tokenizer.json's post-processor, for both
    assert hf.eos_token == "<|end|>" and hf.bos_token == "<|bos|>"
    assert hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                  add_generation_prompt=True) == chat


def _bare_copy(folder, out):
    """``folder``'s tokenizer files with the post-processor removed (a tokenizer written before cinq set one)."""
    import shutil

    from tokenizers import Tokenizer as HFTokenizer
    out.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(folder / name, out / name)
    tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = None
    tok.save(str(out / "tokenizer.json"))
    return out


def test_save_tokenizer_adds_the_bos_post_processor_without_touching_its_argument(tmp_path):
    tok = train_bpe(TEXTS, vocab_size=320)
    assert tok.encode("hi").ids[0] == 0 and tok.encode("hi", add_special_tokens=False).ids[0] != 0
    tok.post_processor = None
    save_tokenizer(tok, tmp_path)
    assert tok.post_processor is None
    saved = load_tokenizer(tmp_path)
    assert saved.encode("hi").ids == [0, *tok.encode("hi").ids]
    assert saved.encode("hi", add_special_tokens=False).ids == tok.encode("hi").ids


def test_repair_changes_only_the_post_processor_and_is_idempotent(tiny_corpus, tmp_path):
    folder = _bare_copy(tiny_corpus / "tokenizer", tmp_path / "old")
    before = json.loads((folder / "tokenizer.json").read_text())
    assert repair_bos_post_processor(folder) and not repair_bos_post_processor(folder)
    after = json.loads((folder / "tokenizer.json").read_text())
    assert [k for k in before if before[k] != after[k]] == ["post_processor"]
    assert after["post_processor"]["type"] == "TemplateProcessing"
    assert Tokenizer.from_pretrained(folder).encode("Der Hund") == \
        Tokenizer.from_pretrained(tiny_corpus / "tokenizer").encode("Der Hund")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": False}))
    assert not repair_bos_post_processor(_bare_copy(folder, tmp_path / "no-bos"))  # nothing promised


def test_export_model_repairs_a_tokenizer_without_post_processor(tiny_corpus, tmp_path):
    import torch

    from cinq.model.config import ModelConfig
    from cinq.model.saver import init_random_model
    from cinq.train.export import export_model
    src = _bare_copy(tiny_corpus / "tokenizer", tmp_path / "src")
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 400, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "bos_token_id": 0,
        "eos_token_id": 6, "max_position_embeddings": 64})
    out = export_model(init_random_model(config, seed=0), src, tmp_path / "out", dtype=torch.float32)
    assert load_tokenizer(out).encode("hi").ids[0] == special_ids(load_tokenizer(out))["bos"]
    assert load_tokenizer(src).post_processor is None  # the source is left as it was
