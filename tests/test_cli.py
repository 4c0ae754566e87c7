"""`cinq` itself: --version, and bad flags answered by the command they belong to in two short lines."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from cinq.cli import main

ROOT = Path(__file__).resolve().parents[1]


def errors(capsys, *argv: str) -> list[str]:
    """The stderr lines of a `cinq ARGV` that argparse refuses (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_version_is_the_package_metadata_and_pyproject(capsys):
    import tomllib
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"cinq {version('cinq')}\n" == f"cinq {pyproject}\n"


def test_version_from_the_command_line():
    r = subprocess.run([sys.executable, "-m", "cinq.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("cinq ") and r.stderr == ""


def test_bad_flag_value_is_the_commands_two_line_error(capsys):
    assert errors(capsys, "generate", "--max-tokens", "abc") == [
        "usage: cinq generate [-h] [options] [model]",
        "cinq generate: error: argument --max-tokens: invalid int value: 'abc'"]
    assert errors(capsys, "serve", "--port", "x")[1] == "cinq serve: error: argument --port: invalid int value: 'x'"


def test_unknown_flag_is_blamed_on_its_command_not_on_cinq(capsys):
    assert errors(capsys, "generate", "--bogus") == ["usage: cinq generate [-h] [options] [model]",
                                                     "cinq generate: error: unrecognized arguments: --bogus"]
    assert errors(capsys, "chat", "m", "extra")[1] == "cinq chat: error: unrecognized arguments: extra"
    nested = errors(capsys, "data", "build", "--out", "x", "--bogus")
    assert nested[1] == "cinq data build: error: unrecognized arguments: --bogus"


def test_top_level_errors_stay_top_level(capsys):
    lines = errors(capsys, "bogus")
    assert lines[0].startswith("usage: cinq [-h]") and lines[1].startswith("cinq: error: argument COMMAND")
    assert errors(capsys, "--log-level", "LOUD")[1].startswith("cinq: error: argument --log-level")


def test_help_still_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--max-tokens" in out and "--no-progress" in out and "--kv-cache-memory" in out
