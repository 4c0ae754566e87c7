"""A tiny corpus built from fixture files this module writes (no Debian package needed), shared by the tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cinq.train.corpus import CorpusSettings
from cinq.train.sources import Source

WORDS = {
    "en": "the cat sat on a mat and the dog ran to see what was there with much joy".split(),
    "de": "der Hund lief schnell über die Wiese und sah eine Katze mit großer Freude".split(),
    "ru": "кот сидел на ковре и собака бежала посмотреть что там было".split(),
}


def write_fixture(root: Path) -> list[Source]:
    """Fortune files (en/de/ru), an OSIS bible export and two Python files under ``root``; their Sources."""
    rng = random.Random(0)
    sources = []
    for lang, words in WORDS.items():
        d = root / "fortunes" / lang
        d.mkdir(parents=True, exist_ok=True)
        entries = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))).capitalize() + "."
                   for _ in range(120)]
        entries.append(entries[0])  # an exact duplicate, to be removed
        (d / "sayings").write_text("\n%\n".join(entries) + "\n%\n", encoding="utf-8")
        (d / "sayings.dat").write_bytes(b"\x00\x01binary index")
        (d / "art").write_text("  /\\_/\\\n ( o.o )\n%\n", encoding="utf-8")
        sources.append(Source(f"fortunes-{lang}", lang, "fortune", f"fortunes-{lang}",
                              files=tuple(sorted(d.iterdir()))))
    lines = []
    for ch in range(1, 9):
        for v in range(1, 6):
            text = " ".join(f"<w savlm=\"strong:H{rng.randint(1, 9999):04d}\">{rng.choice(WORDS['en'])}</w>"
                            for _ in range(12))
            lines.append(f"Genesis {ch}:{v}: {text}. <milestone type=\"line\"/>")
    lines.append("(engKJV2006eb)")
    (root / "bible.osis").write_text("\n".join(lines) + "\n", encoding="utf-8")
    sources.append(Source("bible-fixture", "en", "bible", "sword-text-kjv", files=(root / "bible.osis",)))
    code = root / "lib"
    code.mkdir(exist_ok=True)
    for i in range(6):
        body = "\n".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(15))
        (code / f"mod{i}.py").write_text(body, encoding="utf-8")
    sources.append(Source("python-fixture", "code", "code", "libpython3-stdlib", files=tuple(sorted(code.iterdir()))))
    return sources


SETTINGS = CorpusSettings(arithmetic_train=300, arithmetic_easy_train=100, arithmetic_eval=20, chat_arithmetic=20, chat_fortunes=5,
                          eval_cap=100_000, seed=0)


@pytest.fixture(scope="session")
def corpus_settings() -> CorpusSettings:
    return SETTINGS


@pytest.fixture(scope="session")
def fixture_sources(tmp_path_factory) -> list[Source]:
    return write_fixture(tmp_path_factory.mktemp("fixture"))


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory, fixture_sources) -> Path:
    """A built corpus (splits, 400-token tokenizer, token files, manifest)."""
    from cinq.train.build import build_dataset
    out = tmp_path_factory.mktemp("corpus")
    build_dataset(fixture_sources, out, SETTINGS, vocab_size=400)
    return out


@pytest.fixture(scope="session")
def teacher(tiny_corpus, tmp_path_factory) -> Path:
    """A micro teacher trained on the tiny corpus (its run folder is the parent of the returned model folder)."""
    from cinq.train.pretrain import PretrainJob, pretrain
    out = tmp_path_factory.mktemp("teacher")
    summary = pretrain(PretrainJob(data_dir=str(tiny_corpus), out_dir=str(out), config="micro",
                                   token_budget=120 * 8 * 32, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=10,
                                   eval_every=50, progress=False))
    assert summary["finished"]
    return out / "model"


@pytest.fixture
def few_arithmetic_problems(monkeypatch) -> int:
    """Cap the arithmetic problems the training commands generate: a model card's evaluation and a task mix.

    ``cinq train --export`` evaluates the card on 300 corpus-level and 1,000 easy problems, and ``--task`` mixes in
    40,000 generated problems (no flag sets either count): decoding and tokenizing those were ~90% of the
    train/distill command tests' time. The cards and runs are the same with fewer problems; only the counts
    shrink. Returns the cap on evaluated problems."""
    from cinq.train import evaluate, pretrain
    cap, task_cap = 6, 300
    full_eval, full_task = evaluate.arithmetic_eval, pretrain.task_tokens

    def capped_eval(model_dir, n: int = 300, *args, **kwargs):
        return full_eval(model_dir, min(n, cap), *args, **kwargs)

    def capped_task(tokenizer, task: str, n_problems: int, *args, **kwargs):
        return full_task(tokenizer, task, min(n_problems, task_cap), *args, **kwargs)

    monkeypatch.setattr(evaluate, "arithmetic_eval", capped_eval)
    monkeypatch.setattr(pretrain, "task_tokens", capped_task)
    return cap
