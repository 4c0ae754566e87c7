"""Reading a GGUF file defensively: the header, the metadata and the tensor table, every count checked against the
file's size before anything sized by it is allocated.

GGUF (llama.cpp's format, versions 2 and 3), little-endian:
    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x (key: string, value_type u32, value)      string = u64 length + UTF-8 bytes
    tensor_count x (name: string, n_dims u32, dims u64[n_dims] (fastest first), ggml_type u32, offset u64)
    padding to ``general.alignment`` (default 32), then the tensor data; each offset is relative to that point.

A file may come from anyone, so a count is never trusted: a string or array cannot be longer than the bytes left,
a tensor's bytes must lie inside the data section, tensors must not overlap, dimensions and types must be ones
cinq knows. Every refusal is a ``ModelLoadError`` of one line naming the file and the field. Tensor data is not
read here: ``GGUFFile.tensor_bytes`` gives a read-only view of the mapped file when a layer asks for it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from cinq.errors import ModelLoadError
from cinq.model.folder_files import regular_file_size

MAGIC = b"GGUF"
GGUF_QUANT_METHOD = "gguf"  # the quantization_config.quant_method of a ModelConfig read from a GGUF file
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Plausibility limits, far beyond released files (the largest models have ~1-2k tensors and ~50 metadata keys; a
# vocabulary of 262k strings is the largest array): a count past one is a corrupted or hostile file.
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 16
MAX_ARRAY = 1 << 24
MAX_STRING = 1 << 26
MAX_NAME = 256
MAX_ELEMENTS = 1 << 40

# GGUF metadata value types: id -> (name, struct format or None for string / array)
_VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
    5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"), 8: ("string", None), 9: ("array", None),
    10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d"),
}
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
                 11: "<i8", 12: "<f8"}

# GGML tensor types: id -> (name, values per block, bytes per block). Only these are accepted; what cinq does with
# each is decided by the loader (cinq/model/gguf/weights.py).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2),
}
GGML_TYPE_IDS = {name: i for i, (name, _, _) in GGML_TYPES.items()}


@dataclass(slots=True, frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table. ``shape`` is torch's order (slowest first): a [out, in] matrix is stored as
    dims (in, out) in the file."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def block_values(self) -> int:
        return GGML_TYPES[GGML_TYPE_IDS[self.type_name]][1]

    @property
    def block_bytes(self) -> int:
        return GGML_TYPES[GGML_TYPE_IDS[self.type_name]][2]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the last, fastest dimension)."""
        return self.shape[-1] // self.block_values * self.block_bytes


@dataclass(slots=True)
class GGUFFile:
    """A vetted GGUF file: its metadata (key -> value; arrays as lists, numeric arrays as numpy) and tensor table."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]
    data_offset: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelLoadError(f"{self.path}: metadata 'general.architecture' is missing or not a string")
        return arch

    def tensor_bytes(self, info: GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array over the mapped file (no copy)."""
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)


class _Cursor:
    """Bounds-checked little-endian reads over the file's bytes; errors name the file and the field being read."""

    def __init__(self, buf: memoryview, source: str) -> None:
        self.buf, self.pos, self.source = buf, 0, source

    def fail(self, what: str, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: {what}: {why}")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.left():
            raise self.fail(what, f"needs {n} bytes at offset {self.pos}, but the file ends {self.left()} bytes "
                                  f"later (truncated or corrupted)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, limit: int, min_bytes_each: int) -> int:
        """A u64 count of items each at least ``min_bytes_each`` bytes long: refused past ``limit`` or past what
        the rest of the file could hold."""
        n = self.scalar("<Q", what)
        if n > limit:
            raise self.fail(what, f"{n} is above the limit {limit} (corrupted or hostile file)")
        if n * min_bytes_each > self.left():
            raise self.fail(what, f"{n} items need at least {n * min_bytes_each} bytes, but only {self.left()} "
                                  f"remain (truncated or corrupted)")
        return n

    def string(self, what: str, limit: int = MAX_STRING) -> str:
        n = self.count(f"{what} (string length)", limit, 1)
        raw = self.take(n, what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(what, f"not UTF-8 ({e.reason} at byte {e.start})") from None

    def strings(self, n: int, what: str) -> list[str]:
        """``n`` strings in a row (a vocabulary: ~50k-260k of them, so one tight loop, same checks as ``string``)."""
        buf, pos, end = self.buf.obj, self.pos, len(self.buf)  # the mapping itself: slices are bytes
        unpack = struct.unpack_from
        out: list[str] = []
        for i in range(n):
            if pos + 8 > end:
                self.pos = pos
                raise self.fail(f"{what}[{i}] (string length)", "the file ends first (truncated or corrupted)")
            (size,) = unpack("<Q", buf, pos)
            pos += 8
            if size > MAX_STRING or pos + size > end:
                self.pos = pos
                raise self.fail(f"{what}[{i}]", f"length {size} runs past the end of the file")
            try:
                out.append(str(buf[pos:pos + size], "utf-8"))
            except UnicodeDecodeError as e:
                raise self.fail(f"{what}[{i}]", f"not UTF-8 ({e.reason} at byte {e.start})") from None
            pos += size
        self.pos = pos
        return out

    def value(self, vtype: int, what: str) -> Any:
        if vtype not in _VALUE_TYPES:
            raise self.fail(what, f"unknown value type {vtype} (known: 0-12)")
        name, fmt = _VALUE_TYPES[vtype]
        if fmt is not None:
            return self.scalar(fmt, what)
        if name == "string":
            return self.string(what)
        etype = self.scalar("<I", f"{what} (array element type)")
        if etype == 9:
            raise self.fail(what, "arrays of arrays are not supported")
        if etype not in _VALUE_TYPES:
            raise self.fail(what, f"unknown array element type {etype} (known: 0-12)")
        esize = struct.calcsize(_VALUE_TYPES[etype][1]) if etype != 8 else 8
        n = self.count(f"{what} (array length)", MAX_ARRAY, esize)
        if etype == 8:
            return self.strings(n, what)
        arr = np.frombuffer(self.take(n * esize, what), dtype=_ARRAY_DTYPES[etype]).copy()
        return arr.astype(bool) if etype == 7 else arr


def is_gguf_file(path: Path) -> bool:
    """True when ``path`` is a regular file that starts with the GGUF magic."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


@lru_cache(maxsize=4)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    return _parse(Path(path))


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and vet a GGUF file's header, metadata and tensor table (cached by path, size and mtime: the engine,
    tokenizer and loader each ask for it)."""
    path = Path(path)
    regular_file_size(path)
    st = path.stat()
    return _read_cached(str(path), st.st_size, st.st_mtime_ns)


def _parse(path: Path) -> GGUFFile:
    source = str(path)
    with open(path, "rb") as f:
        size = regular_file_size(path)
        if size < 24:
            raise ModelLoadError(f"{source}: header: {size} bytes is shorter than a GGUF header (24 bytes)")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(memoryview(mapped), source)
    if bytes(cur.take(4, "magic")) != MAGIC:
        raise ModelLoadError(f"{source}: magic: not a GGUF file (it does not start with 'GGUF')")
    version = cur.scalar("<I", "version")
    if version not in VERSIONS:
        raise ModelLoadError(f"{source}: version: {version} is not supported (GGUF versions {VERSIONS})")
    # a tensor entry takes at least 8 + 1 + 4 + 8 + 4 + 8 bytes, a key/value 8 + 1 + 4 + 1
    n_tensors = cur.count("tensor_count", MAX_TENSORS, 33)
    n_kv = cur.count("kv_count", MAX_KV, 14)
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", MAX_NAME)
        vtype = cur.scalar("<I", f"metadata '{key}' (value type)")
        metadata[key] = cur.value(vtype, f"metadata '{key}'")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise ModelLoadError(f"{source}: metadata 'general.alignment': {alignment!r} is not a power of two "
                             f"up to 1 MiB")
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i} name", MAX_NAME)
        what = f"tensor '{name}'"
        n_dims = cur.scalar("<I", f"{what} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelLoadError(f"{source}: {what}: n_dims {n_dims} is not in [1, {MAX_DIMS}]")
        dims = tuple(cur.scalar("<Q", f"{what} dims") for _ in range(n_dims))
        ttype = cur.scalar("<I", f"{what} type")
        offset = cur.scalar("<Q", f"{what} offset")
        raw.append((name, dims, ttype, offset))
    data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, dims, ttype, offset in raw:
        info = _tensor_info(source, name, dims, ttype, offset, alignment, data_offset, size)
        if name in tensors:
            raise ModelLoadError(f"{source}: tensor '{name}': listed twice")
        tensors[name] = info
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ModelLoadError(f"{source}: tensor '{b}': its bytes overlap those of tensor '{a}' "
                                 f"(lying offsets)")
    return GGUFFile(path, version, metadata, tensors, data_offset)  # the parse's map closes with its last view


def _tensor_info(source: str, name: str, dims: tuple[int, ...], ttype: int, offset: int, alignment: int,
                 data_offset: int, file_size: int) -> GGUFTensorInfo:
    what = f"{source}: tensor '{name}'"
    if ttype not in GGML_TYPES:
        raise ModelLoadError(f"{what}: ggml type {ttype} is not one cinq reads "
                             f"({', '.join(n for n, _, _ in GGML_TYPES.values())})")
    type_name, block, block_bytes = GGML_TYPES[ttype]
    if any(d <= 0 for d in dims):
        raise ModelLoadError(f"{what}: dims {list(dims)} must all be positive")
    elements = 1
    for d in dims:
        elements *= d
        if elements > MAX_ELEMENTS:
            raise ModelLoadError(f"{what}: dims {list(dims)} hold more than {MAX_ELEMENTS} values (absurd)")
    if dims[0] % block:
        raise ModelLoadError(f"{what}: row length {dims[0]} is not a multiple of {type_name}'s block of {block}")
    nbytes = elements // block * block_bytes
    if offset % alignment:
        raise ModelLoadError(f"{what}: offset {offset} is not aligned to {alignment}")
    start = data_offset + offset
    if start + nbytes > file_size:
        raise ModelLoadError(f"{what}: {nbytes} bytes at offset {start} run past the end of the file "
                             f"({file_size} bytes): truncated file or lying offset/size")
    return GGUFTensorInfo(name, tuple(reversed(dims)), type_name, start, nbytes)


def find_gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a model argument names: the path itself when it is one, or the single ``.gguf`` of a folder
    that has no ``config.json``; None for anything else (a Hugging Face folder). A folder holding several is a
    ModelLoadError listing them."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf" and not is_gguf_file(path):
            raise ModelLoadError(f"{path}: magic: not a GGUF file (it does not start with 'GGUF')")
        return path if is_gguf_file(path) else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise ModelLoadError(f"{path}: holds {len(files)} .gguf files ({', '.join(f.name for f in files[:4])}); "
                             f"name the one to load")
    return files[0] if files else None
