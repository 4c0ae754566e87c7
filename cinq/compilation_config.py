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
* ``cudagraph_capture_sizes``: on CUDA, the batch sizes with a captured CUDA graph of the decode step (same
  padding); None: ``compile_sizes``.
* ``inductor_compile_config``: extra inductor options for the compiled step, e.g. ``{"cpp_wrapper": true}``
  (C++ instead of Python between the kernels; see benchmarks/results/compile.md for what it measured here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.option_fields import from_known_fields

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
    cudagraph_capture_sizes: list[int] | None = None
    inductor_compile_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.mode, int) or isinstance(self.mode, bool) or self.mode not in MODES:
            raise InvalidParameterError(
                f"compilation_config.mode must be one of {list(MODES)} (0: eager, 3: compile the decode step), got "
                f"{self.mode!r}", "mode")
        if self.backend not in BACKENDS:
            raise InvalidParameterError(
                f"compilation_config.backend must be one of {list(BACKENDS)}, got {self.backend!r}", "backend")
        self.compile_sizes = _sizes(self.compile_sizes, "compile_sizes")
        if self.cudagraph_capture_sizes is not None:
            self.cudagraph_capture_sizes = _sizes(self.cudagraph_capture_sizes, "cudagraph_capture_sizes")
        options = self.inductor_compile_config
        if not isinstance(options, dict) or any(not isinstance(k, str) for k in options):
            raise InvalidParameterError(
                f"compilation_config.inductor_compile_config must be a JSON object of inductor options, got "
                f"{options!r}", "inductor_compile_config")

    @property
    def enabled(self) -> bool:
        """True when the decode step is to be compiled."""
        return self.mode != 0

    @property
    def capture_sizes(self) -> list[int]:
        """The batch sizes with a CUDA graph of the decode step (on CUDA)."""
        return self.compile_sizes if self.cudagraph_capture_sizes is None else self.cudagraph_capture_sizes

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
        return from_known_fields(cls, d, "compilation_config", frozenset({"level"}))


def _sizes(sizes: Any, name: str) -> list[int]:
    """``sizes`` sorted and deduplicated, or an error naming ``compilation_config.<name>`` and its limits."""
    if (not isinstance(sizes, (list, tuple)) or not 1 <= len(sizes) <= MAX_COMPILE_SIZES
            or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_COMPILE_SIZE for n in sizes)):
        raise InvalidParameterError(
            f"compilation_config.{name} must be a list of 1 to {MAX_COMPILE_SIZES} batch sizes in "
            f"[1, {MAX_COMPILE_SIZE}], got {sizes!r}", name)
    return sorted(set(sizes))
