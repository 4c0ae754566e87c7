"""NF4: the 4-bit NormalFloat format of QLoRA / bitsandbytes, as transformers serializes a ``load_in_4bit`` model.

A weight W [N, K] is flattened row-major and cut into blocks of ``blocksize`` values (64 by default); each block
keeps its largest magnitude ``absmax`` (float32) and stores every value as the index (0..15) of the nearest of the
16 NF4 levels (``NF4_LEVELS``: quantiles of a standard normal, rescaled to [-1, 1], with an exact zero) to
``w / absmax``. Two indices per byte, the first value in the high nibble. Dequantized: ``level[q] * absmax``.

Double quantization (``bnb_4bit_use_double_quant``) stores the absmax values themselves in 8 bits: minus their
mean (``nested_offset``), cut into blocks of 256, each block's largest magnitude kept (``nested_absmax``) and each
value as the index of the nearest entry of the signed 8-bit dynamic map (``nested_quant_map``, see
``dynamic_map``). absmax = nested_map[code] * nested_absmax[block] + offset.

Checkpoint tensors of one linear ``<prefix>.`` (bitsandbytes' ``QuantState.as_dict(packed=True)``):
``weight`` uint8 [N * K / 2, 1]; ``weight.absmax`` float32 [N * K / blocksize] (uint8 when double quantized);
``weight.quant_map`` float32 [16]; ``weight.nested_absmax`` float32, ``weight.nested_quant_map`` float32 [256]
(double quantized); ``weight.quant_state.bitsandbytes__nf4`` uint8: the UTF-8 JSON of quant_type, blocksize,
dtype, shape (and nested_blocksize, nested_dtype, nested_offset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from cinq.errors import ModelLoadError

# The NF4 levels (QLoRA, Dettmers et al. 2023, appendix E): bitsandbytes' quant_map for nf4, as float32.
NF4_LEVELS = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=torch.float32, device="cpu")  # a CPU tensor even when first imported while a model is built on "meta"
NESTED_BLOCKSIZE = 256  # bitsandbytes' block of the double-quantized absmax values
STATE_KEY = "quant_state.bitsandbytes__nf4"
# checkpoint suffixes after "<prefix>.weight" (the quant state's tensors)
SUFFIXES = ("", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", "." + STATE_KEY)


def dynamic_map() -> torch.Tensor:
    """The signed 8-bit dynamic map of double quantization (256 float32 values, sorted): for each of 7 decades
    10^-6 .. 10^0, 2^d evenly spaced fraction midpoints in [0.1, 1] of that decade (d = 0..6), both signs; then
    0 and 1, and zeros filling the rest (Dettmers 2015, "8-bit approximations"; bitsandbytes' create_dynamic_map
    with its defaults)."""
    values: list[float] = []
    for d in range(7):
        n = 2 ** d
        edges = torch.linspace(0.1, 1.0, n + 1, dtype=torch.float32, device="cpu")
        mids = (edges[1:] + edges[:-1]) / 2.0
        decade = 10.0 ** (d - 6)
        # products in float32 (a float32 tensor times the decade), as the reference map rounds them
        values += (mids * decade).tolist() + (mids * -decade).tolist()
    values += [0.0, 1.0]
    values += [0.0] * (256 - len(values))
    return torch.tensor(sorted(values), dtype=torch.float32, device="cpu")


def _nearest(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index of the nearest of the sorted ``levels`` for each x (ties to the upper one), uint8."""
    mids = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(x, mids, right=False).to(torch.uint8)


@dataclass(slots=True)
class NF4Weight:
    """One weight's NF4 data, decoded from its checkpoint tensors: ``packed`` uint8 [N, K / 2] (bitsandbytes' byte
    order), ``absmax`` float32 [N * K / blocksize] (double quantization undone), ``levels`` [16]."""

    packed: torch.Tensor
    absmax: torch.Tensor
    levels: torch.Tensor
    blocksize: int
    shape: tuple[int, int]

    def codes(self) -> torch.Tensor:
        """uint8 [N, K] in 0..15."""
        n, k = self.shape
        b = self.packed.reshape(-1)
        return torch.stack([b >> 4, b & 15], dim=1).reshape(n, k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [N, K]: level[q] * absmax[block] in float32 (bitsandbytes' arithmetic), then ``dtype``."""
        n, k = self.shape
        vals = self.levels[self.codes().long()].reshape(-1, self.blocksize)
        return (vals * self.absmax.unsqueeze(1)).reshape(n, k).to(dtype)


def nf4_quantize(w: torch.Tensor, blocksize: int = 64, double_quant: bool = False,
                 dtype_name: str = "bfloat16") -> dict[str, torch.Tensor]:
    """The checkpoint tensors of W [N, K] (suffixes after ``weight``, as ``SUFFIXES``), bitsandbytes' layout.
    ``dtype_name``: the dense dtype recorded in the quant state (what bitsandbytes dequantizes to)."""
    n, k = w.shape
    if (n * k) % blocksize or blocksize not in (64, 128, 256, 512, 1024, 2048, 4096):
        raise ValueError(f"nf4: blocksize {blocksize} must be a power of two in 64..4096 dividing N * K = {n * k}")
    blocks = w.float().reshape(-1, blocksize)
    absmax = blocks.abs().amax(dim=1)
    norm = blocks / absmax.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1)
    q = _nearest(norm.reshape(-1), NF4_LEVELS)
    packed = ((q[0::2] << 4) | q[1::2]).reshape(-1, 1)
    state = {"quant_type": "nf4", "blocksize": blocksize, "dtype": dtype_name, "shape": [n, k]}
    out = {"": packed.contiguous(), ".quant_map": NF4_LEVELS.clone()}
    if double_quant:
        offset = absmax.mean()
        centered = absmax - offset
        pad = (-centered.numel()) % NESTED_BLOCKSIZE
        nb = torch.nn.functional.pad(centered, (0, pad)).reshape(-1, NESTED_BLOCKSIZE)
        nested_absmax = nb.abs().amax(dim=1)
        nmap = dynamic_map()
        codes = _nearest((nb / nested_absmax.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1)).reshape(-1),
                         nmap)[: centered.numel()]
        out.update({".absmax": codes, ".nested_absmax": nested_absmax, ".nested_quant_map": nmap})
        state.update({"nested_blocksize": NESTED_BLOCKSIZE, "nested_dtype": "float32",
                      "nested_offset": float(offset)})
    else:
        out[".absmax"] = absmax
    out["." + STATE_KEY] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    return out


def read_state(t: torch.Tensor, where: str) -> dict:
    """The quant state's JSON (a uint8 tensor of UTF-8 bytes); errors name ``where``."""
    try:
        state = json.loads(bytes(t.to(torch.uint8).reshape(-1).tolist()).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelLoadError(f"{where}.weight.{STATE_KEY}: not a JSON quant state ({e})") from None
    if not isinstance(state, dict):
        raise ModelLoadError(f"{where}.weight.{STATE_KEY}: expected a JSON object")
    return state


def decode_nf4(t: dict[str, torch.Tensor], where: str) -> NF4Weight:
    """An ``NF4Weight`` from one linear's checkpoint tensors ``t`` (keyed by ``SUFFIXES``); errors name the tensor."""
    state = read_state(t["." + STATE_KEY], where)
    if state.get("quant_type") != "nf4":
        raise ModelLoadError(f"{where}: quant_type {state.get('quant_type')!r} is not supported (nf4)", "quant_type")
    try:
        n, k = (int(v) for v in state["shape"])
        blocksize = int(state["blocksize"])
    except (KeyError, TypeError, ValueError):
        raise ModelLoadError(f"{where}.weight.{STATE_KEY}: needs 'shape' [N, K] and 'blocksize'") from None
    if blocksize <= 0 or (n * k) % blocksize or (n * k) % 2:
        raise ModelLoadError(f"{where}: blocksize {blocksize} does not divide the weight's {n} x {k} values")
    packed = t[""]
    if packed.numel() != n * k // 2:
        raise ModelLoadError(f"{where}.weight: {packed.numel()} bytes, the quant state's shape {[n, k]} needs "
                             f"{n * k // 2}")
    levels = t[".quant_map"].float().reshape(-1)
    if levels.numel() != 16:
        raise ModelLoadError(f"{where}.weight.quant_map: {levels.numel()} values, NF4 has 16")
    absmax = t[".absmax"]
    if absmax.numel() != n * k // blocksize:
        raise ModelLoadError(f"{where}.weight.absmax: {absmax.numel()} values, {n * k // blocksize} blocks")
    if "nested_offset" in state:
        if ".nested_absmax" not in t or ".nested_quant_map" not in t:
            raise ModelLoadError(f"{where}: double-quantized absmax without weight.nested_absmax / nested_quant_map")
        nb = int(state.get("nested_blocksize", NESTED_BLOCKSIZE))
        nmap = t[".nested_quant_map"].float().reshape(-1)
        scale = t[".nested_absmax"].float().reshape(-1)
        idx = torch.arange(absmax.numel()) // nb
        if scale.numel() < int(idx[-1]) + 1:
            raise ModelLoadError(f"{where}.weight.nested_absmax: {scale.numel()} values, {int(idx[-1]) + 1} blocks")
        absmax = nmap[absmax.reshape(-1).long()] * scale[idx] + float(state["nested_offset"])
    return NF4Weight(packed.reshape(n, k // 2).contiguous(), absmax.float().reshape(-1).contiguous(), levels,
                     blocksize, (n, k))
