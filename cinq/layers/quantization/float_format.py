"""The ``quantization_config`` of the float-code formats, both ways (``QuantFormat`` delegates here):

* ``bnb_nf4``: transformers' ``BitsAndBytesConfig`` with ``load_in_4bit``, ``bnb_4bit_quant_type: nf4`` and
  ``bnb_4bit_use_double_quant`` (the block size is not in the config: each weight's quant state carries it; the
  skipped modules are ``llm_int8_skip_modules``).
* ``fp8``: vLLM's ``quant_method: fp8`` (``activation_scheme`` static | dynamic, ``ignored_layers``): e4m3 weights
  with one scale per tensor.
* ``compressed_tensors``: llm-compressor's ``quant_method: compressed-tensors``, ``format: float-quantized``, one
  config group whose ``weights`` are ``{num_bits: 8, type: float, strategy: tensor | channel}`` and whose
  ``input_activations`` are none (weight-only), ``{strategy: token, dynamic: true}`` or ``{strategy: tensor,
  dynamic: false}`` (a calibrated ``input_scale``); ``ignore`` lists the dense modules (``re:`` entries are
  regular expressions).
"""

from __future__ import annotations

from typing import Any

from cinq.errors import InvalidParameterError, ModelLoadError

FLOAT_QUANT_METHODS = ("bitsandbytes", "fp8", "compressed-tensors")
NF4_BLOCKSIZES = (64, 128, 256, 512, 1024, 2048, 4096)
FP8_ACT_SCHEMES = ("dynamic", "static", "none")
FP8_STRATEGIES = ("tensor", "channel")


def check_float_format(f: Any) -> None:
    """Validate (and complete the defaults of) a float-code ``QuantFormat``; errors name the field."""
    if f.method == "nf4":
        f.format = f.format or "bnb_nf4"
        if f.format != "bnb_nf4":
            raise InvalidParameterError(f"format {f.format!r} does not fit method 'nf4' (bnb_nf4)", "format")
        f.bits = 4 if f.bits is None else f.bits
        if f.bits != 4:
            raise InvalidParameterError(f"bits must be 4 for NF4, got {f.bits}", "bits")
        if f.group_size not in NF4_BLOCKSIZES:
            raise InvalidParameterError(f"group_size (the NF4 block size) must be one of {list(NF4_BLOCKSIZES)}, "
                                        f"got {f.group_size}", "group_size")
    elif f.method == "fp8":
        if f.weight_strategy not in FP8_STRATEGIES:
            raise InvalidParameterError(f"weight_strategy must be one of {list(FP8_STRATEGIES)}, got "
                                        f"{f.weight_strategy!r}", "weight_strategy")
        if f.act_scheme not in FP8_ACT_SCHEMES:
            raise InvalidParameterError(f"act_scheme must be one of {list(FP8_ACT_SCHEMES)} for FP8, got "
                                        f"{f.act_scheme!r}", "act_scheme")
        vllm_fp8 = f.weight_strategy == "tensor" and f.act_scheme != "none"
        f.format = f.format or ("fp8" if vllm_fp8 else "compressed_tensors")
        if f.format == "fp8" and not vllm_fp8:
            raise InvalidParameterError("format 'fp8' (vLLM's) has per-tensor weight scales and quantized "
                                        "activations only; use compressed_tensors", "format")
        if f.format not in ("fp8", "compressed_tensors"):
            raise InvalidParameterError(f"format {f.format!r} does not fit method 'fp8' (fp8, compressed_tensors)",
                                        "format")
        f.bits = 8 if f.bits is None else f.bits
        if f.bits != 8:
            raise InvalidParameterError(f"bits must be 8 for FP8 (e4m3), got {f.bits}", "bits")
        f.group_size = -1
    else:
        raise InvalidParameterError(f"format {f.format!r} needs method 'nf4' or 'fp8', not {f.method!r}", "format")
    if f.lm_head:
        raise InvalidParameterError(f"lm_head quantization is written in the GPTQ formats only, not {f.format!r}",
                                    "lm_head")


def float_to_hf(f: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The ``quantization_config`` of a float-code format."""
    skip = list(f.modules_to_not_convert)
    if f.format == "bnb_nf4":
        return {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": f.double_quant, "bnb_4bit_compute_dtype": "bfloat16",
                "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": skip or None, "llm_int8_threshold": 6.0,
                "llm_int8_has_fp16_weight": False, "llm_int8_enable_fp32_cpu_offload": False,
                "blocksize": f.group_size, "meta": meta}
    if f.format == "fp8":
        return {"quant_method": "fp8", "activation_scheme": f.act_scheme, "ignored_layers": skip or None,
                "meta": meta}
    acts = None
    if f.act_scheme == "dynamic":
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
                "group_size": None, "block_structure": None, "actorder": None, "observer": None,
                "observer_kwargs": {}}
    elif f.act_scheme == "static":
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False,
                "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                "observer_kwargs": {}}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": f.weight_strategy, "dynamic": False,
               "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": "float-quantized"}},
            "ignore": ["lm_head", *skip], "kv_cache_scheme": None, "global_compression_ratio": None,
            "sparsity_config": {}, "meta": meta}


def float_from_hf(cls: Any, qc: dict[str, Any], kind: str) -> Any:
    """Parse a float-code ``quantization_config`` (``kind``: its quant_method); errors name the field."""
    if kind == "bitsandbytes":
        if not qc.get("load_in_4bit", qc.get("_load_in_4bit", False)):
            raise ModelLoadError("quantization_config: bitsandbytes 8-bit (LLM.int8) checkpoints are not supported; "
                                 "cinq reads load_in_4bit NF4", "load_in_4bit")
        qt = str(qc.get("bnb_4bit_quant_type", "fp4")).lower()
        if qt != "nf4":
            raise ModelLoadError(f"quantization_config.bnb_4bit_quant_type {qt!r} is not supported (nf4)",
                                 "bnb_4bit_quant_type")
        return cls(method="nf4", format="bnb_nf4", group_size=int(qc.get("blocksize", 64)),
                   double_quant=bool(qc.get("bnb_4bit_use_double_quant", False)),
                   modules_to_not_convert=list(qc.get("llm_int8_skip_modules") or []))
    if kind == "fp8":
        if qc.get("weight_block_size"):
            raise ModelLoadError("quantization_config.weight_block_size: block-wise FP8 is not supported "
                                 "(per-tensor scales)", "weight_block_size")
        scheme = str(qc.get("activation_scheme", "dynamic"))
        if scheme not in ("dynamic", "static"):
            raise ModelLoadError(f"quantization_config.activation_scheme {scheme!r}: dynamic or static",
                                 "activation_scheme")
        return cls(method="fp8", format="fp8", act_scheme=scheme, weight_strategy="tensor",
                   modules_to_not_convert=list(qc.get("ignored_layers") or []))
    return _compressed_tensors(cls, qc)


def _compressed_tensors(cls: Any, qc: dict[str, Any]) -> Any:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if fmt != "float-quantized" or len(groups) != 1:
        raise ModelLoadError(f"quantization_config: compressed-tensors with format {fmt!r} and {len(groups)} config "
                             f"group(s): cinq reads one 'float-quantized' (FP8) group", "format")
    (group,) = groups.values()
    w = group.get("weights") or {}
    if w.get("type") != "float" or int(w.get("num_bits", 0)) != 8:
        raise ModelLoadError(f"quantization_config.config_groups weights {w.get('type')}/{w.get('num_bits')} bits: "
                             f"cinq reads 8-bit float (FP8 e4m3)", "config_groups")
    strategy = w.get("strategy")
    if strategy not in FP8_STRATEGIES:
        raise ModelLoadError(f"quantization_config.config_groups weights.strategy {strategy!r}: tensor or channel",
                             "strategy")
    a = group.get("input_activations")
    if a is None:
        scheme = "none"
    elif a.get("type") == "float" and int(a.get("num_bits", 0)) == 8 and a.get("dynamic") \
            and a.get("strategy") == "token":
        scheme = "dynamic"
    elif a.get("type") == "float" and int(a.get("num_bits", 0)) == 8 and not a.get("dynamic") \
            and a.get("strategy") == "tensor":
        scheme = "static"
    else:
        raise ModelLoadError(f"quantization_config.config_groups input_activations {a}: cinq reads FP8 dynamic "
                             f"per-token or static per-tensor ones", "input_activations")
    skip = [m for m in (qc.get("ignore") or []) if m != "lm_head"]
    return cls(method="fp8", format="compressed_tensors", act_scheme=scheme, weight_strategy=strategy,
               modules_to_not_convert=skip)
