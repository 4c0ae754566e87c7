"""Will the model fit? The bytes a model will take, counted on its meta-device skeleton before any storage
exists, against the memory available on the device.

Without this check a config.json that asks for more than the machine holds does not fail cleanly: Linux
overcommits, so each tensor's allocation succeeds and the process is killed later, when loading touches the
pages (or a single allocation fails with an allocator message that names no file).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cinq.errors import ModelLoadError
from cinq.model.config import ModelConfig


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_room() -> int | None:
    """Bytes this process's memory cgroup (v2, else v1) still allows, or None without a limit."""
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is None:
        limit = _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        used = _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is None or used is None or limit >= 1 << 60:  # v1 writes a huge number for "unlimited"
        return None
    return max(0, limit - used)


def available_memory_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's free bytes, or on a CPU MemAvailable (bounded by the memory cgroup);
    None when it cannot be told (then nothing is refused)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = _cgroup_room()
    if room is not None:
        available = room if available is None else min(available, room)
    return available


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (shared ones counted once); works on a meta-device model."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def rotary_table_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """The cos/sin tables built at the first forward: each attention layer keeps its own [max_position, head_dim]
    table in the compute dtype (cinq/layers/rotary.py), built through float32 temporaries of that size."""
    rows = config.max_position_embeddings * config.head_dim
    return config.num_hidden_layers * rows * dtype.itemsize + 3 * rows * 4


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def check_fits(model: nn.Module, dtype: torch.dtype, device: torch.device | str, path: Path) -> None:
    """Raise ModelLoadError unless ``model`` (still on the meta device) and its rotary tables fit in the memory
    available on ``device``; the error gives both sizes."""
    device = torch.device(device)
    config: ModelConfig = model.config  # type: ignore[assignment]
    weights = tensor_bytes(model)
    tables = rotary_table_bytes(config, dtype)
    available = available_memory_bytes(device)
    if available is None or weights + tables <= available:
        return
    dtype_name = str(dtype).removeprefix("torch.")
    raise ModelLoadError(
        f"{path / 'config.json' if path.is_dir() else path}: the model needs {_size(weights + tables)} ({dtype_name} weights {_size(weights)} "
        f"+ rotary tables {_size(tables)}) but only {_size(available)} of memory is available on {device}: "
        f"check hidden_size, intermediate_size, num_hidden_layers, vocab_size and max_position_embeddings, or "
        f"use a smaller or quantized model")
