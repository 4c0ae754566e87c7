"""``--device``: checked in the command layer before any engine process starts, so a device this machine cannot
run on is one line naming the flag (exit 2), not a traceback from inside the engine core.

EngineConfig checks the spelling and the device type (``check_device_name``); whether this machine has the device
is checked here, since a replica on a remote Ray cluster may have one the head node lacks."""

from __future__ import annotations

from cinq.config import check_device_name
from cinq.errors import InvalidParameterError


def check_device(device: str, local: bool = True) -> None:
    """Refuse, with one InvalidParameterError naming ``--device``, a device string torch cannot parse, a device
    type the engine does not run on (EngineConfig's own check), and (``local``: the engine runs on this machine) a
    CUDA device this torch build or machine does not have. ``local=False`` (replicas on a remote Ray cluster)
    checks the spelling only."""
    import torch

    try:
        check_device_name(device)
    except InvalidParameterError as e:
        raise InvalidParameterError(f"--{e}", "device") from None
    dev = torch.device(device)
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
