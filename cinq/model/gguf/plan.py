"""How cinq serves each tensor of a GGUF file (``GGUFFormat``, the ``LinearFactory`` of the file), and the
``config.json`` dict ``ModelConfig`` is built from (``gguf_model_dict``), without importing the model (the layer is
imported when a linear is built), so ``ModelConfig`` reads a GGUF file with no import circle.

Q8_0 / Q4_0 / Q4_1 / Q4_K matrices of the decoder's linears (and the LM head, also when it is the tied embedding)
are served from their own blocks by ``GGUFLinear``, Q5_0 ones as Q8_0 blocks of the same values
(gguf_blocks.TRANSCODED); a merged projection (q/k/v, gate/up) natively when its shards are served as one type,
else dequantized; every other type dequantized at load (cinq/model/gguf/weights.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cinq.layers.quantization.gguf_blocks import served_type
from cinq.model.gguf.config import gguf_config_dict
from cinq.model.gguf.file import GGUF_QUANT_METHOD, GGUFFile, GGUFTensorInfo
from cinq.model.gguf.names import hf_tensor_name
from cinq.model.gguf.tokenizer import end_of_turn_ids

FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# the checkpoint modules of each model linear, as GGUF names per layer, and the merged module they load into
_LINEAR_GROUPS = {("attn_q", "attn_k", "attn_v"): "self_attn.qkv_proj", ("attn_output",): None,
                  ("ffn_gate", "ffn_up"): "mlp.gate_up_proj", ("ffn_down",): None}


@dataclass(slots=True)
class GGUFFormat:
    """The ``LinearFactory`` of a GGUF file: which checkpoint modules are served from their own blocks (and as which
    type), and the load line's account of every tensor type. ``native``: HF module prefix -> GGUF type."""

    gguf: GGUFFile
    head_from_embedding: bool
    native: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, gguf: GGUFFile, num_layers: int, tied: bool) -> GGUFFormat:
        t = gguf.tensors
        head = "token_embd.weight" if tied else "output.weight"
        fmt = cls(gguf, tied and served_type(t[head].type_name) is not None)
        for i in range(num_layers):
            for parts, merged in _LINEAR_GROUPS.items():
                infos = [t.get(f"blk.{i}.{p}.weight") for p in parts]
                kinds = {served_type(info.type_name) for info in infos if info is not None}
                if len(kinds) == 1 and (kind := kinds.pop()) is not None:
                    for p in parts:
                        fmt.native[hf_tensor_name(f"blk.{i}.{p}.weight").rsplit(".", 1)[0]] = kind
                    if merged is not None:
                        fmt.native[f"model.layers.{i}.{merged}"] = kind
        if head in t and (kind := served_type(t[head].type_name)) is not None:
            fmt.native["lm_head"] = kind
        return fmt

    def quantizes(self, prefix: str) -> bool:
        return prefix in self.native

    def decoder_bits(self) -> int:
        """The code bits of the type most decoder linears are served as (4 or 8), 16 when most are dense."""
        kinds = [k for name, k in self.native.items() if name.startswith("model.layers.")]
        if not kinds:
            return 16
        top = max(set(kinds), key=kinds.count)
        return 8 if top in ("Q8_0", "Q5_0") else 4

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: Any,
                    output_shards: Any = None, split: Any = None) -> Any:
        from cinq.layers.quantization.gguf_linear import GGUFLinear
        return GGUFLinear(in_features, out_features, bias, self.native[prefix], prefix, compute_dtype=compute_dtype,
                          output_shards=output_shards, split=split)

    def summary(self) -> str:
        """What the file holds and what cinq does with each tensor type, for the load line."""
        counts = Counter((info.type_name, self._how(info)) for info in self.gguf.tensors.values())
        parts = [f"{n} {kind} {how}" for (kind, how), n in sorted(counts.items(), key=lambda kv: -kv[1])]
        if self.head_from_embedding:
            parts.append(f"the LM head served from the tied embedding's {self.native['lm_head']} blocks")
        ftype = self.gguf.get("general.file_type")
        return f"GGUF v{self.gguf.version}{f' (file type {ftype})' if ftype is not None else ''}: " + ", ".join(parts)

    def _how(self, info: GGUFTensorInfo) -> str:
        if info.type_name in FLOAT_DTYPES:
            return "as is"
        name = hf_tensor_name(info.name)
        if name is not None and (served := self.native.get(name.rsplit(".", 1)[0])) is not None:
            return "served natively" if served == info.type_name else f"served as {served} blocks"
        return "dequantized at load"


def gguf_model_dict(gguf: GGUFFile) -> dict[str, Any]:
    """The ``config.json`` dict of the model as cinq serves it: ``quantization_config`` says it is GGUF
    (``quant_method: gguf``) and carries the load line's summary; with the LM head served from a quantized tied
    embedding it is untied (the head is then its own quantized linear over the same blocks); end-of-turn control
    tokens join the eos ids, as llama.cpp does."""
    cfg = gguf_config_dict(gguf)
    fmt = GGUFFormat.of(gguf, cfg["num_hidden_layers"], cfg["tie_word_embeddings"])
    if fmt.head_from_embedding:
        cfg["tie_word_embeddings"] = False
    cfg["quantization_config"] = {"quant_method": GGUF_QUANT_METHOD, "summary": fmt.summary(),
                                  # for `cinq plan`: the bits most decoder linears are served with (16: dense) in
                                  # blocks of 32, and whether the head reads the embedding's own blocks
                                  "bits": fmt.decoder_bits(), "group_size": 32, "tied_head": fmt.head_from_embedding}
    eos = [cfg["eos_token_id"]] if "eos_token_id" in cfg else []
    cfg["eos_token_id"] = list(dict.fromkeys(eos + end_of_turn_ids(gguf)))
    return cfg
