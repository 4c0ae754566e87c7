"""Sampling flags shared by `cinq generate` and `cinq chat`."""

from __future__ import annotations

import argparse

from cinq.sampling_params import SamplingParams


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens to generate (default %(default)s)")
    g.add_argument("--min-tokens", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default %(default)s)")
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--sample-seed", type=int, default=None, help="per-request seed (reproducible samples)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("-n", type=int, default=1, help="completions per prompt")


def sampling_params_from_args(args: argparse.Namespace, **overrides: object) -> SamplingParams:
    values = dict(
        n=args.n, max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, seed=args.sample_seed,
        stop=args.stop, ignore_eos=args.ignore_eos)
    values.update(overrides)
    return SamplingParams(**values)  # type: ignore[arg-type]
