"""Reading a model folder's files defensively: a folder may come from anyone, so every file is checked before it
is read. Regular files only (a FIFO named config.json would block the reader forever, a link to /dev/zero would
fill memory), a size cap before reading (a sparse 64 GiB config.json takes no disk), and every error is a
``ModelLoadError`` naming the file and what is wrong."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from cinq.errors import ModelLoadError

# Size caps, each far above what the file holds in any released model (config.json: a few KiB; a
# tokenizer_config.json with many added tokens: a few MiB; the largest tokenizer.json files: ~35 MiB).
MAX_CONFIG_BYTES = 16 << 20
MAX_TOKENIZER_CONFIG_BYTES = 64 << 20
MAX_TOKENIZER_BYTES = 1 << 30


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n < 1 << 30 else f"{n >> 30} GiB"


def exists(file: Path) -> bool:
    """True when anything (even a dangling link, a FIFO or a folder) has this name: such names must get the
    "not a regular file" error, not be skipped as absent."""
    return file.is_symlink() or file.exists()


def regular_file_size(file: Path, max_bytes: int | None = None) -> int:
    """The size of ``file``, which must be a regular file (links followed) of at most ``max_bytes``."""
    try:
        st = file.stat()
    except OSError as e:
        raise ModelLoadError(f"{file}: cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{file}: not a regular file (a folder, FIFO or device); cinq reads model files only "
                             f"from regular files")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ModelLoadError(f"{file}: {st.st_size} bytes, above the {_mib(max_bytes)} limit for this file")
    return st.st_size


def read_json(file: Path, max_bytes: int = MAX_CONFIG_BYTES, want: type = dict) -> Any:
    """Parse a JSON file of at most ``max_bytes`` whose top level must be a ``want`` (an object by default)."""
    regular_file_size(file, max_bytes)
    try:
        value = json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start}); invalid JSON") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}: invalid JSON: {e}") from None
    except RecursionError:  # "[[[[...": nesting deeper than the parser's stack
        raise ModelLoadError(f"{file}: invalid JSON: nested too deeply") from None
    except OSError as e:
        raise ModelLoadError(f"{file}: cannot be read: {e.strerror or e}") from None
    if not isinstance(value, want):
        kind = "a JSON object" if want is dict else f"a JSON {want.__name__}"
        raise ModelLoadError(f"{file}: must hold {kind}, got {type(value).__name__}")
    return value
