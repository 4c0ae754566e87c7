"""The shipped calibration / held-out texts: there, small, multilingual, disjoint, named by the resolver, and the
README's `--calib` / `--ppl` examples point at them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cinq.assets.text import TEXT_DIR, embedded_text_names, resolve_text_path
from cinq.assets.text.build import SEPARATOR, sample_split

ROOT = Path(__file__).resolve().parents[2]


def test_names_resolve_to_the_shipped_files_and_a_real_file_wins(tmp_path, monkeypatch):
    assert embedded_text_names() == ["calibration", "held-out"]
    assert resolve_text_path("calibration") == TEXT_DIR / "calibration.txt"
    assert resolve_text_path("held-out") == resolve_text_path("held_out") == TEXT_DIR / "held_out.txt"
    assert all(resolve_text_path(n).is_file() for n in embedded_text_names())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calibration").write_text("mine")
    assert resolve_text_path("calibration") == Path("calibration")  # the user's own file
    assert resolve_text_path("nope.txt") == Path("nope.txt")  # left for the caller to report


def test_texts_are_small_multilingual_and_disjoint():
    calib = (TEXT_DIR / "calibration.txt").read_text(encoding="utf-8")
    held = (TEXT_DIR / "held_out.txt").read_text(encoding="utf-8")
    total = sum(f.stat().st_size for f in TEXT_DIR.iterdir() if f.is_file())
    assert total < 150_000
    for text in (calib, held):
        assert 50_000 < len(text.encode()) <= 64 * 1024 + 1
        assert re.search(r"[а-яА-Я]", text) and re.search(r"[\u4e00-\u9fff]", text)  # Russian, Chinese
        assert re.search(r"[äöüß]", text) and re.search(r"[ąęłśż]", text) and re.search(r"\d+ [+*-] \d+", text)
        # interleaved: the last 10% (quantize's held-out cut) is a mix too, not one language
        tail = text[int(len(text) * 0.9):]
        assert re.search(r"[а-яА-Я]", tail) and re.search(r"[a-z]{4}", tail)
    def records(text: str) -> set[str]:  # paragraphs, but for attributions ("-- Author") that recur
        return {r for r in text.split(SEPARATOR) if len(r) > 40 and not r.strip().startswith("--")}

    assert not records(calib) & records(held)  # different splits: no text in both


def test_readme_examples_point_at_files_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paths = re.findall(r"--(?:calib|ppl) (\S+)", readme)
    from cinq.assets.text import resolve_text_path
    # Each is a file of the repo or the name of a shipped text.
    assert paths and all((ROOT / p).is_file() or resolve_text_path(p).is_file() for p in paths), paths
    assert "cinq/assets/text/calibration.txt" in paths and "cinq/assets/text/held_out.txt" in paths


def test_sample_split_takes_proportional_shares_and_interleaves(tmp_path):
    rows = [{"source": "a", "text": f"a{i:03d}" + "x" * 96} for i in range(30)]  # 100 bytes each
    rows += [{"source": "b", "text": f"b{i:03d}" + "y" * 96} for i in range(10)]
    rows.append({"source": "c", "text": "line one\nline two\n" + "z" * 500})  # larger than its whole share
    split = tmp_path / "split.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text, taken = sample_split(split, budget=1200)
    records = text.rstrip("\n").split(SEPARATOR)
    # of 4518 bytes a has 3000: a share of 797 = 7 records of 102 (with the separator); b 265: 2; c 137: the
    # whole lines of its one record that fit
    assert [r[:4] for r in records[:6]] == ["a000", "b000", "line", "a001", "b001", "a002"]
    assert sum(r.startswith("a") for r in records) == 7 and sum(r.startswith("b") for r in records) == 2
    assert "line one\nline two" in records and taken["c"] == len("line one\nline two")
