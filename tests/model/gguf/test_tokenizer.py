"""The tokenizer of a GGUF file against transformers' GGUF tokenizer on the same file: byte-level BPE is tested on
the real model (test_smollm2.py); here a SentencePiece (``tokenizer.ggml.model = llama``) vocabulary without a
merge list, whose merges come from the scores, with byte fallback and control tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cinq.model.tokenizer import Tokenizer

PIECES = ["\u2581", "a", "b", "c", "t", "h", "e", "\u2581a", "ab", "\u2581ab", "bc", "th", "the", "\u2581t",
          "\u2581the", "\u2581c", "ca", "\u2581cat", "at", "\u2581ca"]
TEXTS = ["the cat", "abc abc", "a bat", "théâtre!", "  the  ", "cab\nbat", "中文", "the", ""]


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf import GGUFWriter
    folder = tmp_path_factory.mktemp("spm")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + PIECES
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    # SentencePiece scores: higher merges first; longer pieces later, so that merge order is not length order
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(PIECES))]
    w = GGUFWriter(str(folder / "spm.gguf"), "llama")
    w.add_block_count(1), w.add_context_length(64), w.add_embedding_length(32), w.add_feed_forward_length(64)
    w.add_head_count(4), w.add_head_count_kv(4), w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_types(types), w.add_token_scores(scores)
    w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return folder / "spm.gguf"


def test_sentencepiece_vocabulary_gives_transformers_ids(spm_file: Path):
    from transformers import AutoTokenizer
    theirs = AutoTokenizer.from_pretrained(spm_file.parent, gguf_file=spm_file.name)
    from cinq.model.gguf.file import read_gguf
    from cinq.model.gguf.tokenizer import gguf_tokenizer
    tok, config = gguf_tokenizer(read_gguf(spm_file), 259 + len(PIECES))
    mine = Tokenizer(tok, config)
    for text in TEXTS:
        for special in (True, False):
            assert mine.encode(text, add_special_tokens=special) == \
                theirs(text, add_special_tokens=special)["input_ids"], (text, special)
        assert mine.decode(mine.encode(text, add_special_tokens=False)) == \
            theirs.decode(theirs(text, add_special_tokens=False)["input_ids"])
