"""The whole data pipeline behind `cinq data build`: corpus -> tokenizer -> token files -> manifest."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from cinq.train.corpus import CorpusSettings, build_corpus, read_split
from cinq.train.data import tokenize_corpus
from cinq.train.sources import Source
from cinq.train.tokenizer_train import repair_bos_post_processor, save_tokenizer, train_bpe

log = logging.getLogger(__name__)


def build_dataset(sources: list[Source], out: str | Path, settings: CorpusSettings | None = None,
                  vocab_size: int = 8192, tokenizer_dir: str | Path | None = None) -> dict[str, Any]:
    """Build ``out``: the corpus splits, ``out/tokenizer`` (trained on the train split unless ``tokenizer_dir``
    is given, then copied), the token files, and ``manifest.json``; returns the manifest."""
    out = Path(out)
    log.info("collecting documents into %s", out)
    build_corpus(sources, out, settings)
    tok_out = out / "tokenizer"
    if tokenizer_dir is not None:
        tok_out.mkdir(parents=True, exist_ok=True)
        for f in Path(tokenizer_dir).iterdir():
            if f.suffix == ".json":
                shutil.copyfile(f, tok_out / f.name)
        # A tokenizer written before cinq gave its tokenizer.json the BOS post-processor: transformers would
        # tokenize this corpus's models without their BOS (only tokenizer.json counts there).
        repair_bos_post_processor(tok_out)
    else:
        log.info("training a %d-token byte-level BPE", vocab_size)
        texts = [d.text for d in read_split(out / "train.jsonl")]
        save_tokenizer(train_bpe(texts, vocab_size), tok_out)
    log.info("tokenizing")
    return tokenize_corpus(out, tok_out)
