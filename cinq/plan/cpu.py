"""What CPU this is, in the words a report prints: its name, core count and the vector instructions cinq's native
kernels pick their path by (a figure from a Zen 3 with AVX2 only and one from a Zen 4 with AVX512-BF16 differ by
1.5x on the same code, so every report says which it ran on)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def vector_isa(cpuinfo: str | None = None) -> str:
    """The widest of the instruction sets the native kernels use: AMX, AVX512-BF16, AVX2 + FMA, or "" where
    /proc/cpuinfo says none of them (or is absent)."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                      if line.startswith(("flags", "Features"))), []))
    if {"amx_bf16", "amx_tile"} <= flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    if {"avx2", "fma"} <= flags:
        return "AVX2 + FMA, no AVX512-BF16"
    return ""


def cpu_label(cpuinfo: str | None = None) -> str:
    """E.g. "AMD EPYC, 2 cores, AVX512-BF16": /proc/cpuinfo's model name (else the platform's), the cores this
    process may use, ``vector_isa``."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                platform.processor() or "unknown CPU")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return ", ".join(p for p in (name, f"{cores} cores", vector_isa(text)) if p)
