"""A model folder's safetensors files: finding them (single file or sharded index) and vetting each header
against the file before anything maps it.

safetensors' own reader also refuses malformed files, but with messages that name neither the file nor the
tensor ("header too large"), and as an exception that is not a ``ValueError``. Checking here first gives every
hostile file a ``ModelLoadError`` that says which file and what is wrong: a pickle or a torch zip named
``.safetensors`` (refused from its first bytes: nothing here unpickles), a header length beyond the file or the
100 MiB cap, a header that is not JSON, a tensor whose byte range lies past the end of the file (truncated, or
a header claiming terabytes), a shape that disagrees with its byte range, an unknown dtype.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from cinq.errors import ModelLoadError
from cinq.model.folder_files import MAX_CONFIG_BYTES, exists, read_json, regular_file_size

# safetensors' own cap on the JSON header (MAX_HEADER_SIZE in the Rust crate).
MAX_HEADER_BYTES = 100 << 20

DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a model folder (sharded via model.safetensors.index.json, or single), each a
    regular file inside the folder."""
    index = path / INDEX_FILE
    if exists(index):
        weight_map = read_json(index, MAX_CONFIG_BYTES).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map \
                or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index}: 'weight_map' must be a non-empty object of tensor name -> file name")
        for name in set(weight_map.values()):
            # A shard name like "../x" or "/etc/passwd" would read outside the folder the user pointed at. The
            # check is on the name, not the resolved path: Hugging Face's cache links every file to ../../blobs.
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ModelLoadError(f"{index}: shard {name!r} lies outside the model folder {path}")
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not exists(f)]
        if missing:
            raise ModelLoadError(f"{index}: shard(s) {missing} listed in weight_map are missing")
        return files
    single = path / "model.safetensors"
    if exists(single):
        return [single]
    others = sorted(path.glob("*.safetensors"))
    if others:
        return others
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ModelLoadError(f"{path}: only pickled weights (.bin/.pt) found; cinq loads safetensors only")
    raise ModelLoadError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _not_safetensors_kind(head: bytes) -> str | None:
    """What a file that is not safetensors is, from its first bytes, when that is recognisable."""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a pickle (PyTorch .bin/.pt format)"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive (torch.save format, with a pickle inside)"
    return None


def check_safetensors_file(file: Path) -> None:
    """Refuse ``file`` unless its header is well formed and every tensor's bytes lie inside the file.

    Reads the 8-byte header length and the header only (never tensor data): cheap, and done before
    safetensors maps the file."""
    size = regular_file_size(file)
    if size < 8:
        raise ModelLoadError(f"{file}: not a safetensors file: {size} bytes, too short for the 8-byte header length")
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            raw = f.read(n) if n <= min(size - 8, MAX_HEADER_BYTES) else b""
    except OSError as e:
        raise ModelLoadError(f"{file}: cannot be read: {e.strerror or e}") from None
    kind = _not_safetensors_kind(head)
    if kind is not None:
        raise ModelLoadError(f"{file}: not a safetensors file: it is {kind}; cinq never unpickles weights "
                             f"(convert it to safetensors)")
    if n > size - 8:
        raise ModelLoadError(f"{file}: header length {n} bytes exceeds the file ({size} bytes): truncated, "
                             f"or not a safetensors file")
    if n > MAX_HEADER_BYTES:
        raise ModelLoadError(f"{file}: header of {n} bytes is above safetensors' {MAX_HEADER_BYTES >> 20} MiB "
                             f"limit")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelLoadError(f"{file}: header is not valid JSON ({e}): truncated, or not a safetensors "
                             f"file") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{file}: header must be a JSON object, got {type(header).__name__}")
    _check_entries(file, header, data_bytes=size - 8 - n)


def _check_entries(file: Path, header: dict, data_bytes: int) -> None:
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        what = f"{file}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{what}: header entry must be an object, got {type(entry).__name__}")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise ModelLoadError(f"{what}: unknown dtype {dtype!r} (safetensors dtypes: {sorted(DTYPE_BYTES)})")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ModelLoadError(f"{what}: shape must be a list of non-negative integers, got {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets) \
                or not 0 <= offsets[0] <= offsets[1]:
            raise ModelLoadError(f"{what}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
        begin, end = offsets
        if end > data_bytes:
            raise ModelLoadError(f"{what} ends at byte {end} of the data, but the file holds only {data_bytes} bytes "
                                 f"of data (truncated, or a header claiming more than the file has)")
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        if nbytes != end - begin:
            raise ModelLoadError(f"{what}: shape {shape} of {dtype} is {nbytes} bytes, but data_offsets span "
                                 f"{end - begin}")
