"""JSON-object flags say what is wrong with the text (where the JSON breaks, or that it is not an object), after
the flag's name, instead of argparse's "invalid json_object value"."""

from __future__ import annotations

import argparse

import pytest

from cinq.commands.json_arg import json_object, json_object_or_null


def test_objects_parse():
    assert json_object('{"method": "ngram", "num_speculative_tokens": 2}') == {"method": "ngram",
                                                                              "num_speculative_tokens": 2}
    assert json_object_or_null('{"a": 1}') == {"a": 1} and json_object_or_null("null") is None


@pytest.mark.parametrize("text,said", [
    ("{method: ngram", "not a JSON object: Expecting property name enclosed in double quotes: line 1 column 2"),
    ('{"a": 1,\n "b": }', "not a JSON object: Expecting value: line 2 column 7"),
    ("[1,2]", "must be a JSON object"),
    ("3", "must be a JSON object"),
    ("null", "must be a JSON object"),
])
def test_bad_text_says_why(text, said):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        json_object(text)
    assert str(e.value).startswith(said)


def test_or_null_refuses_other_values():
    with pytest.raises(argparse.ArgumentTypeError, match="must be a JSON object or null"):
        json_object_or_null("[1]")


@pytest.mark.parametrize("argv,flag", [
    (["generate", "--speculative-config", "{method: ngram"], "--speculative-config"),
    (["serve", "--compilation-config", "{mode: 3}"], "--compilation-config"),
    (["tune", "--spec-extra", "{prompt_lookup_max: 3}"], "--spec-extra"),
    (["bench", "stack", "--stack-speculative-config", "{method: eagle"], "--stack-speculative-config"),
])
def test_the_flags_say_where_the_json_breaks(argv, flag, run_cli):
    r = run_cli(*argv)
    assert r.returncode == 2
    assert (f"error: argument {flag}: not a JSON object: Expecting property name enclosed in double quotes: "
            f"line 1 column 2") in r.stderr
    assert "invalid" not in r.stderr and "Traceback" not in r.stderr


def test_a_json_array_is_not_an_object(run_cli):
    r = run_cli("generate", "--speculative-config", "[1,2]")
    assert r.returncode == 2 and "argument --speculative-config: must be a JSON object" in r.stderr
