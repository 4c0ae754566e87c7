"""QuantFormat: how a checkpoint's weights are stored, i.e. what its ``quantization_config`` says, both ways.

It is also the ``LinearFactory`` the model uses when it loads a quantized folder: ``make_linear`` builds the
linear kind whose buffers carry that format's tensor names and shapes.

``method`` says how the integers were chosen (rtn / gptq / awq / smoothquant; informational, from the
``meta`` cinq writes); ``format`` how they are stored: "gptq" (v1), "gptq_v2", "awq" (GEMM) or "w8a8" (cinq's
SmoothQuant format, see packing.py). Two float-code formats have their own method: "nf4" writes "bnb_nf4"
(bitsandbytes ``load_in_4bit``, nf4.py) and "fp8" writes float8_e4m3fn weights (fp8.py) as vLLM's "fp8" method
(per-tensor scales, static or dynamic activations) or as compressed-tensors' "float-quantized" scheme (per tensor or
channel; activations dynamic per token, static per tensor, or none: weight-only). How to *make* such a checkpoint (calibration, damping, ...) is the offline
tool's ``QuantRecipe`` (cinq/quant/recipe.py); the settings it records in the file come in through ``to_hf``'s
``recorded`` argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization.linear import AWQLinear, GPTQLinear, W8A8Linear
from cinq.layers.quantization.qweight import check_grid
from cinq.layers.weight_loader import OutputShards

METHODS = ("rtn", "gptq", "awq", "smoothquant", "nf4", "fp8")
FORMATS = ("gptq", "gptq_v2", "awq", "w8a8", "bnb_nf4", "fp8", "compressed_tensors")
FLOAT_FORMATS = ("bnb_nf4", "fp8", "compressed_tensors")  # float-code formats (float_format.py)
W8A8_QUANT_METHOD = "cinq_w8a8"
DEFAULT_FORMAT = {"rtn": "gptq", "gptq": "gptq", "awq": "awq", "smoothquant": "w8a8", "nf4": "bnb_nf4"}


@dataclass(slots=True)
class QuantFormat:
    """A quantized checkpoint's storage format; validated on construction (errors name the field and limit)."""

    method: str = "rtn"
    bits: int | None = None  # default: 8 for SmoothQuant, else 4
    group_size: int = 128  # -1: per output channel
    sym: bool = True
    format: str | None = None  # default per method (DEFAULT_FORMAT)
    desc_act: bool = False  # GPTQ act-order (g_idx permutes the groups)
    static_groups: bool = False  # GPTQ: groups fixed before act-order permutation
    act_scheme: str = "dynamic"  # W8A8 activations: "dynamic" per token | "static" per tensor (calibrated)
    modules_to_not_convert: list[str] = field(default_factory=list)
    lm_head: bool = False  # the LM head is quantized too (GPTQ formats; gptqmodel's "lm_head" flag)
    double_quant: bool = False  # NF4: the absmax values in 8 bits (bnb_4bit_use_double_quant)
    weight_strategy: str = "tensor"  # FP8 weight scales: "tensor" | "channel"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidParameterError(f"method must be one of {list(METHODS)}, got {self.method!r}", "method")
        if self.method in ("nf4", "fp8") or self.format in FLOAT_FORMATS:
            from cinq.layers.quantization.float_format import check_float_format
            check_float_format(self)
            return
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
            return
        check_grid(self.bits, self.group_size)
        if self.format == "awq":
            if self.bits != 4:
                raise InvalidParameterError(f"bits must be 4 for the AWQ GEMM format, got {self.bits}", "bits")
            if self.desc_act:
                raise InvalidParameterError("desc_act needs the GPTQ format (AWQ files have no g_idx)", "desc_act")

    @property
    def min_zero(self) -> int:
        """Smallest zero point the storage format can hold (GPTQ v1 stores zero - 1)."""
        return 1 if self.format == "gptq" else 0

    # ------------------------------------------------------------------------------------------ HF config

    def to_hf(self, recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``quantization_config`` of config.json for this format (what transformers / vLLM read).
        ``recorded``: how the file was made, as other tools record it (GPTQ's damp_percent, true_sequential;
        W8A8's smoothquant_alpha), placed among the format's keys."""
        meta = {"quantizer": ["cinq:0.1.0"], "method": self.method}
        skip = list(self.modules_to_not_convert) or None
        rec = dict(recorded or {})
        if self.format in FLOAT_FORMATS:
            from cinq.layers.quantization.float_format import float_to_hf
            return float_to_hf(self, meta)
        if self.format in ("gptq", "gptq_v2"):
            return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group_size,
                    "desc_act": self.desc_act, "sym": self.sym, "static_groups": self.static_groups,
                    **rec, "checkpoint_format": self.format, "lm_head": self.lm_head,
                    "modules_to_not_convert": skip, "meta": meta}
        if self.format == "awq":
            return {"quant_method": "awq", "bits": 4, "group_size": self.group_size, "zero_point": not self.sym,
                    "version": "gemm", **rec, "modules_to_not_convert": skip, "meta": meta}
        return {"quant_method": W8A8_QUANT_METHOD, "format_version": 1, "weight_bits": 8, "activation_bits": 8,
                "weight_scheme": "per_channel_symmetric", "activation_scheme": self.act_scheme,
                **rec, "modules_to_not_convert": skip, "meta": meta}

    def quantize_config_json(self, recorded: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """AutoGPTQ's separate quantize_config.json (GPTQ formats only)."""
        if self.format not in ("gptq", "gptq_v2"):
            return None
        out = self.to_hf(recorded)
        out.pop("quant_method")
        out.pop("modules_to_not_convert")
        return out

    @classmethod
    def from_hf(cls, qc: dict[str, Any]) -> QuantFormat:
        """Parse a ``quantization_config`` (GPTQ v1/v2, AWQ GEMM, cinq W8A8); errors name the field."""
        if not isinstance(qc, dict):
            raise ModelLoadError(f"quantization_config must be an object, got {type(qc).__name__}",
                                 "quantization_config")
        kind = str(qc.get("quant_method", "")).lower()
        skip = list(qc.get("modules_to_not_convert") or [])
        method = (qc.get("meta") or {}).get("method") if isinstance(qc.get("meta"), dict) else None
        try:
            from cinq.layers.quantization.float_format import FLOAT_QUANT_METHODS, float_from_hf
            if kind in FLOAT_QUANT_METHODS:
                return float_from_hf(cls, qc, kind)
            if kind == "gptq":
                fmt = str(qc.get("checkpoint_format", "gptq")).lower()
                if fmt not in ("gptq", "gptq_v2"):
                    raise ModelLoadError(f"quantization_config.checkpoint_format {fmt!r} is not supported "
                                         f"(gptq, gptq_v2)", "checkpoint_format")
                return cls(method=method if method in ("rtn", "gptq", "awq") else "gptq",
                           bits=int(qc.get("bits", 4)), group_size=int(qc.get("group_size", 128)),
                           sym=bool(qc.get("sym", True)), format=fmt, desc_act=bool(qc.get("desc_act", False)),
                           static_groups=bool(qc.get("static_groups", False)), modules_to_not_convert=skip,
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
                           act_scheme=str(qc.get("activation_scheme", "dynamic")), modules_to_not_convert=skip)
        except InvalidParameterError as e:
            raise ModelLoadError(f"quantization_config: {e}", e.param) from e
        raise ModelLoadError(f"quantization_config.quant_method {kind!r} is not supported "
                             f"(gptq, awq, {W8A8_QUANT_METHOD}, bitsandbytes, fp8, compressed-tensors)", "quant_method")

    # ------------------------------------------------------------------------------------- LinearFactory

    def skips(self, prefix: str) -> bool:
        """True when ``prefix`` names a module listed in modules_to_not_convert (kept dense)."""
        return any(re.match(m[3:], prefix) if m.startswith("re:") else  # compressed-tensors' regex entries
                   re.search(rf"(^|\.){re.escape(m)}(\.|$)", prefix) for m in self.modules_to_not_convert)

    def quantizes(self, prefix: str) -> bool:
        """True when checkpoint module ``prefix`` is stored quantized: not skipped, and the LM head only with the
        ``lm_head`` flag."""
        if prefix == "lm_head":
            return self.lm_head and not self.skips(prefix)
        return not self.skips(prefix)

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: torch.dtype,
                    output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> nn.Module:
        """The quantized linear of this format, computing in ``compute_dtype`` (merged from ``output_shards``;
        ``split``: this tensor-parallel rank's part)."""
        kw = {"prefix": prefix, "compute_dtype": compute_dtype, "output_shards": output_shards, "split": split}
        if self.format == "bnb_nf4":
            from cinq.layers.quantization.nf4_linear import NF4Linear
            return NF4Linear(in_features, out_features, bias, self.double_quant, **kw)
        if self.format in ("fp8", "compressed_tensors"):
            from cinq.layers.quantization.fp8_linear import FP8Linear
            return FP8Linear(in_features, out_features, bias, self.act_scheme, **kw)
        if self.format in ("gptq", "gptq_v2"):
            return GPTQLinear(in_features, out_features, bias, self.bits, self.group_size,
                              version=2 if self.format == "gptq_v2" else 1, **kw)
        if self.format == "awq":
            return AWQLinear(in_features, out_features, bias, self.group_size, **kw)
        return W8A8Linear(in_features, out_features, bias, static=self.act_scheme == "static", **kw)
