"""Prefill-sized linears on a CPU without bf16 instructions (issue 26): per projection of the ~110M random Llama
(benchmarks/random_model.py LLAMA_110M) and SmolLM2-135M, at 16-512 rows (--rows), the time of

* int4 (group 128; 64 where K is not a multiple of 128) and int8 (per channel) weights: cinq's native
  bf16-activation kernel vs dequantize + float32 GEMM a block of rows at a time (``prefill_gemm.fp32_linear``,
  what runs past ``NATIVE_MAX_ROWS``) vs the path before issue 26 (whole-weight dequantize, bf16 GEMM, emulated);
* int4 group 32 (GGUF Q4_0-like): the int8-activation kernel vs dequantize + float32 GEMM;
* dense bf16: the native skinny kernel (in chunks of rows past 8: ``chunked_small_m_linear``) vs
  ``dense_fp32_linear`` vs torch's bf16 GEMM.

The thresholds ``native.NATIVE_MAX_ROWS`` (int8), ``native.INT4_NATIVE_MAX_ROWS``, ``native.I8_DEQUANT_ROWS`` and
``prefill_gemm.DENSE_MIN_ROWS`` are read off this table. Best of up to 10 calls per cell (fewer for slow ones);
weights random (speed does not depend on them).

On a CPU with bf16 instructions (AVX512-BF16, AMX) it measures instead, for SmolLM2's projections in the GGUF
file's layouts (Q4_1: fp16 scale and minimum per 32 weights; Q8_0), at 64-2,048 rows: the int8-activation kernel
vs dequantize + float32 GEMM (what ran there before) vs dequantize + bf16 GEMM (``prefill_gemm.bf16_block_linear``,
what runs from ``gguf_linear.DEQUANT_ROWS`` now, on the native one-pass dequantization ``native.bf16_weight_rows``;
Q4_1's "bf16 torch" column dequantizes with torch's ops instead); a GPTQ / AWQ int4 layer's bf16 GEMM (group 128,
64 where K is not a multiple of 128; float32 scales and mins) on torch's and on the native dequantization; beside
the dense bf16 GEMM on a weight already in bf16 (no dequantization: the floor). Writes benchmarks/results/prefill_gemm_bf16.{md,json}.

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
from cinq.kernels.prefill_gemm import bf16_block_linear, dense_fp32_linear, fp32_linear  # noqa: E402
from cinq.layers.quantization import native  # noqa: E402
from cinq.layers.quantization.gguf_linear import dequantize_i8_int4, dequantize_i8_int8, weight_rows  # noqa: E402
from cinq.layers.quantization.int8_activations import int4_affine_linear_i8, int8_grouped_linear_i8  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# (model, projection, N, K): merged q/k/v and gate/up as cinq runs them
SHAPES = [("110M", "qkv", 2304, 768), ("110M", "o", 768, 768), ("110M", "gate_up", 4096, 768),
          ("110M", "down", 768, 2048), ("SmolLM2", "qkv", 960, 576), ("SmolLM2", "o", 576, 576),
          ("SmolLM2", "gate_up", 3072, 576), ("SmolLM2", "down", 576, 1536)]
COLUMNS = ["int4 kernel", "int4 fp32", "int4 before", "int8 kernel", "int8 fp32", "int8 before",
           "int4 g32 i8 kernel", "int4 g32 fp32", "dense native", "dense fp32", "dense bf16"]


COLUMNS_BF16 = ["q4_1 i8 kernel", "q4_1 fp32", "q4_1 bf16 torch", "q4_1 bf16", "q8_0 i8 kernel", "q8_0 fp32",
                "q8_0 bf16", "gptq int4 torch", "gptq int4", "dense bf16"]


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


def cells_bf16(n: int, k: int, m: int) -> dict[str, float]:
    """Every column of the bf16-instruction table for one N x K projection at m rows (GGUF's own tensors)."""
    g = torch.Generator().manual_seed(n * k)
    x = torch.randn(m, k, generator=g).bfloat16()
    q4 = {"codes": torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8),
          "scales": (torch.rand(n, k // 32, generator=g) * 0.01).half(),
          "mins": (torch.rand(n, k // 32, generator=g) * -0.01).half()}
    q8 = {"codes": torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
          "scales": (torch.rand(n, k // 32, generator=g) * 0.01).half()}
    w = torch.randn(n, k, generator=g).bfloat16()
    g4 = 128 if k % 128 == 0 else 64  # a GPTQ / AWQ int4 layer: float32 scales and mins (pack_int4_affine)
    s4 = torch.rand(n, k // g4, generator=g) * 0.01
    gptq = native.pack_int4_affine(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), s4,
                                   torch.randn(n, k // g4, generator=g) * 0.01, g4)

    def deq4(a: int, b: int) -> torch.Tensor:
        return dequantize_i8_int4(native.rows_of(q4, a, b), "gguf_q4_1_i8")

    def deq8(a: int, b: int) -> torch.Tensor:
        return dequantize_i8_int8(native.rows_of(q8, a, b))

    return {"q4_1 i8 kernel": best_ms(lambda: int4_affine_linear_i8(x, q4, 32, 0)),
            "q4_1 fp32": best_ms(lambda: fp32_linear(x, deq4, n)),
            "q4_1 bf16 torch": best_ms(lambda: bf16_block_linear(x, deq4, n)),
            "q4_1 bf16": best_ms(lambda: bf16_block_linear(x, weight_rows(q4, "gguf_q4_1_i8"), n)),
            "q8_0 i8 kernel": best_ms(lambda: int8_grouped_linear_i8(x, q8, 32)),
            "q8_0 fp32": best_ms(lambda: fp32_linear(x, deq8, n)),
            "q8_0 bf16": best_ms(lambda: bf16_block_linear(x, weight_rows(q8, "gguf_q8_0_i8"), n)),
            "gptq int4 torch": best_ms(lambda: bf16_block_linear(
                x, lambda a, b: native.dequantize_int4_affine(native.rows_of(gptq, a, b), g4), n)),
            "gptq int4": best_ms(lambda: bf16_block_linear(x, native.bf16_weight_rows(gptq, g4, 4), n)),
            "dense bf16": best_ms(lambda: F.linear(x, w))}


def headline_bf16(rows: list[dict[str, object]]) -> str:
    """Per thread count, at 256 and 2,048 rows: the summed SmolLM2 layer's time, each path over the bf16 GEMM's."""
    parts = []
    for threads in sorted({int(r["threads"]) for r in rows}):
        for m in (256, 2048):
            at = [r for r in rows if r["threads"] == threads and r["rows"] == m]
            if not at:
                continue
            tot = {c: sum(float(r[c]) for r in at) for c in COLUMNS_BF16}
            parts.append(f"{m} rows, {threads} thr: Q4_1 fp32 / bf16 {tot['q4_1 fp32'] / tot['q4_1 bf16']:.2f}x, "
                         f"kernel / bf16 {tot['q4_1 i8 kernel'] / tot['q4_1 bf16']:.2f}x; Q8_0 kernel / bf16 "
                         f"{tot['q8_0 i8 kernel'] / tot['q8_0 bf16']:.2f}x; GPTQ int4 torch / native dequantization "
                         f"{tot['gptq int4 torch'] / tot['gptq int4']:.2f}x")
    return "a SmolLM2 layer's four linears, time over the bf16 GEMM's: " + "; ".join(parts)


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
    ap.add_argument("--rows", default=None, help="default 16,32,64,128,512 (bf16 instructions: 64,128,256,512,2048)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if native.grouped_module() is None:
        print("needs the native grouped kernels")
        return 1
    emulated = bf16_gemm_is_emulated()
    torch.set_grad_enabled(False)
    draft, conditions = run_conditions(os.getloadavg()[0])
    if emulated:
        title, columns, shapes, measure, stem = ("Prefill-sized linears: native kernels vs float32 GEMM (ms per call)",
                                                 COLUMNS, SHAPES, cells, "prefill_gemm")
        rows_arg = args.rows or "16,32,64,128,512"
        intro = __doc__.split("\n\n")[0].replace("\n", " ")
    else:
        title, columns, shapes, measure, stem = ("Prefill-sized GGUF linears with bf16 instructions: kernel vs float32 "
                                                 "vs bf16 GEMM (ms per call)", COLUMNS_BF16,
                                                 [s for s in SHAPES if s[0] == "SmolLM2"], cells_bf16,
                                                 "prefill_gemm_bf16")
        rows_arg = args.rows or "64,128,256,512,2048"
        intro = __doc__.split("\n\n")[2].replace("\n", " ")
    lines = [f"# {title}", "", conditions, "", intro, ""]
    rows: list[dict[str, object]] = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        lines += [f"## {threads} thread(s)", "", "| model | proj | N x K | rows | " + " | ".join(columns) + " |",
                  "|---|---|---|---:|" + "---:|" * len(columns)]
        for model, proj, n, k in shapes:
            for m in (int(r) for r in rows_arg.split(",")):
                c = measure(n, k, m)
                rows.append({"threads": threads, "model": model, "proj": proj, "n": n, "k": k, "rows": m, **c})
                line = (f"| {model} | {proj} | {n} x {k} | {m} | "
                        + " | ".join(f"{c[col]:.2f}" for col in columns) + " |")
                print(line, flush=True)
                lines.append(line)
        lines.append("")
    head = headline(rows) if emulated else headline_bf16(rows)
    lines += [f"**{head}**", "", f"Load average at the end: {os.getloadavg()[0]:.2f}. Generated by "
              f"`benchmarks/prefill_gemm.py`."]
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
        (RESULTS / f"{stem}.json").write_text(json.dumps(
            {"kind": "prefill_gemm", "title": title, "headline": head, "draft": draft,
             "rows": rows, "loadavg_at_end": os.getloadavg()[0]}, indent=1) + "\n")
    print("\n".join(lines[:3]))
    print(head)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
