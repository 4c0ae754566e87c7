"""Engine flags shared by every command that runs the engine (generate, chat, serve), derived from EngineConfig.

Each field of ``EngineConfig`` (but ``model``, the positional MODEL) becomes ``--field-name`` with the type of its
annotation, the dataclass's default and the help text kept next to the field (``metadata["help"]``); a field may
name its ``choices`` or a different ``flag`` spelling. A boolean that defaults to True is switched off by its flag
(``--no-prefix-caching``), one that defaults to False switched on.

``--config FILE`` (as vLLM's) gives engine arguments as a JSON object (YAML too when PyYAML is installed) whose
keys are EngineConfig field names (``max_num_seqs``; the flag spelling ``max-num-seqs`` is accepted); flags given
on the command line win, and a relative ``model`` path is read from the file's folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing

from pathlib import Path
from typing import Any

from cinq.config import EngineConfig, json_object, resolve_model
from cinq.config_argv import POSITIONAL, flag_fields, flag_name
from cinq.errors import InvalidParameterError


def add_engine_args(p: argparse.ArgumentParser, model_optional: bool = True) -> None:
    """Add MODEL (positional; default: the embedded model) and the EngineConfig flags."""
    from cinq.commands import json_arg
    from cinq.commands.model_args import model_help
    p.add_argument(POSITIONAL, nargs="?" if model_optional else None, default=None, help=model_help())
    g = p.add_argument_group("engine")
    g.add_argument("--config", dest="engine_config_file", default=None, metavar="FILE",
                   help="engine arguments from a JSON (or, with PyYAML, YAML) file whose keys are these flags' "
                        "names (max_num_seqs, speculative_config, ...); flags given here win")
    hints = typing.get_type_hints(EngineConfig)
    for f in flag_fields():
        flag = flag_name(f)
        kind = f.metadata.get("parse") or _scalar_type(hints[f.name])
        if kind is json_object:  # config's raises ValueError: argparse would print its name, not the reason
            kind = json_arg.json_object
        if kind is bool:
            g.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true",
                           help=f.metadata["help"])
            continue
        g.add_argument(flag, dest=f.name, type=kind, default=f.default, choices=f.metadata.get("choices"),
                       help=f.metadata["help"])


def engine_config_from_args(args: argparse.Namespace, local_device: bool = True) -> EngineConfig:
    """EngineConfig from parsed flags, MODEL resolved to its folder (none: the embedded default model; an
    embedded model's name: its folder; anything else, a speculative head included: a one-line error naming
    "model"), and ``--device`` checked (``local_device``: that this machine has it; see ``check_device``)."""
    from cinq.commands.device_arg import check_device
    from cinq.commands.model_args import check_not_a_head
    flags = {f.name: getattr(args, f.name) for f in flag_fields()}
    model = args.model
    path = getattr(args, "engine_config_file", None)
    if path is not None:
        from_file = read_config_file(path)
        # A flag still at its default was not given (argparse cannot tell "given as the default" apart): the
        # file's value stands; any other value came from the command line and wins.
        defaults = {f.name: f.default for f in flag_fields()}
        for name, value in from_file.items():
            if name == POSITIONAL:
                model = model or value
            elif flags[name] == defaults[name]:
                flags[name] = value
    check_device(flags["device"], local=local_device)
    resolved = resolve_model(model, "model")
    check_not_a_head(resolved, model)
    return EngineConfig(model=resolved, **flags)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The engine arguments of a config file, by EngineConfig field name (``model`` included when given, a
    relative path made relative to the file's folder). A missing or unreadable file, a top level that is not a
    mapping, or a key that is not an engine argument: one-line InvalidParameterError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidParameterError(f"--config: cannot read {path}: {e.strerror}", "config") from None
    raw = _parse(text, path)
    if not isinstance(raw, dict):
        raise InvalidParameterError(f"--config {path}: the file must hold one object of engine arguments, got "
                                    f"{type(raw).__name__}", "config")
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name not in names:
            raise InvalidParameterError(f"--config {path}: unknown engine argument {key!r} (known: "
                                        f"{', '.join(sorted(names))})", str(key))
        _check_type(name, value, path)
        if name == POSITIONAL and isinstance(value, str) and value and not Path(value).is_absolute():
            local = path.parent / value
            value = str(local) if local.exists() else value  # else an embedded model's name
        out[name] = value
    return out


def _check_type(name: str, value: Any, path: Path) -> None:
    """A config file's value must have its field's type (an int passes for a float; null for an optional one);
    fields parsed from text on the command line (speculative_config) take a JSON object."""
    field = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
    if value is None or field.metadata.get("parse"):
        return
    kind = _scalar_type(typing.get_type_hints(EngineConfig)[name])
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise InvalidParameterError(f"--config {path}: {name} must be {kind.__name__}, got {value!r}", name)


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InvalidParameterError(f"--config {path}: YAML needs PyYAML (pip install pyyaml); or give JSON",
                                        "config") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidParameterError(f"--config {path}: not valid YAML: {str(e).splitlines()[0]}",
                                        "config") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidParameterError(f"--config {path}: not valid JSON: {e.msg} at line {e.lineno}",
                                    "config") from None


def _scalar_type(hint: object) -> type:
    """``int`` for ``int`` and ``int | None``: what argparse converts the flag's text with."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if not isinstance(hint, type):
        raise TypeError(f"EngineConfig field type {hint!r} has no command-line form")
    return hint
