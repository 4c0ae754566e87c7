import hashlib
import json

from cinq.train.build import build_dataset
from cinq.train.corpus import build_corpus, read_split, split_of
from cinq.train.sources import Source, install_hint, parse_diatheke, parse_fortunes, required_packages


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_same_inputs_give_the_same_corpus_bytes(tmp_path, fixture_sources, corpus_settings):
    a = build_dataset(fixture_sources, tmp_path / "a", corpus_settings, vocab_size=400)
    b = build_dataset(fixture_sources, tmp_path / "b", corpus_settings, vocab_size=400)
    assert a == b
    da, db = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert da == db and {"train.jsonl", "test.jsonl", "train.tokens.npy", "manifest.json"} <= set(da)
    assert _digest(tmp_path / "a" / "tokenizer") == _digest(tmp_path / "b" / "tokenizer")


def test_dedup_split_by_document_and_manifest(tiny_corpus):
    docs = {s: read_split(tiny_corpus / f"{s}.jsonl") for s in ("train", "validation", "test")}
    texts = {s: [d.text for d in ds] for s, ds in docs.items()}
    all_texts = [t for ts in texts.values() for t in ts]
    assert len(all_texts) == len(set(all_texts))  # the duplicated fortune is kept once
    for s in ("train", "validation", "test"):  # corpus documents sit in the split their hash chose
        assert all(split_of(d.text) == s for d in docs[s] if d.source.startswith(("fortunes", "bible", "python")))
    assert not any("o.o" in t for t in all_texts)  # ascii-art files are skipped
    assert {d.lang for d in docs["train"]} >= {"en", "de", "ru", "code", "math", "chat"}
    m = json.loads((tiny_corpus / "manifest.json").read_text())
    assert m["sources"]["fortunes-en"]["duplicates_removed"] == 1
    for lang, e in m["languages"].items():
        assert e["bytes"]["train"] == sum(len(d.text.encode()) for d in docs["train"] if d.lang == lang)
        assert e["tokens"]["train"] > 0
    assert m["tokenizer"]["vocab_size"] == 400
    assert m["sha256"]["train"] == hashlib.sha256((tiny_corpus / "train.jsonl").read_bytes()).hexdigest()


def test_train_cap_bounds_a_source(tmp_path, fixture_sources, corpus_settings):
    capped = [Source(s.name, s.lang, s.kind, s.package, train_cap=500 if s.lang == "ru" else None, files=s.files)
              for s in fixture_sources]
    m = build_corpus(capped, tmp_path, corpus_settings)
    assert 0 < m["sources"]["fortunes-ru"]["bytes"]["train"] <= 500
    assert m["sources"]["fortunes-de"]["bytes"]["train"] > 2000


def test_parse_fortunes_strips_colour_codes_and_blank_entries():
    raw = "\x1b[32mfirst\x1b[m line\nsecond line\n%\n\n%\nthird\n%\n"
    assert parse_fortunes(raw) == ["first line\nsecond line", "third"]


def test_parse_diatheke_strips_markup_headings_and_glued_words():
    raw = ("Psalms 1:1: <w savlm=\"strong:H0835\">Blessed</w> <w>is</w> <w>the</w> <w>man</w>. "
           "<milestone type=\"line\"/>\n"
           "A psalm heading.  Psalms 1:2: <w>But</w> <w>his</w><w>delight</w> <note>a note</note>"
           "<title>Title</title>is here.\n"
           "(engWEB2015eb)\n")
    assert parse_diatheke(raw) == [("Psalms 1", "Blessed is the man.\nBut his delight is here.")]


def test_required_packages_and_hint():
    srcs = [Source("b", "en", "bible", "sword-text-kjv", module="KJV"), Source("f", "de", "fortune", "fortunes-de")]
    assert required_packages(srcs) == ["sword-text-kjv", "fortunes-de", "diatheke"]
    assert install_hint(["fortunes-de"]).endswith("install -y --no-install-recommends fortunes-de")
