"""Tune's workload: a JSONL file or the built-in mixed workload; bad lines name the line."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer
from cinq.tune.workload_file import DEFAULT_MAX_TOKENS, read_workload


def test_jsonl_and_mixed(tiny_llama, tmp_path):
    tok = Tokenizer.from_pretrained(tiny_llama)
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "hello there", "max_tokens": 5}\n\n{"prompt_token_ids": [7, 8, 9]}\n')
    reqs = read_workload(str(path), tok)
    assert [r.output_len for r in reqs] == [5, DEFAULT_MAX_TOKENS]
    assert reqs[0].prompt == tok.encode("hello there", add_special_tokens=False) and reqs[1].prompt == [7, 8, 9]
    assert len(read_workload("mixed:4", tok)) == 4


@pytest.mark.parametrize("text, match", [('{"max_tokens": 3}\n', r"w.jsonl:1: give one of"),
                                         ('{"prompt": "a"}\n{"prompt": "b", "max_tokens": 0}\n', r"w.jsonl:2"),
                                         ("nope\n", r"not valid JSON"), ("\n", "holds no requests")])
def test_bad_workloads_name_the_line(tiny_llama, tmp_path, text, match):
    (tmp_path / "w.jsonl").write_text(text)
    with pytest.raises(InvalidParameterError, match=match) as e:
        read_workload(str(tmp_path / "w.jsonl"), Tokenizer.from_pretrained(tiny_llama))
    assert e.value.param == "workload"
