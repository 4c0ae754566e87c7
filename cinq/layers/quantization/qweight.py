"""The quantized weight every weight-only format unpacks to, and the grids cinq can store and serve.

A weight W [N out, K in] is stored as unsigned integers q in [0, 2^bits - 1] with, per (group, output channel),
a float scale s and an integer zero point z:  W[n, k] ~= s[g(k), n] * (q[n, k] - z[g(k), n]),  where g = g_idx
maps each input channel to its group. This is the GPTQ/AWQ convention; the file formats (packing.py) and the
serving kernels (kernels.py) all start from a ``QuantizedWeight``. How the integers are chosen (the grid math of
RTN/GPTQ/AWQ) is the offline tool's business: cinq/quant/grid.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class QuantizedWeight:
    """Integer weight with its grid. ``qweight`` [N, K] (uint8/int16/int32 values in [0, 2^bits)), ``scales``
    and ``zeros`` [num_groups, N], ``g_idx`` [K] (group of each input channel)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    group_size: int  # -1: one group spanning all K input channels

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[0]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [N, K] in ``dtype`` (computed in float32)."""
        g = self.g_idx.long()
        s = self.scales.float()[g].t()  # [N, K]
        z = self.zeros.float()[g].t()
        return ((self.qweight.float() - z) * s).to(dtype)

    def rows(self, lo: int, hi: int) -> QuantizedWeight:
        """Output channels [lo, hi) (linears quantized stacked, e.g. q/k/v sharing one Hessian, split back)."""
        return QuantizedWeight(self.qweight[lo:hi].contiguous(), self.scales[:, lo:hi].contiguous(),
                               self.zeros[:, lo:hi].contiguous(), self.g_idx.clone(), self.bits, self.group_size)

    def groups_in_use(self) -> QuantizedWeight:
        """Only the groups ``g_idx`` refers to, renumbered from 0: a tensor-parallel row shard of sequential groups
        is then sequential again (an act-order one keeps the groups its channels scatter over)."""
        lo, hi = int(self.g_idx.min()), int(self.g_idx.max()) + 1
        return QuantizedWeight(self.qweight, self.scales[lo:hi], self.zeros[lo:hi], self.g_idx - lo, self.bits,
                               self.group_size)

    def has_sequential_groups(self) -> bool:
        """True when g_idx is the plain k // group_size (no act-order permutation)."""
        return bool(torch.equal(self.g_idx.long(), default_g_idx(self.in_features, self.group_size)))


def default_g_idx(in_features: int, group_size: int) -> torch.Tensor:
    """k // group_size for every input channel (all zeros for per-channel quantization)."""
    g = in_features if group_size <= 0 else group_size
    return torch.arange(in_features, dtype=torch.long) // g


SUPPORTED_BITS = (2, 3, 4, 8)  # weight-only grids cinq stores (GPTQ packing); 2 and 3 serve dequantized at load
KERNEL_BITS = (4, 8)  # grids with integer CPU kernels (kernels.py); the others run as dense linears


def check_grid(bits: int, group_size: int) -> None:
    """Reject grids cinq cannot store or serve."""
    if bits not in SUPPORTED_BITS:
        raise InvalidParameterError(f"bits must be one of {', '.join(map(str, SUPPORTED_BITS))}, got {bits!r}",
                                    "bits")
    if not isinstance(group_size, int) or not (group_size == -1 or group_size >= 1):
        raise InvalidParameterError(f"group_size must be -1 (per channel) or a positive integer, got {group_size!r}",
                                    "group_size")


def storage_dtype(bits: int) -> torch.dtype:
    return torch.uint8 if bits <= 8 else torch.int32
