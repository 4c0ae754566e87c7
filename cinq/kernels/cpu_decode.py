"""The native CPU paged-decode kernel (``cpu/paged_decode.cpp``): built once per machine with the system C++
compiler through ``torch.utils.cpp_extension`` and cached; when it cannot be built, callers fall back to the
PyTorch path (said once in the log). ``CINQ_NATIVE_KERNELS=0`` disables it."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("cpu") / "paged_decode.cpp"
_lock = threading.Lock()
_module: Any = None
_tried = False


def native_decode_module() -> Any | None:
    """The compiled extension, building it on first call; None when disabled or unbuildable."""
    global _module, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        _tried = True
        if os.environ.get("CINQ_NATIVE_KERNELS", "1") == "0":
            return None
        try:
            from torch.utils.cpp_extension import load

            from cinq.assets import cache_dir
            build = cache_dir() / "torch_extensions" / f"torch-{torch.__version__}"
            build.mkdir(parents=True, exist_ok=True)
            _module = load(name="cinq_paged_decode", sources=[str(_SOURCE)], build_directory=str(build),
                           extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
                           extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure means: use the PyTorch path
            log.warning("native CPU decode kernel unavailable (%s); using the PyTorch path", str(e).splitlines()[0]
                        if str(e) else type(e).__name__)
            _module = None
    return _module


def paged_decode_native(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Decode attention [nd, Hq, D] (query dtype) straight from the pages, or None if the kernel is unavailable."""
    if query.device.type != "cpu" or not kv_cache.is_contiguous():
        return None
    mod = native_decode_module()
    if mod is None:
        return None
    nd = query.shape[0]
    out = mod.paged_decode(query.float().contiguous(), kv_cache, block_tables[:nd].to(torch.int32).contiguous(),
                           seq_lens[:nd].to(torch.int32).contiguous(), float(scale))
    return out.to(query.dtype)
