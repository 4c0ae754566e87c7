"""`cinq distill` (cinq/commands/distill.py): what a head's card gives as the commands that reproduce its data."""

from __future__ import annotations

import json
from pathlib import Path

from cinq.commands.distill import head_data_commands


def test_chat_prompts_need_only_the_setup_that_installs_the_target(tmp_path: Path) -> None:
    # the chat source has no corpus folder: reading its manifest failed the export of a finished 37-minute run
    assert head_data_commands("chat", str(tmp_path)) == ["bash scripts/setup.sh"]


def test_a_corpus_gives_its_build_command_and_the_shipped_targets_own(tmp_path: Path) -> None:
    corpus, target = tmp_path / "corpus", tmp_path / "target"
    corpus.mkdir()
    target.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"settings": {}, "tokenizer": {"vocab_size": 8192}}))
    commands = head_data_commands(str(corpus), str(target))
    assert len(commands) == 1 and commands[0].startswith(f"cinq data build --out {corpus} --install")
    (target / "training.json").write_text(json.dumps({"commands": ["cinq data build ...", "cinq train ..."]}))
    assert head_data_commands(str(corpus), str(target))[1:] == ["cinq train ..."]
