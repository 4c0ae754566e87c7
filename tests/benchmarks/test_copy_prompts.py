"""The copy workload: requests over real standard-library functions, about names those functions use, seeded,
rendered through a chat template within the prompt limit."""

from __future__ import annotations

import pytest

from benchmarks.copy_prompts import KINDS, copy_prompts, copy_requests, stdlib_functions
from cinq.errors import InvalidParameterError


class _Template:
    """A tokenizer stand-in: one token per character, the message inside a fixed turn."""

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        return f"<user>{messages[0]['content']}</user><assistant>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_functions_are_real_and_the_name_is_used_twice() -> None:
    funcs = stdlib_functions()
    assert len(funcs) >= 20
    for source, name in funcs:
        assert source.startswith("def ")
        assert source.count(name) >= 2
        compile(source, "<stdlib>", "exec")  # dedented methods still parse


def test_requests_alternate_kinds_are_seeded_and_quote_the_code() -> None:
    reqs = copy_requests(6, seed=1)
    assert [r.kind for r in reqs] == [KINDS[i % 2] for i in range(6)]
    assert [r.source for r in reqs] == [r.source for r in copy_requests(6, seed=1)]
    assert [r.source for r in reqs] != [r.source for r in copy_requests(6, seed=2)]
    for r in reqs:
        assert r.source in r.message() and f"`{r.name}`" in r.message()


def test_prompts_fit_the_limit_and_a_too_small_limit_names_the_field() -> None:
    prompts = copy_prompts(_Template(), 4, max_prompt=2000)
    assert len(prompts) == 4 and all(len(ids) <= 2000 for _, ids in prompts)
    with pytest.raises(InvalidParameterError, match="max_prompt") as err:
        copy_prompts(_Template(), 4, max_prompt=50)
    assert err.value.param == "max_prompt"
