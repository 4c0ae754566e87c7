"""CompilationConfig: vLLM's ``compilation_config`` fields for cinq's one compiled path, ``torch.compile`` of the
CPU decode step (cinq/engine/compiled_decode.py), validated on construction. Torch-free, like the other configs.

* ``mode``: vLLM's ``CompilationMode`` numbers. 0 (NONE) runs eager; 3 (VLLM_COMPILE) compiles the decode step of
  each batch size in ``compile_sizes``. 1 and 2 (vLLM's plain torch.compile / trace-once) mean the same here: cinq
  has one compiled path. ``level``, vLLM's older name of the field, is taken as ``mode``.
* ``backend``: the ``torch.compile`` backend, ``inductor`` (vLLM's default) or ``aot_eager`` / ``eager`` (trace only:
  quick to compile, the same kernels as eager; tests use them).
* ``compile_sizes``: decode batch sizes with a compiled step, as CUDA graph capture sizes: a decode-only step of
  n sequences runs the step of the smallest size >= n, padded with scratch sequences; steps past the largest
  size, prefills and speculative verifies run eager.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from cinq.errors import InvalidParameterError

MODES = (0, 1, 2, 3)
BACKENDS = ("inductor", "aot_eager", "eager")
MAX_COMPILE_SIZES = 8  # dynamo keeps 8 compiled versions of a frame by default; one per size
MAX_COMPILE_SIZE = 256


@dataclass(slots=True)
class CompilationConfig:
    """How (and whether) the decode step is compiled. The default, mode 0, is eager (see docs/architecture.md for
    the measurement that chose it)."""

    mode: int = 0
    backend: str = "inductor"
    compile_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])

    def __post_init__(self) -> None:
        if not isinstance(self.mode, int) or isinstance(self.mode, bool) or self.mode not in MODES:
            raise InvalidParameterError(
                f"compilation_config.mode must be one of {list(MODES)} (0: eager, 3: compile the decode step), got "
                f"{self.mode!r}", "mode")
        if self.backend not in BACKENDS:
            raise InvalidParameterError(
                f"compilation_config.backend must be one of {list(BACKENDS)}, got {self.backend!r}", "backend")
        sizes = self.compile_sizes
        if (not isinstance(sizes, (list, tuple)) or not 1 <= len(sizes) <= MAX_COMPILE_SIZES
                or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_COMPILE_SIZE for n in sizes)):
            raise InvalidParameterError(
                f"compilation_config.compile_sizes must be a list of 1 to {MAX_COMPILE_SIZES} batch sizes in "
                f"[1, {MAX_COMPILE_SIZE}], got {sizes!r}", "compile_sizes")
        self.compile_sizes = sorted(set(sizes))

    @property
    def enabled(self) -> bool:
        """True when the decode step is to be compiled."""
        return self.mode != 0

    def padded_size(self, batch_size: int) -> int | None:
        """The compiled size a decode step of ``batch_size`` sequences runs at, or None (eager)."""
        return next((n for n in self.compile_sizes if n >= batch_size), None)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompilationConfig:
        """From the JSON object users pass as ``compilation_config``; unknown keys are errors."""
        if not isinstance(d, dict):
            raise InvalidParameterError(f"compilation_config must be a JSON object, got {type(d).__name__}",
                                        "compilation_config")
        d = dict(d)
        if "level" in d:  # vLLM's name before "mode"
            level = d.pop("level")
            if "mode" in d and d["mode"] != level:
                raise InvalidParameterError(
                    f"compilation_config: 'level' ({level!r}) and 'mode' ({d['mode']!r}) disagree; give 'mode'", "mode")
            d["mode"] = level
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InvalidParameterError(
                f"compilation_config: unknown field(s) {unknown}; known: {sorted(known | {'level'})}", unknown[0])
        return cls(**d)
