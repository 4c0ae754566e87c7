"""``--device``: checked in the command layer before any engine process starts, so a device this machine cannot
run on is one line naming the flag (exit 2), not a traceback from inside the engine core.

EngineConfig takes any string for ``device`` (cinq/config.py checks only what depends on other fields); the engine
core is the first to hand it to torch, in its own process, where the error arrives as a wrapped RuntimeError."""

from __future__ import annotations

from cinq.errors import InvalidParameterError

# The device types cinq's engine runs on (its kernels, executors and memory accounting know no other).
ENGINE_DEVICE_TYPES = ("cpu", "cuda")


def check_device(device: str, local: bool = True) -> None:
    """Refuse, with one InvalidParameterError naming ``--device``, a device string torch cannot parse, a device
    type the engine does not run on, and (``local``: the engine runs on this machine) a CUDA device this torch
    build or machine does not have. ``local=False`` (replicas on a remote Ray cluster) checks the spelling only."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InvalidParameterError(f"--device {device}: not a device torch knows (cinq runs on cpu or cuda[:N])",
                                    "device") from None
    if dev.type not in ENGINE_DEVICE_TYPES:
        raise InvalidParameterError(f"--device {device}: cinq's engine runs on cpu or cuda[:N], not {dev.type}",
                                    "device")
    if dev.type != "cuda" or not local:
        return
    if not torch.backends.cuda.is_built():
        raise InvalidParameterError(f"--device {device}: this torch build has no CUDA device (a CPU-only build)",
                                    "device")
    if not torch.cuda.is_available():
        raise InvalidParameterError(f"--device {device}: torch sees no CUDA device on this machine", "device")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise InvalidParameterError(f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to "
                                    f"cuda:{count - 1}", "device")
