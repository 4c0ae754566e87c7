"""Merged GPTQ linears whose output shards carry different act-order ``g_idx``: one kernel per run of shards.

cinq loads q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj``. cinq's own GPTQ quantizes the
projections of one input with one Hessian, so their act-order permutations (``g_idx``) agree, and AutoGPTQ /
GPTQModel files usually agree too; but those tools may quantize each projection with its own Hessian order, and
then each shard's input channels fall into groups in a different order.

Why separate kernels (and not one): the fast kernels make act-order groups contiguous by gathering the input
once with one permutation of K (kernels.py, ``perm``), which a merged weight whose shards need different
permutations cannot have. The alternatives were worse: expanding scales and zeros per input channel runs the
whole layer on the dequantize-then-matmul path on every call (tens of times slower at decode, and 2x the codes'
bytes), and one kernel taking a g_idx per output shard would be a new kernel for every device. So the
shards are split into runs of adjacent shards that share a g_idx (q and k may agree while v differs: two runs),
each run is prepared as its own ``QuantizedWeight`` by the ordinary ``prepare_weight_only`` (the same kernel
choice as an unmerged projection of that size), and the runs' outputs, computed from the same input, are
concatenated along N. The weights streamed are the same bytes as one merged kernel's; the cost is one kernel
launch and one input gather per extra run, and only such files pay it: when every shard agrees (or there is no
act-order at all) the layer is one ``QuantizedWeight`` and one kernel exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cinq.layers.quantization.kernels import Prepared, weight_only_mm

SHARD_KERNELS = "shard_kernels"  # the kind of a merged linear served as one kernel per run of shards


def g_idx_runs(rows: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """Runs of adjacent shards whose g_idx (``rows``, one per shard in output order) are equal, as (first shard,
    one past the last), in output order; a single run when all the shards agree."""
    runs: list[tuple[int, int]] = []
    for i, row in enumerate(rows):
        if runs and (row is rows[runs[-1][0]] or torch.equal(row, rows[runs[-1][0]])):
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


class ShardKernel(nn.Module):
    """One run's prepared kernel: its tensors as (non-persistent) buffers, its kind and integer argument."""

    def __init__(self, prepared: Prepared) -> None:
        super().__init__()
        for name, t in prepared.tensors.items():
            self.register_buffer(name, t, persistent=False)
        self.kind = prepared.kind
        self.group = prepared.arg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weight_only_mm(self.kind, self._buffers, self.group, x)

    def extra_repr(self) -> str:
        return f"kernel={self.kind}"


class ShardKernels(nn.Module):
    """The runs of a merged linear, in output order: y = cat(run(x) for each run) along the last dimension."""

    def __init__(self, parts: list[Prepared]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(ShardKernel(p) for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def dense_weight(self, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        """W [N, K] as the kernels compute it (read back through them: y = I W^T)."""
        device = next(iter(self.parts[0]._buffers.values())).device
        eye = torch.eye(in_features, dtype=dtype, device=device)
        return self(eye).t().contiguous()
