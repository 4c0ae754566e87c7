"""`cinq <command>`: a thin dispatcher. Each command lives in ``cinq/commands/<name>.py`` and exposes
``add_parser(subparsers)`` (cheap: argparse only) and ``run(args) -> int`` (imports the heavy parts)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from cinq.process_env import set_omp_wait_policy

# command name -> module under cinq.commands
COMMANDS: dict[str, str] = {
    "generate": "generate",
    "chat": "chat",
    "serve": "serve",
    "quantize": "quantize",
    "eval": "eval",
    "data": "data",
    "train": "train",
    "distill": "distill",
    "init-model": "init_model",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cinq", description="cinq: cheap LLM inference and the models to serve.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(f"cinq.commands.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"cinq.commands.{module}":
                raise
            continue  # command not built yet
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``cinq <command>``; returns the exit status."""
    # First, before any command imports torch: OpenMP reads its wait policy once, and spinning threads collapse
    # on shared cores (measured 4-25x); see cinq/process_env.py.
    set_omp_wait_policy()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ValueError as e:  # cinq's input errors: one clear line, no traceback
        print(f"cinq {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
