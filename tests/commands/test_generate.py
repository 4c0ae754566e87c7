"""`cinq generate` / `cinq chat` / `cinq init-model` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def cinq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cinq.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_init_model_then_generate_json(tmp_path, run_cli):
    out = tmp_path / "m"
    r = run_cli("init-model", str(out), "--hidden-size", "64", "--num-layers", "2", "--num-kv-heads", "2")
    assert r.returncode == 0, r.stderr
    r = cinq("generate", str(out), "-p", "abc", "-p", "xyz", "--max-tokens", "5", "--temperature", "0",
             "--ignore-eos", "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["abc", "xyz"] and all(row["num_tokens"] == 5 for row in rows)
    assert "KV cache" in r.stderr  # start-up report


def test_chat_streams_reply_and_quits_on_empty_line(tiny_llama, run_cli):
    r = run_cli("chat", str(tiny_llama), "--max-tokens", "4", "--temperature", "0", "--ignore-eos",
             stdin="hello\nagain\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("assistant> ") == 2


def test_generate_runs_the_core_in_its_own_process_and_stops_it(tiny_llama, run_cli, monkeypatch):
    """The offline front end's default placement: the core in a child process, gone when the command returns."""
    from cinq.engine.mp_engine import MPLLMEngine
    from cinq.engine.protocol import ENGINE_CORE_ENV
    monkeypatch.delenv(ENGINE_CORE_ENV, raising=False)  # the suite's conftest keeps the core in-process
    engines: list[MPLLMEngine] = []
    original = MPLLMEngine.__init__

    def spy(self, *args, **kwargs):
        engines.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(MPLLMEngine, "__init__", spy)
    r = run_cli("generate", str(tiny_llama), "-p", "abc", "--max-tokens", "3", "--temperature", "0", "--ignore-eos",
                "--json", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["num_tokens"] == 3
    assert len(engines) == 1 and engines[0].client.pid != os.getpid()
    assert not engines[0].client.proc.is_alive()  # shut down when the command ended: no orphan core


def test_bad_flag_value_is_one_clear_line(tiny_llama, run_cli):
    r = run_cli("generate", str(tiny_llama), "--temperature", "-1")
    assert r.returncode == 2 and "temperature must be in [0.0, 100.0]" in r.stderr
    assert "Traceback" not in r.stderr


def test_results_merge_deltas_and_count_tokens():
    from cinq.commands.generate import Results
    from cinq.outputs import CompletionOutput, RequestOutput

    def out(rid, *completions, prompt=(1, 2, 3)):
        return RequestOutput(rid, None, list(prompt), [CompletionOutput(*c) for c in completions], False)

    r = Results(["a", "b"], n=2)
    assert r.update(out("a", (0, "He", [5, 6]), (1, "Yo", [7]))) == 0
    assert r.update(out("a", (0, "llo", [8], None, None, "stop"))) == 1
    assert r.update(out("b", (1, "partial text", [9, 9, 9], None, None, "error")), replace=True) == 1
    assert [c.text for c in r.completions["a"]] == ["Hello", "Yo"] and r.completions["a"][0].token_ids == [5, 6, 8]
    assert r.num_tokens == 7 and r.num_prompt_tokens == 6  # prompts counted once per request
    assert r.num_finished == 2 and not r.all_finished
    r.abort_unfinished()
    assert [c.finish_reason for cs in r.completions.values() for c in cs] == ["stop", "abort", "abort", "error"]
    assert r.num_finished == 2 and r.all_finished  # aborted ones are done, not finished


def test_json_line_survives_splitlines():
    """Random byte-level text can hold NEL / U+2028 / U+2029: one record must stay one line for any reader."""
    from cinq.commands.generate import json_line

    row = {"text": "a\u0085b\u2028c\u2029d\x1de\nf ünï 中"}
    line = json_line(row)
    assert line.splitlines() == [line]
    assert json.loads(line) == row and "ünï 中" in line


def test_generate_with_tensor_parallel_size_2_matches_one_device(tiny_llama, run_cli):
    args = ("generate", str(tiny_llama), "-p", "abc", "-p", "hello there", "--max-tokens", "6", "--temperature", "0",
            "--ignore-eos", "--json", "--dtype", "float32")
    one = run_cli(*args)  # the reference in this process; TP = 2 as a user runs it (its workers are processes anyway)
    two = cinq(*args, "--tensor-parallel-size", "2")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    texts = [[json.loads(line)["text"] for line in r.stdout.splitlines()] for r in (one, two)]
    assert texts[0] == texts[1] and len(texts[1]) == 2


def test_structured_output_flags(tmp_path, run_cli):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    r = run_cli("generate", "cinq-tiny", "-p", "A number:", "--json-schema", str(tmp_path / "s.json"),
                "--temperature", "0", "--json", "--max-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert 1 <= json.loads(json.loads(r.stdout.splitlines()[0])["text"])["n"] <= 9
    r = run_cli("generate", "cinq-tiny", "-p", "Pick:", "--choice", "red", "--choice", "blue", "--json")
    assert json.loads(r.stdout.splitlines()[0])["text"] in ("red", "blue")
    r = run_cli("generate", "cinq-tiny", "-p", "x", "--regex", "(")
    assert r.returncode == 2 and "structured_outputs.regex" in r.stderr and "not closed" in r.stderr
    assert "Traceback" not in r.stderr and "/project" not in r.stderr
    r = run_cli("generate", "cinq-tiny", "-p", "x", "--regex", "a", "--choice", "b")
    assert r.returncode == 2 and "give only one of --regex, --choice" in r.stderr


def test_prompt_and_prompt_file_together_is_an_error(tmp_path, run_cli):
    (tmp_path / "p.txt").write_text("from the file\n")
    for path in (tmp_path / "p.txt", tmp_path / "missing.txt"):  # neither is dropped without a word
        r = run_cli("generate", "cinq-tiny", "-p", "hi", "--prompt-file", str(path))
        assert r.returncode == 2 and r.stderr == "cinq generate: error: give --prompt or --prompt-file, not both\n"


def test_an_unreadable_prompt_file_names_the_flag(tmp_path, run_cli):
    r = run_cli("generate", "cinq-tiny", "--prompt-file", str(tmp_path / "missing.txt"))
    assert r.returncode == 2
    assert r.stderr == (f"cinq generate: error: --prompt-file: cannot read {tmp_path / 'missing.txt'}: "
                        f"No such file or directory\n")


def test_prompt_file_lines_are_the_prompts(tmp_path, run_cli):
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    r = run_cli("generate", "cinq-tiny", "--prompt-file", str(tmp_path / "p.txt"), "--max-tokens", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["prompt"] for line in r.stdout.splitlines()] == ["one", "two"]


def test_structured_output_files_name_their_flag_once(tmp_path, run_cli):
    for flag in ("--json-schema", "--grammar"):
        r = run_cli("generate", "cinq-tiny", "-p", "x", flag, str(tmp_path / "nope"))
        assert r.returncode == 2
        assert r.stderr == (f"cinq generate: error: {flag}: cannot read {tmp_path / 'nope'}: No such file or "
                            f"directory\n")
    (tmp_path / "nj.json").write_text("{not json")
    r = run_cli("generate", "cinq-tiny", "-p", "x", "--json-schema", str(tmp_path / "nj.json"))
    assert r.returncode == 2
    assert r.stderr.startswith(f"cinq generate: error: --json-schema: {tmp_path / 'nj.json'} is not JSON (")
    assert r.stderr.count("--json-schema") == 1


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`cinq generate --json | head -1`: the reader is gone before the output is written; status 141 (128 +
    SIGPIPE, as `yes | head -1` under pipefail), no traceback."""
    p = subprocess.Popen([sys.executable, "-m", "cinq.cli", "generate", "cinq-tiny", "-p", "a", "-p", "b",
                          "--max-tokens", "2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # no reader left: the first write to stdout fails with EPIPE
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(run_cli, monkeypatch):
    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr("cinq.commands.generate.run", broken)
    with pytest.raises(BrokenPipeError):
        run_cli("generate", "-p", "hi")  # stdout here is pytest's capture, a live one
