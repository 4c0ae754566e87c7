"""Quantized checkpoint tensors as other engines write them (AutoGPTQ / transformers / vLLM), both ways.

Per quantized linear ``<prefix>`` (K = in_features, N = out_features, G = group size, K when per channel):

GPTQ (``quant_method: gptq``; ``checkpoint_format`` "gptq" = v1, "gptq_v2" = v2; bits 2, 3, 4, 8)
    ``qweight`` int32 [K * bits / 32, N]: 32/bits consecutive input channels per word, the lowest bits first.
                3 bits (AutoGPTQ's ``pack``): 32 channels per 3 words, read as one little-endian 96-bit stream,
                channel j in bits [3j, 3j + 3): channels 10 and 21 straddle words 0/1 and 1/2.
    ``qzeros``  int32 [ceil(K / G), N * bits / 32]: zero points packed the same way along N; v1 stores
                zero - 1 (the original AutoGPTQ convention, so a zero of 0 is not representable), v2 the zero.
    ``scales``  fp16 [ceil(K / G), N];  ``g_idx`` int32 [K] (group of each input channel; act-order permutes it).
AWQ GEMM (``quant_method: awq``, ``version: gemm``; 4 bits)
    ``qweight`` int32 [K, N / 8]: 8 output channels per word, output channel 8c + ORDER[i] in nibble i,
                ORDER = [0, 2, 4, 6, 1, 3, 5, 7];  ``qzeros`` int32 [K / G, N / 8] packed alike (zeros as is);
    ``scales``  fp16 [K / G, N].  No g_idx: groups are always k // G.
cinq W8A8 (``quant_method: cinq_w8a8``; SmoothQuant)
    ``weight`` int8 [N, K] symmetric per output channel, ``weight_scale`` fp32 [N] (W ~= weight * weight_scale),
    ``input_scale`` fp32 [1] only for static activations (x_int8 = round(x / input_scale)); dynamic activations
    are quantized per token at run time. The smoothing factors are already folded into the preceding norms.
Biases stay ``bias`` (fp16 in GPTQ/AWQ files, as those tools write them).

Everything here is torch-only and works on tensors; the test suite checks it against independent unpackers.
"""

from __future__ import annotations

import math

import torch

from cinq.errors import ModelLoadError
from cinq.layers.quantization.qweight import QuantizedWeight, default_g_idx

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds output channel 8c + AWQ_ORDER[i]


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) -> int32 with the same bits."""
    words = torch.where(words >= (1 << 31), words - (1 << 32), words)
    return words.to(torch.int32)


def pack_unit(bits: int) -> tuple[int, int]:
    """(values, int32 words) of the smallest whole packing unit at ``bits``: (32 / bits, 1) for 2, 4 and 8 bits,
    (32, 3) for 3 bits. A packed dimension must be a multiple of the unit's values."""
    if bits not in (2, 3, 4, 8):
        raise ValueError(f"cinq packs 2, 3, 4 or 8-bit values, got {bits}")
    return (32, 3) if bits == 3 else (32 // bits, 1)


def _pack_stream(v: torch.Tensor, bits: int) -> torch.Tensor:
    """int64 values [..., L] (L a multiple of 32) -> words [..., L * bits / 32] of one little-endian bit stream
    per 32 values (value j at bits [bits*j, bits*(j+1)); a value may straddle two words)."""
    v = v.reshape(*v.shape[:-1], -1, 32)
    words = torch.zeros(*v.shape[:-1], bits, dtype=torch.int64, device=v.device)
    for j in range(32):
        word, shift = divmod(bits * j, 32)
        words[..., word] |= (v[..., j] << shift) & 0xFFFFFFFF
        if shift + bits > 32:
            words[..., word + 1] |= v[..., j] >> (32 - shift)
    return words.reshape(*words.shape[:-2], -1)


def _unpack_stream(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``_pack_stream``: int64 words in [0, 2^32) [..., W] -> values [..., W * 32 / bits]."""
    w = w.reshape(*w.shape[:-1], -1, bits)
    mask = (1 << bits) - 1
    out = torch.empty(*w.shape[:-1], 32, dtype=torch.int64, device=w.device)
    for j in range(32):
        word, shift = divmod(bits * j, 32)
        value = w[..., word] >> shift
        if shift + bits > 32:
            value = value | (w[..., word + 1] << (32 - shift))
        out[..., j] = value & mask
    return out.reshape(*out.shape[:-2], -1)


def pack_along(values: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Pack unsigned ``values`` (< 2^bits) into int32 words along ``dim``: 32/bits consecutive entries per word,
    entry ``order[i]`` of each run in bit field i (field i = bits [i*bits, (i+1)*bits)). 3 bits: 32 entries per
    3 words as one bit stream (AutoGPTQ's layout; no ``order``)."""
    values_per, words_per = pack_unit(bits)
    if words_per > 1:
        v = values.to(torch.int64).movedim(dim, -1)
        if v.shape[-1] % values_per or order is not None:
            raise ValueError(f"cannot pack {v.shape[-1]} entries into {bits}-bit words ({values_per} per "
                             f"{words_per} words{', no order' if order is not None else ''})")
        return _to_int32(_pack_stream(v, bits)).movedim(-1, dim).contiguous()
    per = values_per
    v = values.to(torch.int64).movedim(dim, -1)
    if v.shape[-1] % per:
        raise ValueError(f"cannot pack {v.shape[-1]} entries into {bits}-bit words ({per} per word)")
    v = v.reshape(*v.shape[:-1], -1, per)
    if order is not None:
        v = v[..., list(order)]
    shifts = torch.arange(per, dtype=torch.int64, device=v.device) * bits
    words = (v << shifts).sum(-1)
    return _to_int32(words).movedim(-1, dim).contiguous()


def unpack_along(words: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of ``pack_along``: int32 words -> unsigned values (int32), 32/bits times longer along ``dim``."""
    values_per, words_per = pack_unit(bits)
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    if words_per > 1:
        if w.shape[-1] % words_per or order is not None:
            raise ValueError(f"cannot unpack {w.shape[-1]} words of {bits}-bit values ({words_per} words per "
                             f"{values_per})")
        return _unpack_stream(w, bits).to(torch.int32).movedim(-1, dim).contiguous()
    per = values_per
    shifts = torch.arange(per, dtype=torch.int64, device=w.device) * bits
    fields = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., words, per] field i at index i
    if order is not None:
        inverse = [0] * per
        for field, entry in enumerate(order):
            inverse[entry] = field
        fields = fields[..., inverse]
    out = fields.reshape(*fields.shape[:-2], -1).to(torch.int32)
    return out.movedim(-1, dim).contiguous()


# ---------------------------------------------------------------------------------------------------- GPTQ


def gptq_shapes(in_features: int, out_features: int, bits: int, group_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of one GPTQ linear (what the loader expects)."""
    groups = math.ceil(in_features / (in_features if group_size <= 0 else group_size))
    return {"qweight": (in_features * bits // 32, out_features),
            "qzeros": (groups, out_features * bits // 32),
            "scales": (groups, out_features),
            "g_idx": (in_features,)}


def gptq_pack(qw: QuantizedWeight, version: int = 1) -> dict[str, torch.Tensor]:
    """qweight/qzeros/scales/g_idx of ``qw`` in GPTQ v1 (zero - 1 stored) or v2 (zero stored) layout."""
    zeros = qw.zeros.to(torch.int64)
    if version == 1:
        if bool((zeros < 1).any()):
            raise ValueError("GPTQ v1 stores zero - 1 and cannot hold a zero point of 0; quantize with "
                             "min_zero=1 or write checkpoint_format gptq_v2")
        zeros = zeros - 1
    elif version != 2:
        raise ValueError(f"GPTQ version must be 1 or 2, got {version}")
    return {"qweight": pack_along(qw.qweight.t(), qw.bits, dim=0),
            "qzeros": pack_along(zeros, qw.bits, dim=1),
            "scales": qw.scales.to(torch.float16).contiguous(),
            "g_idx": qw.g_idx.to(torch.int32).clone()}


def gptq_unpack(tensors: dict[str, torch.Tensor], bits: int, group_size: int, version: int = 1,
                name: str = "") -> QuantizedWeight:
    """A ``QuantizedWeight`` from GPTQ tensors; ``name`` prefixes error messages."""
    qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
    q = unpack_along(qweight, bits, dim=0).t().contiguous()  # [N, K]
    n, k = q.shape
    zeros = unpack_along(qzeros, bits, dim=1)
    if version == 1:
        # AutoGPTQ adds 1 back after masking, so a stored nibble of 2^bits - 1 reads as 2^bits, as there.
        zeros = zeros + 1
    g_idx = tensors.get("g_idx")
    g_idx = default_g_idx(k, group_size) if g_idx is None else g_idx.long()
    if zeros.shape != scales.shape:
        raise ModelLoadError(f"{name}.qzeros: unpacks to {tuple(zeros.shape)} but {name}.scales is "
                             f"{tuple(scales.shape)} (bits={bits})")
    if g_idx.numel() != k or (k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= scales.shape[0])):
        raise ModelLoadError(f"{name}.g_idx: needs {k} entries in [0, {scales.shape[0]}) (group_size={group_size}),"
                             f" got {g_idx.numel()} in [{int(g_idx.min()) if k else 0}, "
                             f"{int(g_idx.max()) if k else 0}]")
    return QuantizedWeight(q.to(torch.uint8 if bits <= 8 else torch.int32), scales.float(), zeros.to(torch.int32),
                           g_idx, bits, group_size)


# ----------------------------------------------------------------------------------------------------- AWQ


def awq_shapes(in_features: int, out_features: int, group_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of one AWQ GEMM linear (4 bits)."""
    groups = in_features // (in_features if group_size <= 0 else group_size)
    return {"qweight": (in_features, out_features // 8),
            "qzeros": (groups, out_features // 8),
            "scales": (groups, out_features)}


def awq_pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """qweight/qzeros/scales of ``qw`` in AWQ GEMM layout (4 bits, sequential groups only)."""
    if qw.bits != 4:
        raise ValueError(f"AWQ GEMM files hold 4-bit weights, got bits={qw.bits}")
    if not qw.has_sequential_groups():
        raise ValueError("AWQ GEMM files have no g_idx: act-order (desc_act) weights need the GPTQ format")
    return {"qweight": pack_along(qw.qweight.t(), 4, dim=1, order=AWQ_ORDER),
            "qzeros": pack_along(qw.zeros, 4, dim=1, order=AWQ_ORDER),
            "scales": qw.scales.to(torch.float16).contiguous()}


def awq_unpack(tensors: dict[str, torch.Tensor], group_size: int, name: str = "") -> QuantizedWeight:
    """A ``QuantizedWeight`` from AWQ GEMM tensors."""
    q = unpack_along(tensors["qweight"], 4, dim=1, order=AWQ_ORDER).t().contiguous()  # [N, K]
    zeros = unpack_along(tensors["qzeros"], 4, dim=1, order=AWQ_ORDER)
    scales = tensors["scales"]
    if zeros.shape != scales.shape:
        raise ModelLoadError(f"{name}.qzeros: unpacks to {tuple(zeros.shape)} but {name}.scales is "
                             f"{tuple(scales.shape)}")
    k = q.shape[1]
    g = k if group_size <= 0 else group_size
    if k % g:
        raise ModelLoadError(f"{name}.qweight: in_features {k} is not a multiple of group_size {g} (AWQ)")
    return QuantizedWeight(q.to(torch.uint8), scales.float(), zeros, default_g_idx(k, group_size), 4, group_size)


# ---------------------------------------------------------------------------------------------------- W8A8


def w8a8_shapes(in_features: int, out_features: int, static: bool) -> dict[str, tuple[int, ...]]:
    out = {"weight": (out_features, in_features), "weight_scale": (out_features,)}
    if static:
        out["input_scale"] = (1,)
    return out


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes in [-127, 127] per output row of ``w`` [N, K] and the fp32 scales [N]."""
    amax = w.float().abs().amax(dim=1).clamp(min=1e-8)
    scale = amax / 127.0
    q = torch.round(w.float() / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def w8a8_pack(w: torch.Tensor, input_scale: float | None) -> dict[str, torch.Tensor]:
    """weight/weight_scale(/input_scale) of a float weight [N, K] (smoothing already applied)."""
    q, scale = quantize_int8_per_channel(w)
    out = {"weight": q.contiguous(), "weight_scale": scale.float().contiguous()}
    if input_scale is not None:
        out["input_scale"] = torch.tensor([float(input_scale)], dtype=torch.float32)
    return out
