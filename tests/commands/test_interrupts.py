"""Ctrl-C in `cinq chat` (stops the reply, keeps the session) and `cinq generate` (prints what was generated,
exits 130), the chat's start-up help and /exit, and generate's progress bar. Ctrl-C is a real SIGINT sent to
this process from inside an engine step (or a subprocess, for generate as a user runs it)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time

import pytest

from cinq.cli import main
from cinq.engine.engine import LLMEngine
from cinq.engine.mp_engine import MPLLMEngine

OFFLINE_ENGINES = (LLMEngine, MPLLMEngine)  # the commands' engine, its core here or in its own process


@pytest.fixture
def sigint_at_step(monkeypatch):
    """``sigint_at_step(k)``: Ctrl-C arrives while the engine runs its k-th step (1-based); returns the engines
    and the prompts (token ids) they were sent."""
    engines: list[LLMEngine | MPLLMEngine] = []
    prompts: list[list[int]] = []

    def arm(k: int | None):
        calls = [0]
        for cls in OFFLINE_ENGINES:
            step, add = cls.step, cls.add_request

            def spy_step(self, step=step):
                calls[0] += 1
                if calls[0] == k:
                    signal.raise_signal(signal.SIGINT)
                return step(self)

            def spy_add(self, request_id, prompt, *args, add=add, **kwargs):
                engines.append(self)
                prompts.append(list(prompt) if not isinstance(prompt, str) else prompt)
                return add(self, request_id, prompt, *args, **kwargs)

            monkeypatch.setattr(cls, "step", spy_step)
            monkeypatch.setattr(cls, "add_request", spy_add)
        return engines, prompts

    return arm


class ScriptedStdin:
    """stdin that returns the given lines; ``KeyboardInterrupt`` in the list is raised (Ctrl-C at the prompt)."""

    def __init__(self, *items: object) -> None:
        self.items = list(items)

    def readline(self) -> str:
        if not self.items:
            return ""
        item = self.items.pop(0)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item  # type: ignore[return-value]

    def isatty(self) -> bool:
        return False


def chat(monkeypatch, model, stdin, *flags: str) -> int:
    monkeypatch.setattr("sys.stdin", stdin if not isinstance(stdin, str) else io.StringIO(stdin))
    return main(["chat", str(model), "--temperature", "0", "--ignore-eos", "--dtype", "float32", *flags])


def test_chat_says_how_to_quit_and_reset_and_exit_quits(tiny_llama, monkeypatch, capsys):
    rc = chat(monkeypatch, tiny_llama, "/exit\nhello\n")
    out, err = capsys.readouterr()
    assert rc == 0 and "assistant> " not in out  # quit before the second line
    assert "/exit or Ctrl-D quits" in err and "/reset clears the conversation" in err
    assert "Ctrl-C stops the current reply" in err


def test_ctrl_c_stops_the_reply_and_keeps_it_in_the_history(tiny_llama, monkeypatch, capsys, sigint_at_step):
    engines, prompts = sigint_at_step(4)  # prefill + 3 decodes of the first reply
    rc = chat(monkeypatch, tiny_llama, "hello\nagain\n/exit\n", "--max-tokens", "40")
    out, err = capsys.readouterr()
    assert rc == 0, err  # the session went on
    assert "reply stopped; it stays in the conversation as far as it got" in err
    first, second = out.split("assistant> ")[1:]
    partial = first.removesuffix("\n")
    tok = engines[0].tokenizer
    assert 0 < len(tok.encode(partial, add_special_tokens=False)) < 40
    assert len(tok.encode(second.removesuffix("\n"), add_special_tokens=False)) >= 30  # the next reply is whole
    history = tok.decode(prompts[1], skip_special_tokens=False)
    assert "<|user|>hello<|end|>" in history and partial in history and "again" in history
    stats = engines[0].get_stats()
    assert stats.finished_by_reason.get("abort") == 1 and stats.kv_cache_usage == 0  # aborted, blocks freed


def test_ctrl_c_before_the_first_token_drops_the_message(tiny_llama, monkeypatch, capsys, sigint_at_step):
    engines, prompts = sigint_at_step(None)
    sent = [0]
    for cls in OFFLINE_ENGINES:  # the spy: Ctrl-C right after the first message is queued
        def add_then_interrupt(self, *args, original=cls.add_request, **kwargs):
            original(self, *args, **kwargs)
            sent[0] += 1
            if sent[0] == 1:
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(cls, "add_request", add_then_interrupt)
    rc = chat(monkeypatch, tiny_llama, "hello\nagain\n", "--max-tokens", "8")
    _, err = capsys.readouterr()
    assert rc == 0, err
    assert "reply stopped before it began; your message was dropped" in err
    second = engines[0].tokenizer.decode(prompts[1], skip_special_tokens=False)
    assert "hello" not in second and "<|user|>again<|end|>" in second


def test_ctrl_c_at_the_prompt_reminds_then_quits(tiny_llama, monkeypatch, capsys):
    rc = chat(monkeypatch, tiny_llama, ScriptedStdin(KeyboardInterrupt, "hi\n", KeyboardInterrupt, "ok\n"),
              "--max-tokens", "4")
    out, err = capsys.readouterr()
    assert rc == 0 and out.count("assistant> ") == 2  # one Ctrl-C at a time: the session goes on
    assert err.count("Ctrl-C again quits") == 2
    rc = chat(monkeypatch, tiny_llama, ScriptedStdin("hi\n", KeyboardInterrupt, KeyboardInterrupt, "ok\n"),
              "--max-tokens", "4")
    out, _ = capsys.readouterr()
    assert rc == 130 and out.count("assistant> ") == 1  # two in a row quit


def test_generate_ctrl_c_prints_what_was_generated(tiny_llama, capsys, sigint_at_step):
    sigint_at_step(5)
    rc = main(["generate", str(tiny_llama), "-p", "abc", "-p", "xyz", "-n", "2", "--temperature", "0.5",
               "--max-tokens", "50", "--ignore-eos", "--json", "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert rc == 130
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["prompt"], r["index"]) for r in rows] == [("abc", 0), ("abc", 1), ("xyz", 0), ("xyz", 1)]
    assert all(r["finish_reason"] == "abort" and 0 < r["num_tokens"] < 50 and r["text"] for r in rows)
    assert "interrupted: 0 of 4 completion(s) finished" in err


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flags, bar", [(["-p", "a", "-p", "b", "-p", "c"], True),
                                        (["-p", "a", "-n", "2", "--temperature", "1"], True),
                                        (["-p", "a", "-p", "b", "-p", "c", "--no-progress"], False),
                                        (["-p", "a"], False)])
def test_generate_progress_bar_on_a_terminal(tiny_llama, monkeypatch, flags, bar):
    err = TTY()
    monkeypatch.setattr(sys, "stderr", err)
    rc = main(["generate", str(tiny_llama), *flags, "--max-tokens", "4", "--ignore-eos", "--dtype", "float32"])
    assert rc == 0
    text = err.getvalue()
    assert ("Processed prompts" in text or "Completions" in text) == bar
    if bar:
        total = 3 if "-n" not in flags else 2
        assert f"{total}/{total}" in text and "est. speed input:" in text


def test_generate_no_bar_when_stderr_is_not_a_terminal(tiny_llama, run_cli):
    r = run_cli("generate", str(tiny_llama), "-p", "a", "-p", "b", "--max-tokens", "4", "--dtype", "float32")
    assert not sys.stderr.isatty()  # captured, as a pipe or a file is
    assert r.returncode == 0 and "Processed prompts" not in r.stderr and r.stdout.count("\n") >= 2


def test_generate_sigint_from_outside(tiny_llama, tmp_path):
    """As a user presses Ctrl-C: SIGINT to the process mid-run; every prompt is printed, status 130."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(400)))
    proc = subprocess.Popen([sys.executable, "-m", "cinq.cli", "generate", str(tiny_llama), "--prompt-file",
                             str(prompts), "--max-tokens", "400", "--ignore-eos", "--json", "--dtype", "float32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the engine is built: the requests go in next
        if "loaded" in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 400 and any(r["finish_reason"] == "abort" for r in rows)
    assert "interrupted:" in err and "Traceback" not in err
