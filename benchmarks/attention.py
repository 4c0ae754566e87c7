"""Attention benchmark: CPU memory/time scaling, the CPU serving hot path, and the Triton kernels on a GPU.

Sections (each replaces its own part of benchmarks/results/attention.{json,md,png}; sections not run keep
the previous JSON's rows, so ``--sections gpu`` on a CUDA machine adds the GPU tables to the CPU ones):

* ``cpu``: a causal prompt of N tokens through the "reference" (naive, float64 scores), "flash-torch" and
  "sdpa" backends: wall time and peak extra resident memory, each (backend, N) in a fresh process. Naive
  memory grows as N^2, the tiled ones' as N.
* ``serving``: the "sdpa" backend (the engine's CPU hot path) against its previous implementation on
  engine-shaped steps (decode batches, a prompt, a mixed step), same run, ratio printed.
* ``gpu`` (CUDA only): Triton varlen prefill vs PyTorch SDPA (flash) vs the reference, TFLOP/s against the
  card's bf16 peak; Triton paged decode bandwidth against the card's measured copy bandwidth, vs sdpa.

Usage: ``python benchmarks/attention.py [--sections cpu,serving,gpu] [--threads N] [--quick]``
(``--sections report`` only re-renders the markdown and plot from the JSON.)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cinq.kernels.backends import get_backend  # noqa: E402
from cinq.kernels.metadata import AttentionMetadata  # noqa: E402
from cinq.kernels.paged import causal_mask, gather_context, write_kv_index_copy  # noqa: E402
from cinq.markdown_table import markdown_table  # noqa: E402
from cinq.kernels.sdpa import sdpa_paged_attention  # noqa: E402
from cinq.process_env import set_omp_wait_policy  # noqa: E402

# After torch on purpose, as before: the timed cpu-section workers (fresh processes) start with PASSIVE, while
# this process (the serving section) keeps OpenMP's default, as its committed numbers were measured.
set_omp_wait_policy(warn=False)

RESULTS = Path(__file__).resolve().parent / "results"
CPU_SHAPE = (2, 1, 64)  # heads, kv heads, head dim: small enough that naive float64 scores fit at N = 16k
CPU_BACKENDS = ["reference", "flash-torch", "sdpa"]
BLOCK = 16


@dataclass(slots=True)
class Step:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    kv_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float

    def args(self) -> tuple:
        return self.query, self.key, self.value, self.kv_cache, self.meta, self.scale


def make_step(query_lens: list[int], seq_lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype,
              device: str = "cpu", seed: int = 0) -> Step:
    """A serving step over randomly scattered blocks; cached prefixes hold random K/V."""
    need = [-(-s // BLOCK) for s in seq_lens]
    perm = torch.randperm(sum(need), generator=torch.Generator().manual_seed(seed)).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    meta = AttentionMetadata.from_lens(query_lens, seq_lens, tables, BLOCK, device)
    g = torch.Generator(device=device).manual_seed(seed)
    cache = torch.randn(2, sum(need), BLOCK, hkv, d, generator=g, device=device, dtype=dtype)
    t = sum(query_lens)
    q, k, v = (torch.randn(t, h, d, generator=g, device=device, dtype=dtype) for h in (hq, hkv, hkv))
    write_kv_index_copy(k, v, cache, meta.slot_mapping)
    return Step(q, k, v, cache, meta, d ** -0.5)


def legacy_sdpa_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The "sdpa" backend as first written (3-D SDPA calls, GQA decode via enable_gqa): the serving baseline."""
    out = torch.empty_like(query)
    nd = meta.num_decodes
    if nd:
        max_len = max(meta.seq_lens_cpu[:nd])
        tables = meta.block_tables[:nd, :-(-max_len // kv_cache.shape[2])].long()
        kv = kv_cache[:, tables].flatten(2, 3)
        k, v = kv[0].transpose(1, 2).to(query.dtype), kv[1].transpose(1, 2).to(query.dtype)
        mask = (torch.arange(k.shape[2])[None, :] < meta.seq_lens[:nd, None]).view(nd, 1, 1, -1)
        out[:nd] = F.scaled_dot_product_attention(query[:nd].unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                                  enable_gqa=True).squeeze(2)
    starts = meta.query_start_loc.tolist()
    for i in range(nd, meta.num_seqs):
        s, e = starts[i], starts[i + 1]
        q = query[s:e].transpose(0, 1)
        if e - s == meta.seq_lens_cpu[i]:
            o = F.scaled_dot_product_attention(q, key[s:e].transpose(0, 1), value[s:e].transpose(0, 1),
                                               is_causal=True, scale=scale, enable_gqa=True)
        else:
            k, v = gather_context(kv_cache, meta.block_tables[i], meta.seq_lens_cpu[i])
            o = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), scale=scale,
                                               attn_mask=causal_mask(e - s, k.shape[0], q.device), enable_gqa=True)
        out[s:e] = o.transpose(0, 1)
    return out


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


# ------------------------------------------------------------------------------------------------ cpu section
def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _mem_available() -> int:
    try:
        return int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        return 8 << 30


def cpu_worker(backend: str, n: int, repeats: int) -> dict:
    """In a fresh process: peak extra resident memory of the first call (Linux peak-RSS mark, reset just before),
    then the median wall time of ``repeats`` calls."""
    impl = get_backend(backend)
    impl.forward(*make_step([64], [64], *CPU_SHAPE, torch.float32).args())  # code paths warm
    step = make_step([n], [n], *CPU_SHAPE, torch.float32)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the peak mark then includes the warm-up; still an upper bound
    before = _status_kib("VmRSS")
    impl.forward(*step.args())
    peak = _status_kib("VmHWM") - before
    t = median_time(lambda: impl.forward(*step.args()), repeats)
    return {"backend": backend, "n": n, "time_s": t, "peak_extra_mib": peak / 1024}


def cpu_section(ns: list[int]) -> dict:
    rows = []
    for n in ns:
        for backend in CPU_BACKENDS:
            need = CPU_SHAPE[0] * n * n * 9 if backend == "reference" else 0  # float64 scores, bool mask
            if need > 0.5 * _mem_available():
                rows.append({"backend": backend, "n": n, "skipped": f"needs ~{need / 2**30:.0f} GiB"})
                print(f"cpu N={n:6d} {backend:12s} skipped: needs ~{need / 2**30:.0f} GiB", flush=True)
                continue
            repeats = 5 if n <= 1024 else 3 if n <= 4096 else 1
            cmd = [sys.executable, __file__, "--worker", backend, "--n", str(n), "--repeats", str(repeats),
                   "--threads", str(torch.get_num_threads())]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                rows.append({"backend": backend, "n": n, "skipped": "failed: " + res.stderr.strip()[-300:]})
                print(f"cpu N={n:6d} {backend:12s} failed:\n{res.stderr[-2000:]}", flush=True)
                continue
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"cpu N={n:6d} {backend:12s} {rows[-1]['time_s']:9.3f} s   peak +{rows[-1]['peak_extra_mib']:9.1f} "
                  "MiB", flush=True)
    return {"heads": CPU_SHAPE[0], "kv_heads": CPU_SHAPE[1], "head_dim": CPU_SHAPE[2], "dtype": "float32",
            "threads": torch.get_num_threads(), "rows": rows}


# -------------------------------------------------------------------------------------------- serving section
def serving_cases() -> list[tuple[str, list[int], list[int], int, int, int, torch.dtype]]:
    g = torch.Generator().manual_seed(0)

    def lens(n: int, lo: int, hi: int) -> list[int]:
        return torch.randint(lo, hi + 1, (n,), generator=g).tolist()

    return [
        ("decode x16, ctx 512-1024, 32/8 heads D64, bf16", [1] * 16, lens(16, 512, 1024), 32, 8, 64, torch.bfloat16),
        ("decode x32, ctx 100-300, 4/2 heads D32, fp32", [1] * 32, lens(32, 100, 300), 4, 2, 32, torch.float32),
        ("prompt 1024, 32/8 heads D64, bf16", [1024], [1024], 32, 8, 64, torch.bfloat16),
        ("8 decodes + chunk 256 after 512 cached, bf16", [1] * 8 + [256], lens(8, 300, 800) + [768], 32, 8, 64,
         torch.bfloat16),
    ]


def serving_section(repeats: int) -> dict:
    rows = []
    for name, q_lens, s_lens, hq, hkv, d, dtype in serving_cases():
        step = make_step(q_lens, s_lens, hq, hkv, d, dtype)
        old = median_time(lambda: legacy_sdpa_forward(*step.args()), repeats)
        new = median_time(lambda: sdpa_paged_attention(*step.args()), repeats)
        diff = (legacy_sdpa_forward(*step.args()).float() - sdpa_paged_attention(*step.args()).float()).abs().max()
        rows.append({"case": name, "before_ms": old * 1e3, "after_ms": new * 1e3, "speedup": old / new,
                     "max_abs_diff": diff.item()})
        print(f"serving {name:48s} before {old * 1e3:9.2f} ms   after {new * 1e3:8.2f} ms   x{old / new:.2f}",
              flush=True)
    return {"threads": torch.get_num_threads(), "rows": rows}


# ------------------------------------------------------------------------------------------------ gpu section
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                    "B200": 2250.0}  # dense bf16 tensor-core peaks from the vendor data sheets (SXM parts)


def _gpu_peak(name: str) -> float | None:
    hits = [v for k, v in BF16_PEAK_TFLOPS.items() if k in name.upper()]
    return max(hits) if hits else None


GPU_HEADS = (32, 8, 128)  # heads, kv heads, head dim (Llama-3-8B-like attention)
GPU_PREFILL_N = {False: [1024, 4096, 16384, 32768], True: [1024, 4096]}
GPU_DECODE = {False: [(1, 32768), (16, 4096), (64, 4096), (64, 16384)], True: [(16, 4096)]}  # (batch, context)
GPU_PREFILL_TOKENS = 16384  # short prompts are batched up to this many tokens so that they fill the card
GPU_MATMUL_SIZE, GPU_COPY_BYTES = 8192, 1 << 30


def gpu_section(quick: bool, dev: str = "cuda") -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from cinq.kernels.reference import attention_reference
    from cinq.kernels.triton.decode import paged_decode
    from cinq.kernels.triton.prefill import flash_prefill_varlen

    name = torch.cuda.get_device_name()
    a = torch.randn(GPU_MATMUL_SIZE, GPU_MATMUL_SIZE, device=dev, dtype=torch.bfloat16)
    mm_tflops = 2 * GPU_MATMUL_SIZE ** 3 / do_bench(lambda: a @ a) * 1e-9
    big = torch.empty(GPU_COPY_BYTES, device=dev, dtype=torch.uint8)
    copy_gbs = 2 * big.numel() / do_bench(lambda: big.clone()) * 1e-6  # read + write
    del a, big
    peak = _gpu_peak(name) or mm_tflops
    hq, hkv, d = GPU_HEADS
    prefill = []
    for n in GPU_PREFILL_N[quick]:
        b = max(1, GPU_PREFILL_TOKENS // n)
        q, k, v = (torch.randn(b * n, h, d, device=dev, dtype=torch.bfloat16) for h in (hq, hkv, hkv))
        cu = torch.arange(0, b + 1, device=dev, dtype=torch.int32) * n
        flops = 4 * b * n * n * d * hq / 2  # causal: half the score matrix
        row = {"n": n, "batch": b}
        out = torch.empty_like(q)
        row["triton_ms"] = do_bench(lambda: flash_prefill_varlen(q, k, v, cu, cu, n, d ** -0.5, out=out))
        q4, k4, v4 = (t.view(b, n, -1, d).transpose(1, 2) for t in (q, k, v))
        k4, v4 = k4.repeat_interleave(hq // hkv, 1), v4.repeat_interleave(hq // hkv, 1)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            row["torch_flash_ms"] = do_bench(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True))
        if hq * n * n * 8 * 2.2 < 0.5 * torch.cuda.mem_get_info()[0]:  # float64 scores of one sequence
            row["reference_ms"] = do_bench(lambda: attention_reference(q[:n], k[:n], v[:n], d ** -0.5), rep=20) * b
        for key in [k_ for k_ in row if k_.endswith("_ms")]:
            row[key.replace("_ms", "_tflops")] = flops / row[key] * 1e-9
        row["triton_pct_peak"] = 100 * row["triton_tflops"] / peak
        prefill.append(row)
        print(f"gpu prefill N={n:6d} triton {row['triton_tflops']:7.1f} TFLOP/s ({row['triton_pct_peak']:.0f}% of "
              f"peak)   torch flash {row['torch_flash_tflops']:7.1f}", flush=True)
        del q, k, v, q4, k4, v4, out
    decode = []
    for b, ctx in GPU_DECODE[quick]:
        step = make_step([1] * b, [ctx] * b, hq, hkv, d, torch.bfloat16, device=dev)
        out = torch.empty_like(step.query)
        kv_bytes = 2 * b * ctx * hkv * d * 2
        row = {"batch": b, "ctx": ctx}
        row["triton_ms"] = do_bench(lambda: paged_decode(step.query, step.kv_cache, step.meta, step.scale, out))
        row["sdpa_backend_ms"] = do_bench(lambda: sdpa_paged_attention(*step.args()))
        row["triton_gbs"] = kv_bytes / row["triton_ms"] * 1e-6
        row["triton_pct_copy_bw"] = 100 * row["triton_gbs"] / copy_gbs
        row["speedup_vs_sdpa"] = row["sdpa_backend_ms"] / row["triton_ms"]
        decode.append(row)
        print(f"gpu decode B={b:3d} ctx={ctx:6d} triton {row['triton_gbs']:7.0f} GB/s "
              f"({row['triton_pct_copy_bw']:.0f}% of copy)   x{row['speedup_vs_sdpa']:.1f} vs sdpa", flush=True)
        del step, out
    return {"device": name, "bf16_peak_tflops": peak, "peak_source": "datasheet" if _gpu_peak(name) else "measured",
            "measured_matmul_tflops": mm_tflops, "copy_gbs": copy_gbs, "heads": hq, "kv_heads": hkv, "head_dim": d,
            "prefill": prefill, "decode": decode}


# ---------------------------------------------------------------------------------------------------- output
def render_markdown(r: dict) -> str:
    lines = ["# Attention benchmark", "", "Produced by `python benchmarks/attention.py`; see its docstring.", ""]
    cpu = r.get("cpu")
    if cpu:
        lines += [f"## CPU: one causal prompt of N tokens ({cpu['heads']} heads, {cpu['kv_heads']} kv head, "
                  f"D={cpu['head_dim']}, {cpu['dtype']}, {cpu['threads']} threads)", "",
                  "Peak extra memory = growth of the process's peak resident set during one call.", ""]
        rows = []
        done = {(x["backend"], x["n"]): x for x in cpu["rows"] if "skipped" not in x}
        ns = sorted({x["n"] for x in cpu["rows"]})
        for x in cpu["rows"]:
            if "skipped" in x:
                rows.append([x["n"], x["backend"], f"skipped: {x['skipped']}", "", "", ""])
                continue
            prev = done.get((x["backend"], ns[ns.index(x["n"]) - 1])) if ns.index(x["n"]) else None
            grew = prev and prev["peak_extra_mib"] > 0
            growth = (f"x{x['peak_extra_mib'] / prev['peak_extra_mib']:.1f} (N x{x['n'] // prev['n']})"
                      if grew else "")
            ref = done.get(("reference", x["n"]))
            vs = f"{ref['time_s'] / x['time_s']:.2f}x faster" if ref and x["backend"] != "reference" else ""
            rows.append([x["n"], x["backend"], f"{x['time_s']:.3f}", f"{x['peak_extra_mib']:.1f}", growth, vs])
        lines += [markdown_table(["N", "backend", "time (s)", "peak extra memory (MiB)", "memory growth vs previous N",
                                  "time vs reference"], rows, "rlrrrr"), ""]
    serving = r.get("serving")
    if serving:
        lines += [f"## CPU serving hot path: `sdpa` backend, previous vs current ({serving['threads']} threads)", "",
                  markdown_table(["step", "before (ms)", "after (ms)", "speedup", "max abs diff"],
                                 [[x["case"], f"{x['before_ms']:.2f}", f"{x['after_ms']:.2f}", f"{x['speedup']:.2f}x",
                                   f"{x['max_abs_diff']:.1e}"] for x in serving["rows"]]), ""]
    gpu = r.get("gpu")
    lines.append("## GPU")
    if not gpu:
        lines += ["", "Not run yet: no CUDA device was available. Run `python benchmarks/attention.py --sections gpu` "
                  "on a CUDA machine to fill this section.", ""]
        return "\n".join(lines)
    lines += ["", f"{gpu['device']}: bf16 peak {gpu['bf16_peak_tflops']:.0f} TFLOP/s ({gpu['peak_source']}), "
              f"measured bf16 matmul {gpu['measured_matmul_tflops']:.0f} TFLOP/s, copy bandwidth "
              f"{gpu['copy_gbs']:.0f} GB/s. Heads {gpu['heads']}/{gpu['kv_heads']}, D={gpu['head_dim']}, bf16.", "",
              markdown_table(["N", "seqs", "Triton TFLOP/s", "% of peak", "torch flash TFLOP/s", "reference TFLOP/s"],
                             [[x["n"], x["batch"], f"{x['triton_tflops']:.1f}", f"{x['triton_pct_peak']:.0f}%",
                               f"{x['torch_flash_tflops']:.1f}",
                               f"{x['reference_tflops']:.2f}" if "reference_tflops" in x else "skipped (memory)"]
                              for x in gpu["prefill"]], "rrrrrr"),
              "", markdown_table(["decode batch", "context", "Triton GB/s", "% of copy bandwidth", "Triton ms",
                                  "sdpa backend ms", "speedup"],
                                 [[x["batch"], x["ctx"], f"{x['triton_gbs']:.0f}", f"{x['triton_pct_copy_bw']:.0f}%",
                                   f"{x['triton_ms']:.3f}", f"{x['sdpa_backend_ms']:.3f}",
                                   f"{x['speedup_vs_sdpa']:.1f}x"]
                                  for x in gpu["decode"]], "rrrrrrr")]
    return "\n".join(lines + [""])


def render_plot(r: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cpu = r.get("cpu")
    if not cpu:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for backend in CPU_BACKENDS:
        rows = [x for x in cpu["rows"] if x["backend"] == backend and "skipped" not in x]
        ns = [x["n"] for x in rows]
        axes[0].loglog(ns, [x["peak_extra_mib"] for x in rows], "o-", label=backend)
        axes[1].loglog(ns, [x["time_s"] for x in rows], "o-", label=backend)
    axes[0].set(title="CPU peak extra memory (MiB)", xlabel="N (tokens)")
    axes[1].set(title="CPU time per causal prompt (s)", xlabel="N (tokens)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="cpu,serving,gpu")
    p.add_argument("--quick", action="store_true", help="small sizes, print only (writes nothing)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice); recorded in the results")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(cpu_worker(args.worker, args.n, args.repeats)))
        return 0
    sections = set(args.sections.split(","))
    path = RESULTS / "attention.json"
    results = json.loads(path.read_text()) if path.is_file() and not args.quick else {}
    if "cpu" in sections:
        results["cpu"] = cpu_section([256, 1024] if args.quick else [1024, 4096, 16384, 32768])
    if "serving" in sections:
        results["serving"] = serving_section(3 if args.quick else 20)
    if "gpu" in sections:
        if torch.cuda.is_available():
            results["gpu"] = gpu_section(args.quick)
        else:
            print("gpu section skipped: no CUDA device")
            results.setdefault("gpu", None)
    if args.quick:
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "attention.md").write_text(render_markdown(results))
    render_plot(results, RESULTS / "attention.png")
    print(f"wrote {RESULTS / 'attention.md'}, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
