"""QuantConfig: how a model is (or is to be) quantized, and its Hugging Face ``quantization_config``, both ways.

It is also the ``LinearFactory`` the model uses when it loads a quantized folder: ``make_linear`` builds the
linear kind whose parameters carry that format's tensor names and shapes.

``method`` says how the integers were chosen (rtn / gptq / awq / smoothquant); ``format`` how they are stored:
"gptq" (v1), "gptq_v2", "awq" (GEMM) or "w8a8" (cinq's SmoothQuant format, see formats.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.quant.qweight import check_grid

METHODS = ("rtn", "gptq", "awq", "smoothquant")
FORMATS = ("gptq", "gptq_v2", "awq", "w8a8")
W8A8_QUANT_METHOD = "cinq_w8a8"
DEFAULT_FORMAT = {"rtn": "gptq", "gptq": "gptq", "awq": "awq", "smoothquant": "w8a8"}


@dataclass(slots=True)
class QuantConfig:
    """Quantization settings; validated on construction (errors name the field and its limit)."""

    method: str = "rtn"
    bits: int | None = None  # default: 8 for SmoothQuant, else 4
    group_size: int = 128  # -1: per output channel
    sym: bool = True
    format: str | None = None  # default per method (DEFAULT_FORMAT)
    desc_act: bool = False  # GPTQ act-order
    static_groups: bool = False  # GPTQ: groups fixed before act-order permutation
    true_sequential: bool = True  # GPTQ: quantize q/k/v, o, gate/up, down in turn inside a block
    damp_percent: float = 0.01  # GPTQ Hessian dampening, fraction of mean(diag(H))
    block_size: int = 128  # GPTQ lazy-batch width
    awq_grid: int = 20  # AWQ: alpha in {0, 1/n, ..., (n-1)/n}
    awq_clip: bool = True  # AWQ: search a clipping ratio per group after scaling
    smooth_alpha: float = 0.5  # SmoothQuant migration strength
    act_scheme: str = "dynamic"  # W8A8 activations: "dynamic" per token | "static" per tensor (calibrated)
    modules_to_not_convert: list[str] = field(default_factory=list)
    lm_head: bool = False  # also quantize the LM head (GPTQ formats; gptqmodel's "lm_head" flag), RTN grid

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidParameterError(f"method must be one of {list(METHODS)}, got {self.method!r}", "method")
        if self.format is None:
            self.format = DEFAULT_FORMAT[self.method]
        if self.bits is None:
            self.bits = 8 if self.method == "smoothquant" else 4
        if self.format not in FORMATS:
            raise InvalidParameterError(f"format must be one of {list(FORMATS)}, got {self.format!r}", "format")
        if (self.method == "smoothquant") != (self.format == "w8a8"):
            raise InvalidParameterError(
                f"format {self.format!r} does not fit method {self.method!r}: SmoothQuant writes (only) 'w8a8'",
                "format")
        if self.lm_head and self.format not in ("gptq", "gptq_v2"):
            raise InvalidParameterError(f"lm_head quantization is written in the GPTQ formats only, not "
                                        f"{self.format!r}", "lm_head")
        if self.format == "w8a8":
            self.group_size = -1  # W8A8 weights are per output channel
            if self.bits != 8:
                raise InvalidParameterError(f"bits must be 8 for W8A8 (SmoothQuant), got {self.bits}", "bits")
            if self.act_scheme not in ("dynamic", "static"):
                raise InvalidParameterError(
                    f"act_scheme must be 'dynamic' or 'static', got {self.act_scheme!r}", "act_scheme")
            if not (0.0 <= self.smooth_alpha <= 1.0):
                raise InvalidParameterError(f"smooth_alpha must be in [0, 1], got {self.smooth_alpha}", "smooth_alpha")
            return
        check_grid(self.bits, self.group_size)
        if self.format == "awq":
            if self.bits != 4:
                raise InvalidParameterError(f"bits must be 4 for the AWQ GEMM format, got {self.bits}", "bits")
            if self.desc_act:
                raise InvalidParameterError("desc_act needs the GPTQ format (AWQ files have no g_idx)", "desc_act")
        if not (0.0 < self.damp_percent < 1.0):
            raise InvalidParameterError(f"damp_percent must be in (0, 1), got {self.damp_percent}", "damp_percent")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidParameterError(f"block_size must be a positive integer, got {self.block_size}", "block_size")
        if not isinstance(self.awq_grid, int) or not (1 <= self.awq_grid <= 1000):
            raise InvalidParameterError(f"awq_grid must be an integer in [1, 1000], got {self.awq_grid}", "awq_grid")

    # ------------------------------------------------------------------------------------------ HF config

    @property
    def min_zero(self) -> int:
        """Smallest zero point the storage format can hold (GPTQ v1 stores zero - 1)."""
        return 1 if self.format == "gptq" else 0

    def to_hf(self) -> dict[str, Any]:
        """The ``quantization_config`` of config.json for this format (what transformers / vLLM read)."""
        meta = {"quantizer": ["cinq:0.1.0"], "method": self.method}
        skip = list(self.modules_to_not_convert) or None
        if self.format in ("gptq", "gptq_v2"):
            return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group_size,
                    "desc_act": self.desc_act, "sym": self.sym, "static_groups": self.static_groups,
                    "true_sequential": self.true_sequential, "damp_percent": self.damp_percent,
                    "checkpoint_format": self.format, "lm_head": self.lm_head, "modules_to_not_convert": skip,
                    "meta": meta}
        if self.format == "awq":
            return {"quant_method": "awq", "bits": 4, "group_size": self.group_size, "zero_point": not self.sym,
                    "version": "gemm", "modules_to_not_convert": skip, "meta": meta}
        return {"quant_method": W8A8_QUANT_METHOD, "format_version": 1, "weight_bits": 8, "activation_bits": 8,
                "weight_scheme": "per_channel_symmetric", "activation_scheme": self.act_scheme,
                "smoothquant_alpha": self.smooth_alpha, "modules_to_not_convert": skip, "meta": meta}

    def quantize_config_json(self) -> dict[str, Any] | None:
        """AutoGPTQ's separate quantize_config.json (GPTQ formats only)."""
        if self.format not in ("gptq", "gptq_v2"):
            return None
        out = self.to_hf()
        out.pop("quant_method")
        out.pop("modules_to_not_convert")
        return out

    @classmethod
    def from_hf(cls, qc: dict[str, Any]) -> QuantConfig:
        """Parse a ``quantization_config`` (GPTQ v1/v2, AWQ GEMM, cinq W8A8); errors name the field."""
        if not isinstance(qc, dict):
            raise ModelLoadError(f"quantization_config must be an object, got {type(qc).__name__}",
                                 "quantization_config")
        kind = str(qc.get("quant_method", "")).lower()
        skip = list(qc.get("modules_to_not_convert") or [])
        method = (qc.get("meta") or {}).get("method") if isinstance(qc.get("meta"), dict) else None
        try:
            if kind == "gptq":
                fmt = str(qc.get("checkpoint_format", "gptq")).lower()
                if fmt not in ("gptq", "gptq_v2"):
                    raise ModelLoadError(f"quantization_config.checkpoint_format {fmt!r} is not supported "
                                         f"(gptq, gptq_v2)", "checkpoint_format")
                return cls(method=method if method in ("rtn", "gptq", "awq") else "gptq",
                           bits=int(qc.get("bits", 4)), group_size=int(qc.get("group_size", 128)),
                           sym=bool(qc.get("sym", True)), format=fmt, desc_act=bool(qc.get("desc_act", False)),
                           static_groups=bool(qc.get("static_groups", False)),
                           true_sequential=bool(qc.get("true_sequential", True)),
                           damp_percent=float(qc.get("damp_percent", 0.01)), modules_to_not_convert=skip,
                           lm_head=bool(qc.get("lm_head", False)))
            if kind == "awq":
                version = str(qc.get("version", "gemm")).lower()
                if version != "gemm":
                    raise ModelLoadError(f"quantization_config.version {version!r}: cinq reads AWQ 'gemm' files",
                                         "version")
                return cls(method=method if method in ("rtn", "awq") else "awq",
                           bits=int(qc.get("bits", qc.get("w_bit", 4))),
                           group_size=int(qc.get("group_size", qc.get("q_group_size", 128))),
                           sym=not bool(qc.get("zero_point", True)), format="awq", modules_to_not_convert=skip)
            if kind == W8A8_QUANT_METHOD:
                if int(qc.get("format_version", 1)) != 1:
                    raise ModelLoadError(f"quantization_config.format_version {qc.get('format_version')} is newer "
                                         f"than this cinq reads (1)", "format_version")
                return cls(method="smoothquant", bits=int(qc.get("weight_bits", 8)), format="w8a8",
                           act_scheme=str(qc.get("activation_scheme", "dynamic")),
                           smooth_alpha=float(qc.get("smoothquant_alpha", 0.5)), modules_to_not_convert=skip)
        except InvalidParameterError as e:
            raise ModelLoadError(f"quantization_config: {e}", e.param) from e
        raise ModelLoadError(f"quantization_config.quant_method {kind!r} is not supported "
                             f"(gptq, awq, {W8A8_QUANT_METHOD})", "quant_method")

    # ------------------------------------------------------------------------------------- LinearFactory

    def skips(self, prefix: str) -> bool:
        """True when ``prefix`` names a module listed in modules_to_not_convert (kept dense)."""
        return any(re.search(rf"(^|\.){re.escape(m)}(\.|$)", prefix) for m in self.modules_to_not_convert)

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str) -> nn.Module:
        """The quantized linear for this format (dense for skipped modules)."""
        from cinq.layers import linear as L
        if self.skips(prefix):
            return L.DenseLinear(in_features, out_features, bias)
        if self.format in ("gptq", "gptq_v2"):
            return L.GPTQLinear(in_features, out_features, bias, self.bits, self.group_size,
                                version=2 if self.format == "gptq_v2" else 1, prefix=prefix)
        if self.format == "awq":
            return L.AWQLinear(in_features, out_features, bias, self.group_size, prefix=prefix)
        return L.W8A8Linear(in_features, out_features, bias, static=self.act_scheme == "static", prefix=prefix)
