"""How a layer takes its checkpoint tensors: the contract between the model loader and every layer kind.

The loader hands each checkpoint tensor, as a lazily read ``CheckpointTensor``, to the layer that owns it:
``layer.weight_loader(param_name, tensor, shard_id)``. ``shard_id`` is None when the checkpoint tensor is the
whole parameter, or names the part of a merged parameter it fills ("q"/"k"/"v" of a fused QKV projection,
0/1 of a fused gate/up). A layer reads only the rows it needs (``narrow`` before ``load``), so a tensor-parallel
shard can later be sliced straight from the safetensors file without reading the rest.

``OutputShards`` describes a merged linear's output rows; ``ParamLayout`` says along which dimension of one
parameter they lie, and how many output channels one stored element holds (packed int4/int8 words).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cinq.errors import ModelLoadError

ShardId = str | int


@dataclass(slots=True)
class CheckpointTensor:
    """A named checkpoint tensor whose bytes are read only by ``load`` (after optional ``narrow`` calls)."""

    name: str
    shape: tuple[int, ...]
    read: Callable[[tuple[slice, ...] | None], torch.Tensor]  # None: the whole tensor
    index: tuple[slice, ...] | None = None

    @classmethod
    def in_memory(cls, name: str, tensor: torch.Tensor) -> CheckpointTensor:
        """Wrap a tensor already in memory (tests, converters)."""
        return cls(name, tuple(tensor.shape), lambda index: tensor if index is None else tensor[index])

    @classmethod
    def from_safetensors(cls, handle: object, name: str, file: str = "") -> CheckpointTensor:
        """A tensor of an open ``safetensors.safe_open`` handle; valid while the handle is open. Read errors
        (safetensors' own exception type, an I/O error, a file changed since it was checked) become
        ModelLoadError naming the tensor and ``file``."""
        where = f"{file}: " if file else ""
        try:
            shape = tuple(handle.get_slice(name).get_shape())  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - SafetensorError derives from Exception only
            raise ModelLoadError(f"{where}checkpoint tensor '{name}': cannot be read: {e}") from None

        def read(index: tuple[slice, ...] | None) -> torch.Tensor:
            try:
                if index is None:
                    return handle.get_tensor(name)  # type: ignore[attr-defined]
                return handle.get_slice(name)[index]  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - as above
                raise ModelLoadError(f"{where}checkpoint tensor '{name}': cannot be read: {e}") from None

        return cls(name, shape, read)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        """Rows [start, start + length) along ``dim``, still unread."""
        index = list(self.index or tuple(slice(0, n) for n in self.shape))
        base = index[dim].start
        index[dim] = slice(base + start, base + start + length)
        shape = list(self.shape)
        shape[dim] = length
        return CheckpointTensor(self.name, tuple(shape), self.read, tuple(index))

    def load(self) -> torch.Tensor:
        """The tensor's values (only the narrowed part is read)."""
        return self.read(self.index)


@dataclass(slots=True, frozen=True)
class OutputShards:
    """A merged linear's output rows: shard ``ids[i]`` holds ``sizes[i]`` output channels, in this order."""

    ids: tuple[ShardId, ...]
    sizes: tuple[int, ...]

    def span(self, shard_id: ShardId, prefix: str = "") -> tuple[int, int]:
        """(first output channel, number of channels) of ``shard_id``."""
        if shard_id not in self.ids:
            raise ModelLoadError(f"{prefix}: no shard {shard_id!r} (shards: {list(self.ids)})")
        i = self.ids.index(shard_id)
        return sum(self.sizes[:i]), self.sizes[i]

    @property
    def total(self) -> int:
        return sum(self.sizes)


@dataclass(slots=True, frozen=True)
class ParamLayout:
    """Where a parameter's output channels lie: dimension ``output_dim`` (None: the parameter is shared by all
    shards, e.g. GPTQ's g_idx), ``pack`` output channels per stored element (packed words). For tensor
    parallelism, where its input channels lie: ``input_dim`` (None: not split along the input, e.g. a bias),
    ``input_pack`` input channels per stored element (packed words, or a group's scales row)."""

    output_dim: int | None = 0
    pack: int = 1
    input_dim: int | None = None
    input_pack: int = 1


def check_and_copy(dst: torch.Tensor, loaded: CheckpointTensor, what: str = "the model's", hint: str = "") -> None:
    """Copy ``loaded`` into ``dst`` (any dtype conversion), or raise ModelLoadError naming the tensor
    (``hint`` is appended to a shape error)."""
    if tuple(loaded.shape) != tuple(dst.shape):
        raise ModelLoadError(f"checkpoint tensor '{loaded.name}': shape {tuple(loaded.shape)} does not match "
                             f"{what} {tuple(dst.shape)}{hint}")
    t = loaded.load()
    if t.is_floating_point() != dst.is_floating_point():
        raise ModelLoadError(f"checkpoint tensor '{loaded.name}': dtype {t.dtype} cannot load into {dst.dtype}")
    with torch.no_grad():
        dst.copy_(t)


def load_sharded(dst: torch.Tensor, loaded: CheckpointTensor, layout: ParamLayout, shards: OutputShards | None,
                 shard_id: ShardId | None, prefix: str = "", hint: str = "") -> None:
    """The default weight loader: the whole parameter (``shard_id`` None) or one shard's rows of it."""
    if shard_id is None or layout.output_dim is None:
        if shard_id is None and shards is not None and layout.output_dim is not None:
            raise ModelLoadError(f"checkpoint tensor '{loaded.name}': {prefix} is merged from shards "
                                 f"{list(shards.ids)}; the tensor must come with a shard id")
        check_and_copy(dst, loaded, hint=hint)
        return
    if shards is None:
        raise ModelLoadError(f"checkpoint tensor '{loaded.name}': {prefix} is not merged, got shard {shard_id!r}")
    start, size = shards.span(shard_id, prefix)
    if start % layout.pack or size % layout.pack:
        raise ModelLoadError(f"checkpoint tensor '{loaded.name}': shard {shard_id!r} of {prefix} ({size} channels "
                             f"at {start}) does not fill whole packed words of {layout.pack}")
    rows = dst.narrow(layout.output_dim, start // layout.pack, size // layout.pack)
    check_and_copy(rows, loaded, f"shard {shard_id!r} of the model's", hint)


def split_shards(tensor: torch.Tensor, layout: ParamLayout, shards: OutputShards) -> dict[ShardId, torch.Tensor]:
    """The inverse of loading shard by shard: each shard's part of a merged parameter (shared ones whole)."""
    out: dict[ShardId, torch.Tensor] = {}
    for shard_id in shards.ids:
        if layout.output_dim is None:
            out[shard_id] = tensor
            continue
        start, size = shards.span(shard_id)
        out[shard_id] = tensor.narrow(layout.output_dim, start // layout.pack, size // layout.pack)
    return out
