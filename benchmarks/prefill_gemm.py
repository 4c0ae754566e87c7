"""Prefill-sized linears on a CPU without bf16 instructions (issue 26): per projection of the ~110M random Llama
(benchmarks/random_model.py LLAMA_110M) and SmolLM2-135M, at 16-512 rows (--rows), the time of

* int4 (group 128; 64 where K is not a multiple of 128) and int8 (per channel) weights: cinq's native
  bf16-activation kernel vs dequantize + float32 GEMM a block of rows at a time (``fp32_gemm.fp32_linear``,
  what runs past ``NATIVE_MAX_ROWS``) vs the path before issue 26 (whole-weight dequantize, bf16 GEMM, emulated);
* int4 group 32 (GGUF Q4_0-like): the int8-activation kernel vs dequantize + float32 GEMM;
* dense bf16: the native skinny kernel (in chunks of rows past 8: ``chunked_small_m_linear``) vs
  ``dense_fp32_linear`` vs torch's bf16 GEMM.

The thresholds ``native.NATIVE_MAX_ROWS`` (int8), ``native.INT4_NATIVE_MAX_ROWS``, ``native.I8_DEQUANT_ROWS`` and
``fp32_gemm.DENSE_MIN_ROWS`` are read off this table. Best of up to 10 calls per cell (fewer for slow ones);
weights random (speed does not depend on them).

    python benchmarks/prefill_gemm.py                 # threads 1 and 2, writes benchmarks/results/prefill_gemm.md
    python benchmarks/prefill_gemm.py --threads 1 --rows 16,32,64 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cinq.bench.report import run_conditions  # noqa: E402
from cinq.kernels.cpu_native import (  # noqa: E402
    bf16_gemm_is_emulated,
    call_native,
    chunked_small_m_linear,
    small_m_linear_native,
    small_m_rows,
)
from cinq.kernels.fp32_gemm import dense_fp32_linear, fp32_linear  # noqa: E402
from cinq.layers.quantization import native  # noqa: E402
from cinq.layers.quantization.int8_activations import int4_affine_linear_i8  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# (model, projection, N, K): merged q/k/v and gate/up as cinq runs them
SHAPES = [("110M", "qkv", 2304, 768), ("110M", "o", 768, 768), ("110M", "gate_up", 4096, 768),
          ("110M", "down", 768, 2048), ("SmolLM2", "qkv", 960, 576), ("SmolLM2", "o", 576, 576),
          ("SmolLM2", "gate_up", 3072, 576), ("SmolLM2", "down", 576, 1536)]
COLUMNS = ["int4 kernel", "int4 fp32", "int4 before", "int8 kernel", "int8 fp32", "int8 before",
           "int4 g32 i8 kernel", "int4 g32 fp32", "dense native", "dense fp32", "dense bf16"]


def best_ms(fn: Callable[[], object], budget_s: float = 0.5) -> float:
    """The fastest of up to 10 calls (after one warm-up), fewer when one call is slow."""
    fn()
    times: list[float] = []
    while len(times) < 10 and sum(times) < budget_s:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def cells(n: int, k: int, m: int) -> dict[str, float]:
    """Every column's ms for one N x K projection at m rows."""
    g = torch.Generator().manual_seed(n * k)
    x = torch.randn(m, k, generator=g).bfloat16()
    g4 = 128 if k % 128 == 0 else 64  # SmolLM2's 576 channels: groups of 64
    s4 = torch.rand(n, k // g4, generator=g) * 0.01
    t4 = native.pack_int4_affine(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), s4, -8 * s4, g4)
    t8 = native.pack_int8_grouped(torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
                                  torch.rand(n, 1, generator=g) * 0.01, k)
    s32 = torch.rand(n, k // 32, generator=g) * 0.01
    t32 = native.pack_int4_affine(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), s32, -8 * s32, 32)
    w = torch.randn(n, k, generator=g).bfloat16()
    mod = native.grouped_module()

    def fp32(t: dict[str, torch.Tensor], group: int, deq: Callable) -> Callable[[], object]:
        return lambda: fp32_linear(x, lambda a, b: deq(native.rows_of(t, a, b), group), n)

    out = {"int4 kernel": best_ms(lambda: call_native(mod, "int4_affine_linear", x, t4["codes"], t4["scales"],
                                                      t4["mins"], g4)),
           "int4 fp32": best_ms(fp32(t4, g4, native.dequantize_int4_affine)),
           "int4 before": best_ms(lambda: F.linear(x, native.dequantize_int4_affine(t4, g4).bfloat16())),
           "int8 kernel": best_ms(lambda: call_native(mod, "int8_grouped_linear", x, t8["codes"], t8["scales"],
                                                      torch.empty(0), k)),
           "int8 fp32": best_ms(fp32(t8, k, native.dequantize_int8_grouped)),
           "int8 before": best_ms(lambda: F.linear(x, native.dequantize_int8_grouped(t8, k).bfloat16())),
           "int4 g32 i8 kernel": best_ms(lambda: int4_affine_linear_i8(x, t32, 32)),
           "int4 g32 fp32": best_ms(fp32(t32, 32, native.dequantize_int4_affine)),
           "dense native": best_ms(lambda: small_m_linear_native(x, w, None) if m <= small_m_rows()
                                   else chunked_small_m_linear(x, w, None)),
           "dense fp32": best_ms(lambda: fp32_linear(x, lambda a, b: w[a:b].float(), n)),
           "dense bf16": best_ms(lambda: F.linear(x, w))}
    assert dense_fp32_linear(x, w, None) is not None or m < 64  # the measured path is the one layers take
    return out


def headline(rows: list[dict[str, object]]) -> str:
    """The 1-thread 128-row int4 / int8 / dense layers: the emulated bf16 GEMM they ran before over the float32 one."""
    at = [r for r in rows if r["threads"] == 1 and r["rows"] == 128]
    parts = [f"{r['model']} {r['proj']}: int4 {r['int4 before'] / r['int4 fp32']:.1f}x, "
             f"int8 {r['int8 before'] / r['int8 fp32']:.1f}x, dense {r['dense bf16'] / r['dense fp32']:.1f}x"
             for r in at]
    return "128 rows, 1 thread, before (bf16 F.linear) / after (float32 GEMM): " + "; ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="16,32,64,128,512")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if native.grouped_module() is None or not bf16_gemm_is_emulated():
        print("needs the native grouped kernels and a CPU whose bf16 GEMM is emulated (AVX2)")
        return 1
    torch.set_grad_enabled(False)
    draft, conditions = run_conditions(os.getloadavg()[0])
    lines = ["# Prefill-sized linears: native kernels vs float32 GEMM (ms per call)", "", conditions, "",
             __doc__.split("\n\n")[0].replace("\n", " "), ""]
    rows: list[dict[str, object]] = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        lines += [f"## {threads} thread(s)", "", "| model | proj | N x K | rows | " + " | ".join(COLUMNS) + " |",
                  "|---|---|---|---:|" + "---:|" * len(COLUMNS)]
        for model, proj, n, k in SHAPES:
            for m in (int(r) for r in args.rows.split(",")):
                c = cells(n, k, m)
                rows.append({"threads": threads, "model": model, "proj": proj, "n": n, "k": k, "rows": m, **c})
                line = (f"| {model} | {proj} | {n} x {k} | {m} | "
                        + " | ".join(f"{c[col]:.2f}" for col in COLUMNS) + " |")
                print(line, flush=True)
                lines.append(line)
        lines.append("")
    lines += [f"Load average at the end: {os.getloadavg()[0]:.2f}. Generated by `benchmarks/prefill_gemm.py`."]
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "prefill_gemm.md").write_text("\n".join(lines) + "\n")
        (RESULTS / "prefill_gemm.json").write_text(json.dumps(
            {"kind": "prefill_gemm", "title": lines[0].lstrip("# "), "headline": headline(rows), "draft": draft,
             "rows": rows, "loadavg_at_end": os.getloadavg()[0]}, indent=1) + "\n")
    print("\n".join(lines[:3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
