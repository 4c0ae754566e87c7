"""Tokenization parity with transformers: every tokenizer folder cinq ships or writes gives the same ids under
``transformers.AutoTokenizer`` as under cinq's ``Tokenizer`` (plain text with and without special tokens, chat
templates), starting with the BOS the models were trained with; cinq-tiny's logits on those ids match
``AutoModelForCausalLM``; and third-party folders whose tokenizer_config.json and tokenizer.json disagree on BOS
load as transformers loads them, with a warning."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from cinq.model.tokenizer import Tokenizer, add_bos_post_processor

transformers = pytest.importorskip("transformers")

ASSETS = Path(__file__).resolve().parents[2] / "cinq" / "assets"
SHIPPED = ("tokenizer", "cinq-tiny", "cinq-tiny-student")
SAMPLE = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Äpfel.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "我能吞下玻璃而不伤身体。你好，世界！",
    "def add(a: int, b: int) -> int:\n    return a + b  # sum\n\tprint({'k': [1, 2]})",
    "12 + 345 = 357; 3.14159; 1,000,000; 2024-05-17",
    "emoji 🎉👍🏽 ❤️ 🇩🇪",
    "  leading spaces, trailing\n\n",
    "a<|user|>marker text<|end|>",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi! Wie geht's? Как дела? 你好"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 🎉 + 12?"}],
]
TRAIN_TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Der schnelle braune Fuchs springt. " * 3,
               "Быстрая коричневая лиса. " * 3, "你好世界 " * 3, "def f(x):\n    return x + 1\n",
               "12 + 345 = 357\nAnswer: 357"] * 20


def _hf_tokenizer(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def _hf_chat_ids(hf, messages: list[dict[str, str]]) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    # transformers 5 returns a BatchEncoding here, 4.x a list of ids.
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


# ------------------------------------------------------------------ the folders cinq ships and writes

def _bpe_folder(root: Path) -> Path:
    from cinq.train.tokenizer_train import save_tokenizer, train_bpe
    return save_tokenizer(train_bpe(TRAIN_TEXTS, vocab_size=400), root / "bpe")


def _raw_bpe_folder(root: Path) -> Path:
    """save_tokenizer given a tokenizer without the post-processor (one trained before it existed)."""
    from cinq.train.tokenizer_train import save_tokenizer, train_bpe
    tok = train_bpe(TRAIN_TEXTS, vocab_size=400)
    tok.post_processor = None
    return save_tokenizer(tok, root / "raw-bpe")


def _byte_folder(root: Path) -> Path:
    from cinq.model.byte_tokenizer import save_byte_tokenizer
    return save_byte_tokenizer(root / "byte")


def _init_model_folder(root: Path) -> Path:
    from cinq.cli import build_parser
    args = build_parser().parse_args(["init-model", str(root / "init"), "--hidden-size", "64",
                                      "--num-layers", "1", "--num-heads", "2", "--dtype", "float32"])
    assert args.run(args) == 0
    return root / "init"


def _random_tiny_folder(root: Path) -> Path:
    from cinq.assets import ensure_random_tiny_model
    return ensure_random_tiny_model(root / "random-tiny")


WRITTEN = {"train_bpe": _bpe_folder, "save_tokenizer(no post-processor)": _raw_bpe_folder,
           "byte_tokenizer": _byte_folder, "init-model": _init_model_folder, "random-tiny": _random_tiny_folder}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok-parity")
    out = {name: ASSETS / name for name in SHIPPED}
    out.update({name: make(root) for name, make in WRITTEN.items()})
    return out


@pytest.mark.parametrize("name", [*SHIPPED, *WRITTEN])
def test_ids_match_transformers_and_start_with_bos(folders, name, caplog):
    folder = folders[name]
    with caplog.at_level(logging.WARNING, logger="cinq.model.tokenizer"):
        ours = Tokenizer.from_pretrained(folder)
    assert not caplog.records, "cinq's own folders must not disagree with themselves"
    hf = _hf_tokenizer(folder)
    bos = ours.bos_token_id
    assert bos is not None and hf.bos_token_id == bos and ours.add_bos_token
    for text in SAMPLE:
        plain = ours.encode(text, add_special_tokens=False)
        assert hf(text, add_special_tokens=False)["input_ids"] == plain, text
        # The models are trained on <|bos|> text <|end|> (cinq.train.data): exactly one BOS, from both.
        assert hf(text)["input_ids"] == ours.encode(text) == [bos, *plain], text
        assert hf.encode(text) == ours.encode(text), text


@pytest.mark.parametrize("name", [*SHIPPED, *WRITTEN])
def test_chat_ids_match_transformers_with_one_bos(folders, name):
    folder = folders[name]
    ours, hf = Tokenizer.from_pretrained(folder), _hf_tokenizer(folder)
    for messages in CHATS:
        text = ours.apply_chat_template(messages, True)
        assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # What cinq's LLM.chat, the server and `cinq chat` encode: the template carries the BOS itself.
        ids = ours.encode(text, add_special_tokens=False)
        assert _hf_chat_ids(hf, messages) == ids
        assert ids[0] == ours.bos_token_id and ids.count(ours.bos_token_id) == 1
        assert ids[-1] == ours._tok.token_to_id("<|assistant|>")


def test_training_documents_keep_their_ids(folders):
    """cinq.train.data encodes without special tokens and adds BOS/EOS itself: the post-processor changes nothing
    there (the shipped tokenizer against its pre-post-processor form)."""
    from tokenizers import Tokenizer as HFTokenizer

    from cinq.train.data import encode_documents
    from cinq.train.tokenizer_train import load_tokenizer, special_ids
    tok = load_tokenizer(folders["tokenizer"])
    bare = HFTokenizer.from_str(tok.to_str())
    bare.post_processor = None
    ids = special_ids(tok)
    got = encode_documents(tok, SAMPLE)
    assert got == encode_documents(bare, SAMPLE)
    assert all(e[0] == ids["bos"] and e[-1] == ids["eos"] and e.count(ids["bos"]) == 1 for e in got)


# ------------------------------------------------------------------ cinq-tiny: the same ids, the same logits

@pytest.fixture(scope="module")
def cinq_tiny_ids() -> list[list[int]]:
    ours = Tokenizer.from_pretrained(ASSETS / "cinq-tiny")
    chats = [ours.apply_chat_template(m, True) for m in CHATS]
    return [ours.encode(t) for t in SAMPLE if t] + [ours.encode(c, add_special_tokens=False) for c in chats]


def test_cinq_tiny_logits_match_transformers(cinq_tiny_ids):
    from cinq.model.loader import load_model
    folder = ASSETS / "cinq-tiny"
    ours = load_model(folder, dtype="float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for ids in cinq_tiny_ids:
        x = torch.tensor([ids])
        with torch.no_grad():
            got, want = ours.compute_logits(ours(x)), ref(x).logits
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= 1e-4, ids  # measured: 0 (same kernels, float32)


def test_cinq_tiny_llm_prompt_logprobs_match_transformers():
    """End to end: the LLM tokenizes text itself; its prompt ids and prompt logprobs are transformers'."""
    from cinq import LLM, SamplingParams
    folder = ASSETS / "cinq-tiny"
    hf = _hf_tokenizer(folder)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    texts = [t for t in SAMPLE if t][:6]
    llm = LLM(folder, dtype="float32", num_kv_blocks=64, block_size=16)
    outs = llm.generate(texts, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    for text, out in zip(texts, outs):
        ids = hf(text)["input_ids"]
        assert out.prompt_token_ids == ids and ids[0] == hf.bos_token_id, text
        with torch.no_grad():
            lp = ref(torch.tensor([ids])).logits[0].log_softmax(-1)
        for pos in range(1, len(ids)):
            assert abs(out.prompt_logprobs[pos][ids[pos]].logprob - lp[pos - 1, ids[pos]].item()) <= 1e-4


# ------------------------------------------------------------------ third-party folders whose files disagree

def _metaspace_tokenizer():
    """A Llama-2-style (Metaspace, byte fallback) BPE: what LlamaTokenizer(Fast) folders hold."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(TRAIN_TEXTS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False))
    return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def _byte_level_tokenizer():
    from cinq.model.byte_tokenizer import build_byte_tokenizer
    return build_byte_tokenizer(), {"bos_token": "<|bos|>", "eos_token": "<|end|>", "pad_token": "<|pad|>"}


def _disagreeing_folder(root: Path, kind: str, cls: str, add_bos_token: bool) -> Path:
    """tokenizer_config.json says ``add_bos_token``; tokenizer.json's post-processor does the opposite."""
    tok, cfg = {"metaspace": _metaspace_tokenizer, "byte-level": _byte_level_tokenizer}[kind]()
    tok.post_processor = None
    if not add_bos_token:
        add_bos_post_processor(tok, cfg["bos_token"])
    folder = root / f"{kind}-{cls}-{add_bos_token}"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    cfg = {**cfg, "tokenizer_class": cls, "add_bos_token": add_bos_token, "add_eos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("add_bos_token", [True, False], ids=["config-bos-no-post-processor",
                                                             "config-no-bos-post-processor-bos"])
@pytest.mark.parametrize("cls", ["PreTrainedTokenizerFast", "LlamaTokenizerFast"])
@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_disagreeing_files_follow_transformers_with_a_warning(tmp_path, caplog, kind, cls, add_bos_token):
    folder = _disagreeing_folder(tmp_path, kind, cls, add_bos_token)
    with caplog.at_level(logging.WARNING, logger="cinq.model.tokenizer"):
        ours = Tokenizer.from_pretrained(folder)
    warnings = [r for r in caplog.records if r.name == "cinq.model.tokenizer"]
    assert len(warnings) == 1 and "add_bos_token" in warnings[0].getMessage()
    assert str(folder) in warnings[0].getMessage()
    hf = _hf_tokenizer(folder)
    for text in SAMPLE:
        assert ours.encode(text) == hf(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]
    # transformers 5 follows tokenizer.json: BOS exactly when the post-processor adds it.
    assert ours.add_bos_token is (not add_bos_token)
    assert (ours.encode("hello")[0] == ours.bos_token_id) is (not add_bos_token)


def test_agreeing_third_party_files_do_not_warn(tmp_path, caplog):
    tok, cfg = _metaspace_tokenizer()
    add_bos_post_processor(tok, "<s>")
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": True,
                                                                "tokenizer_class": "LlamaTokenizerFast"}))
    with caplog.at_level(logging.WARNING, logger="cinq.model.tokenizer"):
        ours = Tokenizer.from_pretrained(tmp_path)
    assert not caplog.records
    assert ours.encode("hello") == _hf_tokenizer(tmp_path)("hello")["input_ids"]
    assert ours.encode("hello")[0] == ours.bos_token_id
