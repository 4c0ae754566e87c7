"""Decode linears at the memory roofline: how fast cinq's native small-M kernels stream their weights, as a real
decode step reads them (every weight once, from memory), against the read bandwidth measured in the same run.

Kernels: bf16 (cinq/kernels/cpu/small_m_gemm.cpp), int8 per channel and int8 group 32 (GGUF Q8_0), int4 affine
groups 32 / 64 / 128 (GGUF Q4_0 / Q4_1, GPTQ / AWQ; cinq/kernels/cpu/grouped_int_linear.cpp), NF4 block 64
(bitsandbytes) and FP8 e4m3 per channel (cinq/kernels/cpu/float_code_linear.cpp; ``--kernels`` picks a subset).
Shapes: SmolLM2-135M's decode linears (merged qkv, o_proj, merged gate_up, down_proj; 30 layers) and its LM head.
For each (kernel, shape) the weights are allocated 30 times (the layers), or as many times as it takes to pass 4x
the last-level cache where that is more, and called in turn, so that no call finds its weight in cache; GB/s =
weight bytes (codes + float32 scales / mins) / time, best of ``--repeats`` passes, at 1 and 2 threads and M = 1, 2,
5, 8 rows (``--rows``). The read probe is ``cinq.plan.probe.read_bandwidth`` at the same thread count. Also
measured: the cost of one parallel region (waking torch's OpenMP workers) under this process's OMP_WAIT_POLICY and,
in child processes, under the others, and the per-call overhead of the kernel's three ways in: pybind, the
C++-registered op, a Python custom op.

    python benchmarks/decode_kernels.py            # writes benchmarks/results/decode_kernels.{json,md}
    python benchmarks/decode_kernels.py --quick    # fewer passes, smoke run
    python benchmarks/decode_kernels.py --render   # the .md again from the saved .json
    python benchmarks/decode_kernels.py --kernels "bf16,int8 per-channel,int4 g64,nf4 b64,fp8 per-channel" \
        --out benchmarks/results/decode_kernels_float_codes   # the float-code formats against bf16 / int
    python benchmarks/decode_kernels.py \
        --kernels "bf16,int8 g32,q8_0 i8,int4 g32,q4_0 i8,q4_1 i8,int4 g64,int4 g64 i8" \
        --repeats 2 --out benchmarks/results/decode_kernels_int8_activations \
        --before benchmarks/results/decode_kernels_int8_activations.json   # int8 activations, against the last run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch, as the engine does: the wake-up cost measured is the engine's

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.decode_kernels_grid import KERNELS, LAYERS, ROWS, SHAPES, THREADS  # noqa: E402
from benchmarks.decode_kernels_report import render  # noqa: E402
from cinq.kernels import cpu_native, custom_ops  # noqa: E402,F401  (custom_ops: torch.ops.cinq.*)
from cinq.layers.quantization import native  # noqa: E402
from cinq.plan.cpu import cpu_label  # noqa: E402
from cinq.plan.probe import read_bandwidth  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
LLC_BYTES = 32 << 20


def _group(kernel: str, k: int) -> int | None:
    """The kernel's group size for K input channels (None: the group does not divide K)."""
    if kernel == "bf16":
        return 0
    if kernel.startswith(("int8 per-channel", "fp8 per-channel")):
        return k
    if kernel.startswith("q"):  # GGUF blocks
        return 32
    if kernel.startswith("nf4"):
        return int(kernel.split("b")[-1])
    g = int(kernel.split("g")[-1].split()[0])
    return g if k % g == 0 else None


def make_weight(kernel: str, n: int, k: int, group: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One weight's kernel tensors (random codes and scales: the stream's cost does not depend on the values)."""
    if kernel == "bf16":
        return {"w": (torch.randn(n, k, generator=gen) * 0.05).bfloat16()}
    if kernel.startswith("nf4"):
        from cinq.layers.quantization.nf4 import NF4_LEVELS
        return {"codes": torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8),
                "absmax": torch.rand(n * k // group, generator=gen), "levels": NF4_LEVELS.clone()}
    if kernel.startswith("fp8"):
        codes = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
        return {"codes": codes, "scale": torch.rand(n, generator=gen) * 0.01}
    scales = torch.rand(n, k // group, generator=gen) * 0.01
    if kernel.startswith("q"):  # a GGUF block matrix, as the file holds it
        from cinq.layers.quantization.gguf_blocks import BLOCK_BYTES
        from cinq.layers.quantization.gguf_linear import i8_kernel_tensors
        type_name = kernel.split()[0].upper()
        size = BLOCK_BYTES[type_name]
        raw = torch.randint(0, 256, (n, k // 32, size), generator=gen, dtype=torch.uint8)
        raw[..., 0:2] = torch.tensor([0x00, 0x20], dtype=torch.uint8)  # fp16 scale 0.0078125 (no inf / NaN)
        if type_name == "Q4_1":
            raw[..., 2:4] = torch.tensor([0x00, 0xA0], dtype=torch.uint8)
        return i8_kernel_tensors(raw.reshape(n, -1), type_name)
    if kernel.startswith("int8"):
        codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        return native.pack_int8_grouped(codes, scales, group)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    return native.pack_int4_affine(codes, scales, -8 * scales, group)


def module_name(kernel: str) -> str:
    """The ``cinq/kernels/cpu/<name>.cpp`` whose extension runs ``kernel``."""
    if kernel == "bf16":
        return "small_m_gemm"
    if kernel.startswith(("nf4", "fp8")):
        return "float_code_linear"
    return "int8_activation_linear" if kernel.endswith(" i8") else "grouped_int_linear"


def call_for(kernel: str, group: int, x: torch.Tensor, module: Any = None) -> Callable[[dict[str, torch.Tensor]], Any]:
    """The kernel's direct extension call for activations x (no Python wrapper: the stream is what is timed), in
    ``module`` (another build of ``module_name(kernel)``'s source) or this checkout's build."""
    mod = module or cpu_native.native_module(module_name(kernel))
    none, f16 = torch.empty(0), torch.empty(0, dtype=torch.float16)
    if kernel == "bf16":
        return lambda t: mod.small_m_linear(x, t["w"], none)
    if kernel.startswith("nf4"):
        return lambda t: mod.nf4_linear(x, t["codes"], t["absmax"], t["levels"], group)
    if kernel.startswith("fp8"):
        return lambda t: mod.fp8_linear(x, t["codes"], t["scale"], none)
    if kernel.endswith(" i8"):
        if kernel.startswith(("int8", "q8")):
            return lambda t: mod.int8_grouped_linear_i8(x, t["codes"], t["scales"], f16 if kernel[0] == "q" else none,
                                                        group)
        offset = 8 if kernel.startswith("q4_0") else 0
        return lambda t: mod.int4_affine_linear_i8(x, t["codes"], t["scales"], t.get("mins", f16), group, offset)
    if kernel.startswith("int8"):
        return lambda t: mod.int8_grouped_linear(x, t["codes"], t["scales"], none, group)
    return lambda t: mod.int4_affine_linear(x, t["codes"], t["scales"], t["mins"], group)


def nbytes(t: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in t.values())


def best_pass_s(fn: Callable[[dict[str, torch.Tensor]], Any], weights: list[dict[str, torch.Tensor]],
                repeats: int) -> float:
    """Best time of one pass calling ``fn`` on every weight in turn (after one warm-up pass)."""
    for t in weights:
        fn(t)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in weights:
            fn(t)
        best = min(best, time.perf_counter() - t0)
    return best


def region_cost_us() -> float:
    """Mean microseconds of one empty parallel region over torch's threads, in this process."""
    mod = native.grouped_module()
    mod.parallel_region_us(200)
    return min(mod.parallel_region_us(2000) for _ in range(3))


def region_costs() -> dict[str, float]:
    """One empty parallel region at 2 threads under each OpenMP wait policy (child processes for the others)."""
    out = {}
    for name, env in {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
                      "default (spin, then sleep)": {}}.items():
        child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        child_env.update(env)
        child_env["PYTHONPATH"] = str(ROOT)
        code = ("import torch; torch.set_num_threads(2); import benchmarks.decode_kernels as d; "
                "print(d.region_cost_us())")
        if not env:  # unset: the child must not set PASSIVE itself on import
            child_env["OMP_WAIT_POLICY"] = "__unset__"
            code = "import os; os.environ.pop('OMP_WAIT_POLICY'); " + code
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env, capture_output=True, text=True)
        out[name] = float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else float("nan")
    return out


def dispatch_overhead_us() -> dict[str, float]:
    """Microseconds per call of the bf16 kernel on a tiny weight (1 x 64 @ 64 x 64: the call is all overhead) through
    the extension's pybind function (eager steps), the C++-registered ``torch.ops.cinq.small_m_linear`` (compiled
    code now) and a Python custom op wrapping the pybind call (how custom_ops.py registered it before)."""
    mod = cpu_native.native_module("small_m_gemm")
    x, w, none = torch.randn(1, 64).bfloat16(), torch.randn(64, 64).bfloat16(), torch.empty(0)

    @torch.library.custom_op("cinq_bench::small_m_linear_py", mutates_args=(), device_types="cpu")
    def python_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return mod.small_m_linear(x, weight, bias)

    fns = {"pybind (eager)": lambda: mod.small_m_linear(x, w, none),
           "torch.ops.cinq, C++ registration": lambda: torch.ops.cinq.small_m_linear(x, w, none),
           "Python custom op (before)": lambda: torch.ops.cinq_bench.small_m_linear_py(x, w, none)}
    out = {}
    torch.set_num_threads(1)
    with torch.inference_mode():
        for name, fn in fns.items():
            for _ in range(200):
                fn()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(2000):
                    fn()
                best = min(best, (time.perf_counter() - t0) / 2000 * 1e6)
            out[name] = best
    return out


def measure(repeats: int, kernels: tuple[str, ...] = KERNELS, rows: tuple[int, ...] = ROWS) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    probes: dict[int, float] = {}
    for th in THREADS:
        torch.set_num_threads(th)
        probes[th] = read_bandwidth() / 1e9
    cells = []
    for kernel in kernels:
        for shape, (n, k) in SHAPES.items():
            group = _group(kernel, k)
            if group is None:
                cells.append({"kernel": kernel, "shape": shape, "n": n, "k": k,
                              "skipped": f"group does not divide K={k}"})
                print(f"{kernel:18s} {shape:13s} n/a (group does not divide K={k})", flush=True)
                continue
            one = make_weight(kernel, n, k, group, gen)
            size = nbytes(one)
            # the 30 layers' copies, or more where those would fit in the last-level cache (o_proj in int4 is
            # 7 MB over 30 layers): a decode step reads ~100-270 MB, nothing of it stays in cache between steps
            copies = max(LAYERS if shape != "lm_head" else 2, -(-4 * LLC_BYTES // size))
            weights = [one] + [make_weight(kernel, n, k, group, gen) for _ in range(copies - 1)]
            for th in THREADS:
                torch.set_num_threads(th)
                for m in rows:
                    x = torch.randn(m, k, generator=gen).bfloat16()
                    with torch.inference_mode():
                        s = best_pass_s(call_for(kernel, group, x), weights, repeats)
                        torch_gbs = None
                        if kernel == "bf16":  # what cinq ran on a CPU without the kernel: oneDNN's bf16 linear
                            torch_gbs = size * copies / best_pass_s(lambda t: F.linear(x, t["w"]), weights,
                                                                     repeats) / 1e9
                    gbs = size * copies / s / 1e9
                    cell = {"kernel": kernel, "shape": shape, "n": n, "k": k, "group": group, "threads": th, "m": m,
                            "bytes": size, "copies": copies, "us_per_call": s / copies * 1e6, "gb_s": gbs,
                            "probe_gb_s": probes[th], "ratio": gbs / probes[th], "torch_gb_s": torch_gbs}
                    cells.append(cell)
                    print(f"{kernel:18s} {shape:13s} t{th} M{m}  {gbs:6.1f} GB/s  {gbs / probes[th]:5.0%} of "
                          f"{probes[th]:.1f}" + (f"  (oneDNN {torch_gbs:.1f})" if torch_gbs else ""), flush=True)
            del weights, one
    for th in THREADS:  # the probe again at the end: the machine's load may have changed meanwhile
        torch.set_num_threads(th)
        probes[th] = max(probes[th], read_bandwidth() / 1e9)
    for c in cells:  # ratios against the better of the two probe readings
        if "gb_s" in c:
            c["probe_gb_s"] = probes[c["threads"]]
            c["ratio"] = c["gb_s"] / c["probe_gb_s"]
    return {"probe_gb_s": {str(k): v for k, v in probes.items()}, "cells": cells, "kernels": list(kernels)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "decode_kernels"))
    ap.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset of " + ", ".join(KERNELS))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                    help="activation rows per call (the bf16 kernel takes up to 16; the integer ones up to 8)")
    ap.add_argument("--before", default="", help="an earlier results .json to compare with (read before --out "
                                                  "is overwritten: it may be the same file)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.render:
        out.with_suffix(".md").write_text(render(json.loads(out.with_suffix(".json").read_text())))
        return
    if cpu_native.native_module("small_m_gemm") is None or not native.affine_kernels_available():
        raise SystemExit("the native kernels are unavailable here (no compiler, or no AVX2 + FMA)")
    before = None
    if args.before:
        path = Path(args.before)
        before = json.loads(path.read_text())
        before = {"file": str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else path.name,
                  "date": before["date"], "load_start": before["load_start"], "cells": before["cells"]}
    load_start = os.getloadavg()[0]
    data: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_label(),
                            "repeats": 2 if args.quick else args.repeats, "load_start": load_start,
                            "region_us": region_costs(), "dispatch_us": dispatch_overhead_us()}
    kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--kernels: unknown {unknown}; choose from {list(KERNELS)}")
    data["rows"] = [int(r) for r in args.rows.split(",")]
    data.update(measure(data["repeats"], kernels, tuple(data["rows"])))
    data["load_end"] = os.getloadavg()[0]
    if before:
        data["before"] = before
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    out.with_suffix(".md").write_text(render(data))
    print(f"wrote {out}.json and .md")



if __name__ == "__main__":
    main()
