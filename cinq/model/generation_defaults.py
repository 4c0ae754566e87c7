"""Default sampling parameters from a model's ``generation_config.json``, and the generation config cinq writes.

As vLLM does with ``generation_config="auto"``: when a user gives no sampling parameters (or omits some), the
model creator's recommendation in ``generation_config.json`` fills them (temperature, top_p, top_k, min_p,
repetition_penalty; max_new_tokens -> max_tokens, and, beyond vLLM, min_new_tokens -> min_tokens); then
``SamplingParams``' own defaults. ``"vllm"`` (or ``"cinq"``) ignores the file; a folder path reads that folder's.
The eos ids of the file are not sampling defaults: the model always stops on them (cinq/model/config.py).

Models that cinq writes with its own tokenizer get ``cinq_generation_config``: the chat template's turn markers
as eos ids (a reply ends where the model would open the next turn) and cinq's sampling defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.model.folder_files import exists, read_json
from cinq.sampling_params import SamplingParams

# EngineConfig.generation_config values: read the model folder's file, or ignore every file (vLLM's "vllm").
AUTO = "auto"
IGNORE = ("vllm", "cinq")

# generation_config.json key -> SamplingParams field (vLLM's ModelConfig.get_diff_sampling_param, + min_new_tokens)
SAMPLING_KEYS: dict[str, str] = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
}

_DEFAULT_MAX_TOKENS: int = SamplingParams.__dataclass_fields__["max_tokens"].default  # 16, as vLLM's

# The chat template's turn markers (cinq/model/byte_tokenizer.py): each of them ends an assistant reply.
TURN_MARKERS = ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>")

# cinq's sampling defaults for the chat-capable models it trains, chosen on cinq-tiny and cinq-tiny-student with
# `cinq generate -p "Once upon a time"`: 0.7 / 0.9 keep the words mostly real where 0.8 / 0.95 drifts into
# arithmetic and IRC noise; 1.1 stops the bible passages looping; 24 tokens at least, because the teacher ends a
# fortune after "." two tokens in, and 96 at most lets a few lines through without rambling on.
CINQ_SAMPLING_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1, "min_new_tokens": 24, "max_new_tokens": 96,
}


def read_sampling_defaults(generation_config: str, model: str | Path) -> dict[str, Any]:
    """The SamplingParams fields (vLLM names) that ``generation_config`` recommends for ``model``: ``"auto"`` reads
    the model folder's ``generation_config.json`` (none there: {}), ``"vllm"``/``"cinq"`` ignores it ({}), any
    other value is a folder that must hold one. A bad value is a ModelLoadError naming the file and the key."""
    if generation_config in IGNORE:
        return {}
    if generation_config == AUTO:
        file, named = _auto_source(Path(model))
        if named is not None:
            return sampling_defaults_from_dict(named.generation_config, sampling_defaults_source(generation_config,
                                                                                                 model))
        return sampling_defaults_from_dict(read_json(file), str(file)) if exists(file) else {}
    file = Path(generation_config) / "generation_config.json"
    if not exists(file):
        raise ModelLoadError(f"generation_config: {generation_config!r} is none of 'auto', 'vllm' and a folder "
                             f"holding a generation_config.json", "generation_config")
    return sampling_defaults_from_dict(read_json(file), str(file))


def _auto_source(model: Path) -> tuple[Path, Any]:
    """(the generation_config.json "auto" reads, the named real model whose defaults apply instead, or None). A GGUF
    file has no such file inside: one beside it is read, else cinq's defaults for a named real model's file."""
    if not model.is_file():
        return model / "generation_config.json", None
    from cinq.real_models import real_model_for_file
    file = model.parent / "generation_config.json"
    return file, None if exists(file) else real_model_for_file(model)


def sampling_defaults_source(generation_config: str, model: str | Path) -> str:
    """Where ``read_sampling_defaults`` took its values from, for the load line."""
    if generation_config in IGNORE:
        return "none (--generation-config vllm)"
    if generation_config != AUTO:
        return str(Path(generation_config) / "generation_config.json")
    file, named = _auto_source(Path(model))
    if named is not None:
        return f"cinq's defaults for {named.name} ({named.why_defaults})"
    return f"the model's {file.name}"


def sampling_defaults_from_dict(gen: Mapping[str, Any], source: str = "generation_config.json") -> dict[str, Any]:
    """The sampling keys of a parsed generation config as SamplingParams fields (null values are absent),
    validated by SamplingParams itself so the limits are the ones every request meets."""
    values = {field: gen[key] for key, field in SAMPLING_KEYS.items() if gen.get(key) is not None}
    try:
        SamplingParams(**{"max_tokens": None, **values})
    except InvalidParameterError as e:
        key = next((k for k, f in SAMPLING_KEYS.items() if f == e.param), e.param)
        raise ModelLoadError(f"{source}: '{key}': {e}", "generation_config") from None
    except TypeError as e:  # an unhashable or otherwise odd value that the checks above did not expect
        raise ModelLoadError(f"{source}: sampling fields: {e}", "generation_config") from None
    return values


def fill_defaults(given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments: the ``given`` values (None = not given) over ``defaults``; what neither
    holds is left out (SamplingParams' own default). A default min_tokens is lowered to a given max_tokens, so
    that asking for fewer tokens than the model's minimum is not an error; with no max_tokens anywhere, it
    raises SamplingParams' default max_tokens instead."""
    out = {k: v for k, v in defaults.items() if given.get(k) is None}
    out.update({k: v for k, v in given.items() if v is not None})
    if given.get("min_tokens") is None and given.get("max_tokens") is not None and "min_tokens" in out:
        out["min_tokens"] = min(out["min_tokens"], given["max_tokens"])
    if "max_tokens" not in out and out.get("min_tokens", 0) > _DEFAULT_MAX_TOKENS:
        out["max_tokens"] = out["min_tokens"]
    return out


def turn_marker_ids(token_to_id: Callable[[str], int | None]) -> list[int]:
    """The ids of the chat template's turn markers that a tokenizer has (``token_to_id``: its lookup)."""
    ids = [token_to_id(m) for m in TURN_MARKERS]
    return [i for i in ids if i is not None]


def cinq_generation_config(bos_token_id: int | None, eos_token_ids: list[int],
                           turn_markers: list[int]) -> dict[str, Any]:
    """generation_config.json for a model cinq writes: its bos and eos ids, and, when its tokenizer has the chat
    template's turn markers (cinq's chat-capable models), those as eos ids too and cinq's sampling defaults."""
    gen: dict[str, Any] = {"bos_token_id": bos_token_id, "eos_token_id": list(dict.fromkeys(eos_token_ids))}
    if turn_markers:
        gen["eos_token_id"] = list(dict.fromkeys(eos_token_ids + turn_markers))
        # do_sample: transformers samples only with it (vLLM and cinq read the values and ignore the flag)
        gen.update({"do_sample": True, **CINQ_SAMPLING_DEFAULTS})
    return gen
