"""GGUF's names for a Llama-family checkpoint, both ways, and the q/k row order of its ``llama`` architecture.

Tensor names follow llama.cpp's converter: ``token_embd``, ``output_norm``, ``output`` and, per layer,
``blk.N.attn_q`` ... (``LAYER_NAMES``). Hugging Face Llama checkpoints rotate the halves of each head (rotate-half
rope: pairs (i, i + d/2)); the GGUF ``llama`` architecture rotates adjacent pairs (2i, 2i + 1), so its q/k rows are
permuted per head (``ROPE_PERMUTED``); Qwen2 and Qwen3 keep rotate-half and are stored as they are. The writer
(cinq/export/gguf.py) applies ``permute_for_llama_rope``; the reader undoes it with ``unpermute_rows``.
"""

from __future__ import annotations

import re

import torch

# cinq architecture -> (GGUF architecture, q/k rows permuted for adjacent-pair rope)
ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "LlamaForCausalLM": ("llama", True),
    "MistralForCausalLM": ("llama", True),  # llama.cpp's converter writes Mistral as llama too
    "Qwen2ForCausalLM": ("qwen2", False),
    "Qwen3ForCausalLM": ("qwen3", False),
}
# GGUF architecture -> cinq architecture (a file says "mistral" only when written by tools other than llama.cpp's)
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                      "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                      "gemma3": "Gemma3ForCausalLM"}
ROPE_PERMUTED = {"llama", "mistral"}
# architectures whose norm weights llama.cpp's converter stores as 1 + w (Gemma's (1 + w) RMSNorm): the reader
# subtracts 1 so that the model's norms hold HF's w (as transformers' GGUF loader does)
NORM_PLUS_ONE = {"gemma3"}
# per-architecture layer names that differ from LAYER_NAMES (Gemma's four norms per block)
ARCH_LAYER_NAMES: dict[str, dict[str, str]] = {
    "gemma3": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
}

GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
_GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_HF_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}
_HF_LAYER = {v: k for k, v in LAYER_NAMES.items()}


def _layer_names(arch: str | None) -> dict[str, str]:
    extra = ARCH_LAYER_NAMES.get(arch or "")
    return LAYER_NAMES if extra is None else {**LAYER_NAMES, **extra}


def gguf_tensor_name(hf_name: str, arch: str | None = None) -> str | None:
    """The GGUF name of a Hugging Face checkpoint tensor (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``), or None for a name with no GGUF counterpart. ``arch``: the GGUF architecture
    (names that differ per family, ``ARCH_LAYER_NAMES``)."""
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    names = _layer_names(arch)
    m = _HF_LAYER_RE.fullmatch(hf_name)
    if m is None or m.group(2) not in names:
        return None
    return f"blk.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def hf_tensor_name(gguf_name: str, arch: str | None = None) -> str | None:
    """The Hugging Face name of a GGUF tensor (the inverse of ``gguf_tensor_name``), or None."""
    if gguf_name in _HF_GLOBAL:
        return _HF_GLOBAL[gguf_name]
    hf_layer = _HF_LAYER if arch not in ARCH_LAYER_NAMES else {v: k for k, v in _layer_names(arch).items()}
    m = _GGUF_LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in hf_layer:
        return None
    return f"model.layers.{m.group(1)}.{hf_layer[m.group(2)]}.{m.group(3)}"


def permute_for_llama_rope(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows of a q/k projection (weight [heads * d, in] or bias [heads * d]) reordered per head from rotate-half
    rope order to adjacent-pair order: row j < d/2 of a head goes to 2j, row d/2 + j to 2j + 1."""
    d = w.shape[0] // num_heads
    return w.reshape(num_heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def unpermute_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row index undoing ``permute_for_llama_rope``: Hugging Face row r is GGUF row ``index[r]``. An index rather
    than a reshape, so that it also reorders rows of quantized blocks (each row's blocks move whole)."""
    d = num_rows // num_heads
    return torch.arange(num_rows).reshape(num_heads, d // 2, 2).transpose(1, 2).reshape(-1)
