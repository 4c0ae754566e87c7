"""A dense model folder as one GGUF file that llama.cpp runs (``cinq export --format gguf``).

The ``gguf`` package (a dependency: cinq reads GGUF files too) writes the file and quantizes in numpy.
Tensor names and metadata follow llama.cpp's own converter: ``token_embd``, ``blk.N.attn_q`` ..., the
``<arch>.*`` hyper-parameters and the tokenizer (cinq/export/gguf_vocab.py).

Two layout facts make llama.cpp's tokens equal cinq's:
- *Rope.* Hugging Face Llama checkpoints rotate the halves of each head (rotate-half: pairs (i, i + d/2)); the
  GGUF ``llama`` architecture rotates adjacent pairs (2i, 2i + 1). The rows of q_proj and k_proj (and their
  biases) are permuted per head so that pair (i, i + d/2) lands on (2i, 2i + 1): ``permute_for_llama_rope``.
  Qwen2 and Qwen3 run in llama.cpp with rotate-half rope, so they are written as they are.
- *Tied embeddings* are written once, as ``token_embd``: llama.cpp uses it as the output when ``output`` is absent.

Types per ``outtype``: 1-D tensors (norms, biases) always float32; ``bf16``: every matrix bf16; ``q8_0``: every
matrix q8_0 (as llama.cpp's converter does); ``q4_0``: the decoder's linears q4_0, the embedding and output q8_0
(llama.cpp's own q4_0 keeps the output matrix at higher precision too, q6_K, which the gguf package cannot
write). A matrix whose rows are not a whole number of 32-value blocks stays bf16 (listed in the result).

Quantized checkpoints (GPTQ / AWQ / W8A8) are refused: export the dense folder they were made from, so that
llama.cpp quantizes the same weights cinq's own quantizers start from.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.export import GGUF_OUTTYPES
from cinq.export.gguf_vocab import GGUFVocab, read_gguf_vocab
from cinq.model.config import ModelConfig
from cinq.model.gguf.names import ARCHITECTURES, gguf_tensor_name, permute_for_llama_rope
from cinq.model.loader import iter_checkpoint

log = logging.getLogger(__name__)

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # recomputed by every runtime


@dataclass(slots=True)
class GGUFExportResult:
    """What ``export_gguf`` wrote."""

    path: Path
    outtype: str
    architecture: str
    tensor_types: dict[str, str]  # GGUF tensor name -> GGML type name ("BF16", "Q4_0", ...)
    num_bytes: int
    seconds: float
    kept_bf16: list[str] = field(default_factory=list)  # matrices whose rows are not whole quant blocks
    vocab: GGUFVocab | None = None


def export_gguf(model: str | Path, out: str | Path, outtype: str = "bf16") -> GGUFExportResult:
    """Write the dense model folder ``model`` as the GGUF file ``out`` with matrices of type ``outtype``
    (bf16, q8_0, q4_0). The file appears whole or not at all (written beside, then renamed)."""
    import gguf

    t0 = time.perf_counter()
    if outtype not in GGUF_OUTTYPES:
        raise InvalidParameterError(f"outtype must be one of {', '.join(GGUF_OUTTYPES)}, got {outtype!r}",
                                    "outtype")
    out = Path(out)
    if out.is_dir():
        raise InvalidParameterError(f"out: {out} is a folder; give the path of the .gguf file to write", "out")
    folder = Path(model)
    config = ModelConfig.from_pretrained(folder)
    arch, permute = _check_exportable(config, folder)
    vocab = read_gguf_vocab(folder, config.vocab_size, config.eos_token_ids)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        _add_metadata(writer, gguf, config, vocab, folder.name, outtype)
        types, kept = {}, []
        for name, values in _gguf_tensors(folder, config, permute):
            qtype = _tensor_type(gguf, name, values, outtype)
            if qtype == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(name, values.copy())  # owned: the source buffer is the checkpoint reader's
            else:
                writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
            if values.ndim == 2 and qtype == gguf.GGMLQuantizationType.BF16 and outtype != "bf16":
                kept.append(name)
            types[name] = qtype.name
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    if kept:
        log.warning("%s: rows not a multiple of 32, kept in bf16: %s", out, ", ".join(kept))
    return GGUFExportResult(path=out, outtype=outtype, architecture=arch, tensor_types=types,
                            num_bytes=out.stat().st_size, seconds=time.perf_counter() - t0, kept_bf16=kept,
                            vocab=vocab)


def _check_exportable(config: ModelConfig, folder: Path) -> tuple[str, bool]:
    """(GGUF architecture, permute q/k) for ``config``; a ModelLoadError naming the field for what llama.cpp would
    run differently from cinq."""
    source = folder / "config.json"
    if config.quantization_config:
        method = config.quantization_config.get("quant_method", "?")
        raise ModelLoadError(f"{source}: a quantized checkpoint ({method}) is not exported to GGUF; export the "
                             f"dense folder it was made from (--outtype q8_0 / q4_0 quantizes for llama.cpp)",
                             "quantization_config")
    if config.rope_scaling:
        raise ModelLoadError(f"{source}: rope_scaling {config.rope_scaling.get('rope_type')!r} is not exported to "
                             f"GGUF yet (only plain rope)", "rope_scaling")
    if config.hidden_act != "silu":
        raise ModelLoadError(f"{source}: hidden_act {config.hidden_act!r}: llama.cpp's {config.architecture} "
                             f"runs silu", "hidden_act")
    if config.mlp_bias:
        raise ModelLoadError(f"{source}: mlp_bias is not exported to GGUF", "mlp_bias")
    arch, permute = ARCHITECTURES[config.architecture]
    if config.attention_bias and arch == "qwen3":
        raise ModelLoadError(f"{source}: attention_bias with Qwen3 is not exported to GGUF", "attention_bias")
    return arch, permute


def _add_metadata(writer, gguf, config: ModelConfig, vocab: GGUFVocab, name: str, outtype: str) -> None:
    writer.add_name(name)
    # cinq caps the context at a shorter sliding window (it attends to whole contexts only): the file states the
    # same limit, within which both runtimes compute the same thing
    writer.add_context_length(min(config.max_position_embeddings,
                                  config.sliding_window or config.max_position_embeddings))
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[outtype]
    writer.add_file_type(ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    if vocab.bos_token_id is not None:
        writer.add_bos_token_id(vocab.bos_token_id)
    if vocab.eos_token_id is not None:
        writer.add_eos_token_id(vocab.eos_token_id)
    if vocab.pad_token_id is not None:
        writer.add_pad_token_id(vocab.pad_token_id)
    writer.add_add_bos_token(vocab.add_bos_token)
    writer.add_add_eos_token(False)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def _gguf_tensors(folder: Path, config: ModelConfig, permute: bool) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 values) for every tensor of the checkpoint, one at a time in the checkpoint's order (the
    caller converts each before the next is read: memory holds the output, not a float32 copy of the model);
    after the last, a ModelLoadError if one the model needs was missing."""
    seen: set[str] = set()
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for tensor in iter_checkpoint(folder):
        if tensor.name.endswith(_IGNORED_SUFFIXES):
            continue
        name = gguf_tensor_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{folder}: checkpoint tensor '{tensor.name}' has no GGUF counterpart", tensor.name)
        if name == "output.weight" and config.tie_word_embeddings:
            continue  # the same values as token_embd, which llama.cpp reuses
        values = tensor.load().to(torch.float32)
        role = name.split(".")[-2]
        if permute and role in heads:
            values = permute_for_llama_rope(values, heads[role])
        seen.add(name)
        yield name, values.contiguous().numpy()
    missing = [n for n in _expected_names(config) if n not in seen]
    if missing:
        raise ModelLoadError(f"{folder}: checkpoint tensors missing for GGUF: {', '.join(missing[:4])}"
                             f"{' ...' if len(missing) > 4 else ''}", "model")


def _expected_names(config: ModelConfig) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"] + ([] if config.tie_word_embeddings else ["output.weight"])
    per_layer = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                 "ffn_down"] + (["attn_q_norm", "attn_k_norm"] if config.qk_norm else [])
    return names + [f"blk.{i}.{n}.weight" for i in range(config.num_hidden_layers) for n in per_layer]


def _tensor_type(gguf, name: str, values: np.ndarray, outtype: str):
    q = gguf.GGMLQuantizationType
    if values.ndim < 2:
        return q.F32  # llama.cpp's norms and bias adds take float32
    wanted = {"bf16": q.BF16, "q8_0": q.Q8_0, "q4_0": q.Q4_0}[outtype]
    if outtype == "q4_0" and name in ("token_embd.weight", "output.weight"):
        wanted = q.Q8_0
    block = gguf.GGML_QUANT_SIZES[wanted][0]
    return wanted if values.shape[-1] % block == 0 else q.BF16
