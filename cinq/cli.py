"""`cinq <command>`: a thin dispatcher. Each command lives in ``cinq/commands/<name>.py`` and exposes
``add_parser(subparsers)`` (cheap: argparse only) and ``run(args) -> int`` (imports the heavy parts)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

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
    "plan": "plan",
    "bench": "bench",
    "export": "export",
    "tune": "tune",
}


class CinqArgumentParser(argparse.ArgumentParser):
    """argparse with short errors: a bad flag is answered by the command it belongs to, in two lines (a one-line
    usage and the message), not the top-level usage or a screenful of every flag. Subcommand parsers are of this
    class too (``add_subparsers`` builds them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"usage: {self.short_usage()}\n{self.prog}: error: {message}\n")

    def short_usage(self) -> str:
        """``cinq generate [-h] [options] [model]``: the positionals spelled out, the flags left to ``--help``."""
        fmt = self._get_formatter()
        fmt.add_usage(None, self._get_positional_actions(), [], prefix="")
        positionals = fmt.format_help().strip()[len(self.prog):]
        has_flags = any(a.option_strings and not isinstance(a, argparse._HelpAction) for a in self._actions)
        return f"{self.prog} [-h]{' [options]' if has_flags else ''}{positionals}"

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's parser is run with parse_known_args, and what it does not know is handed up to the top
        # parser, which would blame "cinq" for "cinq generate --bogus": say it here, from the command itself.
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


class _VersionAction(argparse.Action):
    """``--version``: ``cinq <version>`` from the installed package's metadata, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print cinq's version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        print(f"cinq {version()}")  # on stdout, as argparse's own "version" action does
        parser.exit(0)


def version() -> str:
    """The installed distribution's version (pyproject's), or ``cinq.__version__`` when run from a bare source
    tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version
    try:
        return dist_version("cinq")
    except PackageNotFoundError:
        from cinq import __version__
        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = CinqArgumentParser(prog="cinq", description="cinq: cheap LLM inference and the models to serve.")
    parser.add_argument("--version", action=_VersionAction)
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
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is a BrokenPipeError this handler sees
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a pipe of the command's own (a worker's, a socket's): not the reader going away
        return _reader_gone()
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        # cinq's input errors (CinqError is a ValueError) and files named on the command line that cannot be
        # read: one clear line, no traceback
        print(f"cinq {args.command}: error: {e}", file=sys.stderr)
        return 2


# 128 + SIGPIPE: the status of a tool that a closed pipe stops (`yes | head -1` under `set -o pipefail`), so a
# script can still tell that not all of the output was read; the shell prints nothing for it.
EXIT_READER_GONE = 141


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has closed it (``cinq generate --json | head -1``)."""
    import select
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False  # no file behind stdout (captured, embedded): the broken pipe was another one
    if not hasattr(select, "poll"):
        return True  # no way to ask: the reader of stdout is by far the likeliest pipe to break
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # the write end of a pipe without readers polls as POLLERR (what makes a write raise EPIPE)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _reader_gone() -> int:
    """Exit quietly when the reader of stdout went away, as the Python docs recommend (library/signal.html, "Note
    on SIGPIPE"): stdout pointed at /dev/null, so the interpreter's flush at exit of what is still buffered
    raises nothing more; no traceback, and EXIT_READER_GONE."""
    import os
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_GONE


if __name__ == "__main__":
    sys.exit(main())
