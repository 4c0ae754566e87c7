"""An EngineConfig written back as engine arguments: the command line (``engine_argv``) and the ``--config``
file's object (``config_file_dict``) that give it back through ``cinq.commands.engine_args``.

It sits just above ``config`` so the tools that start engines (``bench.serve``, ``tune``) reach it without
importing the command layer above them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cinq.config import EngineConfig

POSITIONAL = "model"


def flag_fields() -> list[dataclasses.Field]:
    """EngineConfig's fields that are flags (all but the positional MODEL)."""
    return [f for f in dataclasses.fields(EngineConfig) if f.name != POSITIONAL]


def flag_name(f: dataclasses.Field) -> str:
    """A field's flag: its ``metadata["flag"]`` spelling, else ``--field-name``."""
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def config_file_dict(config: EngineConfig) -> dict[str, Any]:
    """The engine arguments of ``config`` that differ from their defaults, as ``--config`` reads them back
    (``model`` first)."""
    out: dict[str, Any] = {POSITIONAL: config.model} if config.model else {}
    for f in flag_fields():
        value = getattr(config, f.name)
        if value != f.default:
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def engine_argv(config: EngineConfig) -> list[str]:
    """The command line that gives ``config`` back through the engine flags (the inverse of
    ``engine_config_from_args``): MODEL, then every field that differs from its default. Benchmarks start
    ``cinq serve`` with it."""
    argv = [config.model] if config.model else []
    for f in flag_fields():
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = flag_name(f)
        if isinstance(value, bool):
            argv.append(flag)  # a boolean's flag flips its default
        elif dataclasses.is_dataclass(value):
            argv += [flag, json.dumps(dataclasses.asdict(value))]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv
