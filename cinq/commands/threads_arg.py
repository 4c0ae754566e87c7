"""The ``--threads`` flag shared by the compute-heavy commands (quantize, eval, train, distill)."""

from __future__ import annotations

import argparse

from cinq.errors import InvalidParameterError


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--threads N`` (torch intra-op threads; default: torch's choice)."""
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's; on a CPU shared with other jobs, 1 avoids OpenMP stalls)")


def apply_threads(threads: int | None) -> None:
    """Set torch's thread count from ``--threads``; None leaves torch's default."""
    if threads is None:
        return
    if threads < 1:
        raise InvalidParameterError(f"--threads must be >= 1, got {threads}", "threads")
    import torch
    torch.set_num_threads(threads)
