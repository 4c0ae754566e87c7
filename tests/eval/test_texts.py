"""Evaluation text files: plain text cut to length, .jsonl splits sampled across the file, clear errors."""

from __future__ import annotations

import json

import pytest

from cinq.errors import InvalidParameterError
from cinq.eval.texts import read_text


def test_plain_text_is_cut_and_jsonl_is_sampled_across_sources(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_text("abcdef")
    assert read_text(plain) == "abcdef" and read_text(plain, 3) == "abc"
    split = tmp_path / "test.jsonl"  # laid out source by source, as corpus splits are
    docs = [{"source": "en", "text": f"english {i}"} for i in range(50)] + \
        [{"source": "math", "text": f"math {i}"} for i in range(50)]
    split.write_text("".join(json.dumps(d) + "\n" for d in docs) + "\n")
    assert read_text(split) == "\n\n".join(d["text"] for d in docs)
    short = read_text(split, 200)
    assert len(short) <= 200 and "english 0" in short and "math" in short  # not just the first source


def test_errors_name_the_option(tmp_path):
    with pytest.raises(InvalidParameterError, match="--calib: .* is not a readable file") as e:
        read_text(tmp_path / "missing.txt", field="calib")
    assert e.value.param == "calib"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n[1, 2]\n')
    with pytest.raises(InvalidParameterError, match="line 2"):
        read_text(bad)
