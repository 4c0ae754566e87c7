"""`cinq plan --measure`: this machine's memory read bandwidth and bf16 matmul FLOP/s, measured in a second or
two, so that the CPU row of the device table can be replaced by what this machine does now (on a shared
machine that changes with the load; the best of a few repeats is taken)."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Measured:
    """What the probe saw."""

    bandwidth_gbs: float  # reading a buffer far larger than the caches
    tflops: float  # bf16 square matmul
    threads: int


def read_bandwidth(buffer_mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a streaming read with torch's current thread count: a sum over a ``buffer_mib`` float32 tensor
    (float32: torch's bf16 sum is not vectorised), far larger than the caches, best of ``repeats``. The one read
    probe of cinq: ``cinq plan --measure``, the throughput benchmark's roofline and the decode kernels' benchmark
    all use it. Where the machine gives 2 MB pages (as the engine's weights and KV caches get them,
    cinq.host_memory) the buffer is read in 4 KB and in 2 MB pages and the better is the machine's: on the 2-core
    Zen 4 VM 2 MB pages read 1.08x more at 1 thread and 4 KB pages 1.35x more at 2 in one run
    (benchmarks/results/huge_pages.md), 2 MB pages 1.1-1.3x more at both in ad hoc runs the same day."""
    import torch

    from cinq.host_memory import huge_page_tensor, huge_pages_available
    n = buffer_mib * (1 << 20) // 4
    buffers = [lambda: torch.empty(n)]
    if huge_pages_available():
        buffers.append(lambda: huge_page_tensor(n * 4).view(torch.float32))
    best = float("inf")
    for make in buffers:
        x = make()
        x.fill_(1.0)  # touch every page first: the first pass would measure page faults, not reads
        x.sum()
        for _ in range(repeats):
            t = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t)
        del x
    return n * 4 / best


def matmul_flops(n: int = 2048, dtype: str = "bfloat16", repeats: int = 5) -> float:
    """FLOP/s of an n x n x n ``dtype`` matmul with torch's current thread count, best of ``repeats``: the compute
    peak the machine reaches (float32 on CPUs without bf16 instructions, where torch emulates bf16 GEMMs). The
    one compute probe of cinq: ``cinq plan --measure`` and the throughput benchmark's roofline use it."""
    import torch
    a = torch.randn(n, n).to(getattr(torch, dtype))
    b = torch.randn(n, n).to(getattr(torch, dtype))
    a @ b  # warm-up: oneDNN picks and caches its kernel
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def measure(buffer_mib: int = 512, matmul_n: int = 2048, repeats: int = 5) -> Measured:
    """Read bandwidth (``read_bandwidth`` over ``buffer_mib``) and bf16 FLOP/s (``matmul_flops``), with torch's
    current thread count."""
    import torch
    bandwidth = read_bandwidth(buffer_mib, repeats) / 1e9
    return Measured(bandwidth, matmul_flops(matmul_n, "bfloat16", repeats) / 1e12, torch.get_num_threads())
