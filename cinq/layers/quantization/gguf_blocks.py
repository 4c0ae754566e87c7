"""GGUF's 32-value quantization blocks that cinq serves without requantizing: Q8_0, Q4_0 and Q4_1.

Per block of 32 consecutive input channels of one output row (llama.cpp's ggml-common.h layouts):
    Q8_0  34 bytes: d fp16 | 32 x int8 q                      W = d * q
    Q4_0  18 bytes: d fp16 | 16 bytes of nibbles              W = d * (q - 8)
    Q4_1  20 bytes: d fp16 | m fp16 | 16 bytes of nibbles     W = d * q + m
Nibbles: byte j holds value j in its low half and value j + 16 in its high half.

Q4_K (super-blocks of 256 values, 144 bytes: d fp16 | dmin fp16 | 12 bytes of 6-bit scales and mins, one pair
per 32 values | 128 bytes of nibbles, 64 values per 32 bytes: the first 32 in the low halves, the next 32 in the
high ones; W = d * sc * q - dmin * m) is served in the same affine form per 32 values, with float32 scale d * sc
and offset -(dmin * m) (exact: d * sc needs more bits than an fp16 has), its codes in the nibble order above.

Q5_0 (22 bytes: d fp16 | 4 bytes of fifth bits, bit j for value j | 16 bytes of nibbles; W = d * (q - 16)) is
served as Q8_0: ``q5_0_as_q8_0`` rewrites each block as d and the 32 values q - 16 as int8 codes, the same W
exactly, so its layers run the Q8_0 kernels (34 bytes per 32 weights streamed, against 64 dequantized to bf16).

``decode_blocks`` turns a row-major [N, K / 32 * block bytes] byte matrix into integer codes and float32 scales
and offsets per (row, block) in the affine form every kernel here takes, W = scale * code + offset (Q4_0's offset
is -8d). The form is exact: d and m are fp16, a code has at most 8 bits, so scale * code is exact in float32 and
scale * code + offset rounds once, as the gguf package's reference dequantization does — the values equal it bit
for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
NATIVE_TYPES = tuple(BLOCK_BYTES)
# k-quant types served from their own blocks: bytes per 32 values (rows must hold whole super-blocks of 256)
K_BLOCK_BYTES = {"Q4_K": 18}
# bytes the int8-activation kernels read per 32 values, as served (Q4_K: codes, a float32 scale and offset)
SERVED_BYTES = {**BLOCK_BYTES, "Q4_K": 24}
QK_K, Q4_K_BYTES = 256, 144
# file types served as one of those, exactly (the same weight values): file type -> served type
TRANSCODED = {"Q5_0": "Q8_0"}
Q5_0_BYTES = 22


def served_type(type_name: str) -> str | None:
    """The block type a file's ``type_name`` matrix is served as (itself, or what it is transcoded to); None:
    dequantized at load."""
    return type_name if type_name in NATIVE_TYPES or type_name in K_BLOCK_BYTES else TRANSCODED.get(type_name)


def row_bytes(type_name: str, in_features: int) -> int:
    """Bytes of one row of ``in_features`` values as ``type_name`` blocks."""
    return in_features // BLOCK * {**BLOCK_BYTES, **K_BLOCK_BYTES}[type_name]


def values_per_block(type_name: str) -> int:
    """What a row's length must be a multiple of for ``type_name``."""
    return QK_K if type_name in K_BLOCK_BYTES else BLOCK


def q4_k_affine(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks uint8 [N, K / 256 * 144] -> (codes uint8 [N, K] 0..15, scales and offsets float32 [N, K / 32]):
    W = scale * code + offset per 32 values, the gguf package's values exactly."""
    n, width = raw.shape
    blocks = raw.reshape(n, width // Q4_K_BYTES, Q4_K_BYTES)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [n, b, 1]
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    packed = blocks[..., 4:16].to(torch.int32)
    low, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    # sub-blocks 0-3: 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7: a nibble of bytes 8-11 and the top 2 bits
    sc = torch.cat([low & 63, (top & 0x0F) | ((low >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (top >> 4) | ((mid >> 6) << 4)], dim=-1)
    qs = blocks[..., 16:].reshape(n, -1, 4, 1, 32)
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(n, -1)  # sub-block 2c: low halves of bytes 32c..
    return codes, (d * sc.float()).reshape(n, -1), (-(dmin * mn.float())).reshape(n, -1)


def q5_0_as_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q5_0 blocks uint8 [N, K / 32 * 22] as Q8_0 blocks [N, K / 32 * 34] of the same values: d as it is, each
    5-bit value minus 16 as an int8 code."""
    n, row_bytes = raw.shape
    blocks = raw.reshape(n, row_bytes // Q5_0_BYTES, Q5_0_BYTES)
    high = blocks[..., 2:6].contiguous().view(torch.int32)  # [n, b, 1]: bit j is value j's fifth bit
    packed = blocks[..., 6:].to(torch.int32)
    low = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # byte j: value j low, value j + 16 high
    fifth = (high >> torch.arange(BLOCK, dtype=torch.int32)) & 1
    codes = ((low | (fifth << 4)) - 16).to(torch.int8)
    return torch.cat([blocks[..., 0:2], codes.view(torch.uint8)], dim=-1).reshape(n, -1)


@dataclass(slots=True)
class BlockCodes:
    """A GGUF block-quantized matrix decoded: ``codes`` [N, K] (int8 for Q8_0, uint8 0..15 for the 4-bit types),
    ``scales`` and ``offsets`` float32 [N, K / 32] (offsets None for Q8_0)."""

    type_name: str
    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None

    @property
    def bits(self) -> int:
        return 8 if self.type_name == "Q8_0" else 4

    def dequantize(self) -> torch.Tensor:
        """W [N, K] float32, computed as the kernels mean it: scale * code (+ offset), per block."""
        n, k = self.codes.shape
        w = self.codes.float().view(n, k // BLOCK, BLOCK) * self.scales.unsqueeze(-1)
        if self.offsets is not None:
            w = w + self.offsets.unsqueeze(-1)
        return w.view(n, k)


def decode_blocks(raw: torch.Tensor, type_name: str) -> BlockCodes:
    """Decode ``raw`` uint8 [N, K / 32 * BLOCK_BYTES[type_name]] into codes, scales and offsets."""
    if type_name == "Q4_K":
        return BlockCodes(type_name, *q4_k_affine(raw))
    n, row_bytes = raw.shape
    size = BLOCK_BYTES[type_name]
    blocks = raw.reshape(n, row_bytes // size, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    if type_name == "Q8_0":
        codes = blocks[..., 2:].contiguous().view(torch.int8).reshape(n, -1)
        return BlockCodes(type_name, codes, d, None)
    start = 4 if type_name == "Q4_1" else 2
    packed = blocks[..., start:]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(n, -1)  # low halves: values 0..15
    if type_name == "Q4_1":
        offsets = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
    else:
        offsets = d * -8.0
    return BlockCodes(type_name, codes, d, offsets)
