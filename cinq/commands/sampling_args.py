"""Sampling flags shared by `cinq generate` and `cinq chat`.

A flag left out means "the model's default": the model's generation_config.json (``--generation-config auto``,
as vLLM), then SamplingParams' defaults; ``--max-tokens`` falls back to the command's own length instead."""

from __future__ import annotations

import argparse
from typing import Any

from cinq.model.generation_defaults import fill_defaults, read_sampling_defaults
from cinq.sampling_params import SamplingParams

_MODEL_DEFAULT = "default: the model's generation config, else %s"


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """Add the sampling flags; ``max_tokens``: the command's length when neither flag nor model gives one."""
    d = SamplingParams()
    g = p.add_argument_group("sampling (a flag left out: the model's generation config, then cinq's default)")
    g.add_argument("--max-tokens", type=int, default=None, help="tokens to generate (" + _MODEL_DEFAULT % max_tokens
                   + ")")
    g.add_argument("--min-tokens", type=int, default=None, help=f"tokens before eos may end ({_MODEL_DEFAULT % 0})")
    g.add_argument("--temperature", type=float, default=None, help=f"0 = greedy ({_MODEL_DEFAULT % d.temperature})")
    g.add_argument("--top-p", type=float, default=None, help=_MODEL_DEFAULT % d.top_p)
    g.add_argument("--top-k", type=int, default=None, help="0 = off (" + _MODEL_DEFAULT % "off" + ")")
    g.add_argument("--min-p", type=float, default=None, help=_MODEL_DEFAULT % d.min_p)
    g.add_argument("--repetition-penalty", type=float, default=None, help=_MODEL_DEFAULT % d.repetition_penalty)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--sample-seed", type=int, default=None, help="per-request seed (reproducible samples)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("-n", type=int, default=1, help="completions per prompt")
    p.set_defaults(fallback_max_tokens=max_tokens)


def sampling_params_from_args(args: argparse.Namespace, defaults: dict[str, Any] | None = None,
                              **overrides: object) -> SamplingParams:
    """SamplingParams from the flags; what they leave out comes from ``defaults`` (an engine's
    ``default_sampling_params``), read from the model's generation config when not given."""
    if defaults is None:
        defaults = model_sampling_defaults(args)
    given = dict(
        n=args.n, max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, seed=args.sample_seed,
        stop=args.stop, ignore_eos=args.ignore_eos)
    fallback = getattr(args, "fallback_max_tokens", None)
    values = fill_defaults(given, {**({"max_tokens": fallback} if fallback is not None else {}), **defaults})
    values.update(overrides)
    return SamplingParams(**values)  # type: ignore[arg-type]


def model_sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling defaults of the model the engine flags name (``--generation-config``), as the engine reads
    them (a bad model argument is the resolver's one-line error)."""
    from cinq.config import resolve_model
    source = getattr(args, "generation_config", "auto")
    return read_sampling_defaults(source, resolve_model(getattr(args, "model", None), "model"))
