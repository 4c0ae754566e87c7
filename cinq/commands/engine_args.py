"""Engine flags shared by every command that runs the engine (generate, chat, serve), derived from EngineConfig.

Each field of ``EngineConfig`` (but ``model``, the positional MODEL) becomes ``--field-name`` with the type of its
annotation, the dataclass's default and the help text kept next to the field (``metadata["help"]``); a field may
name its ``choices`` or a different ``flag`` spelling. A boolean that defaults to True is switched off by its flag
(``--no-prefix-caching``), one that defaults to False switched on."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing

from cinq.config import EngineConfig, resolve_model

_POSITIONAL = "model"


def add_engine_args(p: argparse.ArgumentParser, model_optional: bool = True) -> None:
    """Add MODEL (positional; default: the embedded model) and the EngineConfig flags."""
    model = next(f for f in dataclasses.fields(EngineConfig) if f.name == _POSITIONAL)
    p.add_argument(_POSITIONAL, nargs="?" if model_optional else None, default=None,
                   help=model.metadata["help"] + "; default: the embedded cinq-tiny")
    g = p.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    for f in _flag_fields():
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        kind = f.metadata.get("parse") or _scalar_type(hints[f.name])
        if kind is bool:
            g.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true",
                           help=f.metadata["help"])
            continue
        g.add_argument(flag, dest=f.name, type=kind, default=f.default, choices=f.metadata.get("choices"),
                       help=f.metadata["help"])


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags, MODEL resolved to its folder (none: the embedded default model; an
    embedded model's name: its folder; anything else: a one-line ModelLoadError naming "model")."""
    flags = {f.name: getattr(args, f.name) for f in _flag_fields()}
    return EngineConfig(model=resolve_model(args.model, "model"), **flags)


def engine_argv(config: EngineConfig) -> list[str]:
    """The command line that gives ``config`` back through these flags (the inverse of
    ``engine_config_from_args``): MODEL, then every field that differs from its default. Benchmarks start
    ``cinq serve`` with it."""
    argv = [config.model] if config.model else []
    for f in _flag_fields():
        value = getattr(config, f.name)
        if value == f.default:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):
            argv.append(flag)  # a boolean's flag flips its default
        elif dataclasses.is_dataclass(value):
            argv += [flag, json.dumps(dataclasses.asdict(value))]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def _flag_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name != _POSITIONAL]


def _scalar_type(hint: object) -> type:
    """``int`` for ``int`` and ``int | None``: what argparse converts the flag's text with."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if not isinstance(hint, type):
        raise TypeError(f"EngineConfig field type {hint!r} has no command-line form")
    return hint
