"""`cinq chat` outlives its context: the oldest turns are dropped (system prompt kept), the reply clamped, and a
message too long for the context is refused while the session goes on. Driven through ``cinq.cli.main`` with
a scripted stdin on a tiny model with a 64-token context."""

from __future__ import annotations

import io

import pytest

from cinq.cli import main
from cinq.commands.chat import ChatHistory
from cinq.engine.engine import LLMEngine
from cinq.engine.mp_engine import MPLLMEngine

CONTEXT = 64


@pytest.fixture
def requests(monkeypatch):
    """Every request the chat sends: (prompt ids, max_tokens, min_tokens), and the engine that got it."""
    sent: list[tuple[list[int], int, int]] = []
    engines: list[LLMEngine | MPLLMEngine] = []
    for cls in (LLMEngine, MPLLMEngine):  # the chat's engine, its core here or in its own process
        def spy(self, request_id, prompt, params=None, *args, original=cls.add_request, **kwargs):
            engines.append(self)
            sent.append((list(prompt), params.max_tokens, params.min_tokens))
            return original(self, request_id, prompt, params, *args, **kwargs)

        monkeypatch.setattr(cls, "add_request", spy)
    return sent, engines


def chat(monkeypatch, model, stdin: str, *flags: str) -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["chat", str(model), "--max-model-len", str(CONTEXT), "--temperature", "0", "--ignore-eos",
                 "--dtype", "float32", *flags])


def decoded(engines, prompt: list[int]) -> str:
    return engines[0].tokenizer.decode(prompt, skip_special_tokens=False)


def test_history_past_the_context_drops_oldest_turns_and_keeps_the_system_prompt(tiny_llama, monkeypatch,
                                                                               capsys, requests):
    sent, engines = requests
    lines = [f"hello there {i}" for i in range(1, 7)]
    rc = chat(monkeypatch, tiny_llama, "\n".join(lines) + "\n\n", "--max-tokens", "16", "--system", "be brief")
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("assistant> ") == 6  # every turn answered: the session did not end at the limit
    assert "maximum context length" not in err
    assert "dropped the 1 oldest turn(s), kept the system prompt" in err
    assert len(sent) == 6
    for i, (prompt, max_tokens, _) in enumerate(sent):
        assert max_tokens == 16 and len(prompt) + max_tokens <= CONTEXT
        text = decoded(engines, prompt)
        assert text.startswith("<|bos|><|system|>be brief<|end|>") and lines[i] in text
    assert lines[0] not in decoded(engines, sent[-1][0])  # the oldest turns really left the prompt


def test_reply_is_clamped_to_what_fits(tiny_llama, monkeypatch, capsys, requests):
    sent, _ = requests
    rc = chat(monkeypatch, tiny_llama, "hi\nagain\n\n", "--max-tokens", "60", "--min-tokens", "60")
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("assistant> ") == 2
    first_prompt, first_max, first_min = sent[0]
    assert first_max == CONTEXT - len(first_prompt) < 60 and first_min == first_max
    assert f"reply limited to {first_max} tokens (--max-tokens 60)" in err
    assert all(len(p) + m == CONTEXT for p, m, _ in sent)  # each reply gets all the room there is
    assert "dropped the 1 oldest turn(s)" in err  # the first exchange filled the context


def test_message_longer_than_the_context_is_refused_and_the_session_goes_on(tiny_llama, monkeypatch, capsys,
                                                                           requests):
    sent, engines = requests
    long = "x" * 100
    rc = chat(monkeypatch, tiny_llama, f"hi\n{long}\nok\n\n", "--max-tokens", "4")
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("assistant> ") == 2 and len(sent) == 2
    assert "message not sent: it takes 104 tokens with the chat template, and the context holds 64" in err
    last = decoded(engines, sent[1][0])
    assert "<|user|>hi<|end|>" in last and "ok" in last and long not in last  # history kept, long one gone


def test_fit_drops_whole_turns_oldest_first():
    def encode(messages):  # one token per character of content
        return [0] * sum(len(m["content"]) for m in messages)

    h = ChatHistory("S" * 5, [{"role": "user", "content": "a" * 10}, {"role": "assistant", "content": "b" * 10},
                              {"role": "user", "content": "c" * 10}, {"role": "assistant", "content": "d" * 10},
                              {"role": "user", "content": "e" * 10}])
    fitted = h.fit(encode, capacity=40, max_tokens=10)
    # 5 + 50 = 55 > 30: drop a+b (35 > 30), then c+d: 15 tokens leave room for the 10-token reply.
    assert fitted.dropped_turns == 2 and fitted.max_tokens == 10 and not fitted.clamped
    assert [m["content"][0] for m in h.messages] == ["S", "e"]
    too_long = ChatHistory(None, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": "z" * 40}])
    fitted = too_long.fit(encode, capacity=40, max_tokens=10)
    assert fitted.too_long and len(too_long.turns) == 3  # refused, the history untouched
