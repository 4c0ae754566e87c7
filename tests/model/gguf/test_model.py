"""Round trip: what ``cinq export --format gguf`` writes, cinq reads back — float32 logits equal transformers'
GGUF loader on the same file (bf16, q8_0, q4_0: the 4- and 8-bit blocks served natively), the tokenizer's ids equal
the folder's own, and the dense folder ``cinq export --format hf`` writes from a GGUF file loads to the same
logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.assets import resolve_model_path
from cinq.export.gguf import export_gguf
from cinq.export.hf_folder import gguf_to_folder
from cinq.model.loader import load_model
from cinq.model.tokenizer import Tokenizer

TEXTS = ["Once upon a time", "The year 1984 had 366 days.", "  two  spaces\n\nand lines\n",
         "def f(x):\n    return x ** 2", "Ünïcödé: café, naïve, 東京 🙂", "3+4=7; 12*12=144", "it's what we'd've said"]


@pytest.fixture(scope="module")
def exports(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rt")
    return {t: export_gguf(tiny_llama, out / f"m-{t}.gguf", t).path for t in ("bf16", "q8_0", "q4_0")}


@pytest.mark.parametrize("outtype", ["bf16", "q8_0", "q4_0"])
def test_exported_file_reads_back_to_transformers_logits(exports: dict[str, Path], outtype: str):
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM
    path = exports[outtype]
    ours = load_model(path, dtype="float32")
    kinds = {type(m).__name__ for m in ours.modules()}
    assert ("GGUFLinear" in kinds) == (outtype != "bf16")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 42, 99, 7, 250, 11, 64, 5, 31]])
    with torch.no_grad():
        diff = (ours.compute_logits(ours(ids)) - theirs(ids).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_exported_tokenizer_gives_the_folders_ids(tmp_path: Path):
    folder = resolve_model_path("cinq-tiny", "model")
    path = export_gguf(folder, tmp_path / "tiny.gguf", "q8_0").path
    mine, src = Tokenizer.from_pretrained(path), Tokenizer.from_pretrained(folder)
    for text in TEXTS:
        for special in (True, False):
            assert mine.encode(text, add_special_tokens=special) == src.encode(text, add_special_tokens=special) \
                or (special and src.add_bos_token and not mine.add_bos_token), text
    assert mine.chat_template == src.chat_template


def test_hf_folder_from_gguf_loads_to_the_same_logits(exports: dict[str, Path], tmp_path: Path):
    path = exports["q4_0"]
    folder = gguf_to_folder(path, tmp_path / "dense", dtype="float32")
    a, b = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(a.compute_logits(a(ids)), b.compute_logits(b(ids)))
    assert Tokenizer.from_pretrained(folder).encode("hello world") == Tokenizer.from_pretrained(path).encode(
        "hello world")
