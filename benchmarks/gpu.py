"""The CUDA path end to end, for the rare session that is lent a GPU: one script, one run, every section guarded.

Sections (``--sections``; each one's failure is recorded with its traceback and the others still run):

* ``check``: greedy tokens of the embedded cinq-tiny on CUDA (Triton backend, then flash-torch) against cinq on
  the CPU (sdpa) and against HF transformers on the same GPU, float32 and bfloat16: the fraction of identical
  tokens and the first divergence per prompt.
* ``throughput``: offline throughput of cinq against HF ``generate`` (same requests, same GPU, baseline in the
  same run) on random-weight Llamas of ~110M and ~1.1B parameters: prompts U(32, 512), outputs U(32, 256),
  greedy, ignore_eos, bf16.
* ``decode``: batch-1 decode tokens/s of cinq against HF on the same models and cinq-tiny, next to the memory
  roofline (weight bytes / the card's measured copy bandwidth).
* ``graphs``: the decode step as CUDA graphs (``compilation_config`` mode 3 on CUDA, capture sizes 1-8): greedy
  tokens of cinq-tiny against the eager engine (float32: identical expected), and batch-1 decode with and without
  graphs on cinq-tiny and the models (baseline in the same run), next to the roofline.
* ``int4``: the ~1.1B model quantized by ``cinq quantize`` (RTN int4, group 128) served through the Triton int4
  GEMM: batch-1 decode and throughput against the bf16 rows of the same run, and the kernel alone against a bf16
  matmul at a few row counts.

    python benchmarks/gpu.py --out DIR                 # on the GPU machine: DIR/gpu.json
    python benchmarks/gpu.py --report DIR/gpu.json     # here: benchmarks/results/gpu.{json,md}
    python benchmarks/gpu.py --device cpu --quick --out /tmp/g   # smoke run of the code paths on a CPU
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from cinq.bench.hf_baseline import hf_generate_batched, hf_greedy_tokens, load_hf_model  # noqa: E402
from benchmarks.random_model import LLAMA_1B, LLAMA_110M, LlamaShape, build_random_llama  # noqa: E402
from cinq.bench.workload import BenchRequest, random_requests  # noqa: E402
from benchmarks.gpu_report import render  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHAPES = {"llama-110m": LLAMA_110M, "llama-1b": LLAMA_1B}
QUICK_SHAPES = {"llama-110m": LlamaShape(64, 2, 4, 2, 128, 512), "llama-1b": LlamaShape(128, 2, 4, 2, 256, 512, False)}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def cinq_generate(model: str, prompts: list[list[int]], max_tokens: list[int], device: str, dtype: str,
                  **engine_args: Any) -> tuple[list[list[int]], float]:
    """Greedy, ignore_eos; returns the token ids per prompt and the wall time of generate (engine built before)."""
    from cinq import LLM, SamplingParams
    llm = LLM(model, dtype=dtype, device=device, seed=0, **engine_args)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    # warm-up at full length: Triton compiles (and the prefill autotunes) on first use of each kernel variant,
    # and the split-K decode variant changes as contexts grow
    llm.generate(prompts[:2], params[:2])
    sync(device)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(device)
    elapsed = time.perf_counter() - t0
    del llm
    _free(device)
    return [list(o.outputs[0].token_ids) for o in outs], elapsed


def _free(device: str) -> None:
    import gc
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def hf_run(model: str, reqs: list[BenchRequest], device: str, dtype: str, batch_sizes: list[int]) -> dict[str, float]:
    """HF ``generate`` tok/s per batch size on the same requests (one warm-up request first)."""
    hf = load_hf_model(model, dtype, device)
    hf_generate_batched(hf, reqs[:1], 1)
    out = {f"hf_b{bs}_tok_s": hf_generate_batched(hf, reqs, bs)["tok_s"] for bs in batch_sizes}
    del hf
    _free(device)
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """Fraction of identical tokens up to each pair's first divergence, and the divergence positions."""
    first = []
    for x, y in zip(a, b):
        n = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
        first.append(n if n < max(len(x), len(y)) else None)
    same = sum(len(x) if f is None else f for x, f in zip(a, first))
    return {"identical_prefix_fraction": same / max(1, sum(len(x) for x in a)),
            "identical_sequences": sum(f is None for f in first), "sequences": len(a), "first_divergence": first}


# ---------------------------------------------------------------------------------------------------- sections

def section_check(args: argparse.Namespace) -> dict[str, Any]:
    from cinq.assets import resolve_model_path
    from cinq.model.tokenizer import Tokenizer
    tiny = str(resolve_model_path("cinq-tiny"))
    tok = Tokenizer.from_pretrained(tiny)
    texts = ["Once upon a time", "def fibonacci(n):", "Im Anfang war das Wort", "Question: Tom has 3 apples",
             "En el principio creó Dios", "The quick brown fox", "import os\nimport sys\n", "Когда-то давно"]
    prompts = [tok.encode(t) for t in texts]
    n = 16 if args.quick else 48
    out: dict[str, Any] = {"tokens_per_prompt": n}
    ref, _ = cinq_generate(tiny, prompts, [n] * len(prompts), "cpu", "float32", attention_backend="sdpa")
    for backend in ("triton", "flash-torch"):
        if backend == "triton" and not args.device.startswith("cuda"):
            continue
        for dtype in ("float32", "bfloat16"):
            got, _ = cinq_generate(tiny, prompts, [n] * len(prompts), args.device, dtype, attention_backend=backend)
            out[f"cinq_{backend}_{dtype}_vs_cinq_cpu_float32"] = agreement(got, ref)
            print(f"check {backend} {dtype}: {out[f'cinq_{backend}_{dtype}_vs_cinq_cpu_float32']}", flush=True)
    # HF's min_new_tokens (its ignore_eos) bans the end tokens, so HF is compared up to the reference's first one
    model = load_hf_model(tiny, "float32", args.device)
    hf = [hf_greedy_tokens(model, p, n) for p in prompts]
    del model
    ends = set(tok.eos_token_ids)
    cut = [next((i for i, t in enumerate(r) if t in ends), len(r)) for r in ref]
    out["hf_float32_vs_cinq_cpu_float32 (to the first end token)"] = agreement(
        [h[:c] for h, c in zip(hf, cut)], [r[:c] for r, c in zip(ref, cut)])
    return out


def requests(args: argparse.Namespace, shape: LlamaShape) -> list[BenchRequest]:
    """Prompts U(32, 512), outputs U(32, 256) (U(8, 32) and U(4, 16) when quick), token ids from 300 up."""
    if args.quick:
        return random_requests(16, shape.vocab, (8, 32), (4, 16), seed=0, low_token=300)
    return random_requests(args.num_requests, shape.vocab, (32, 512), (32, 256), seed=0, low_token=300)


def model_folder(args: argparse.Namespace, name: str) -> tuple[str, LlamaShape]:
    shape = (QUICK_SHAPES if args.quick else SHAPES)[name]
    return str(build_random_llama(Path(args.work) / name, shape)), shape


def section_throughput(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name in args.models.split(","):
        folder, shape = model_folder(args, name)
        reqs = requests(args, shape)
        prompts, lens = [r.prompt for r in reqs], [r.output_len for r in reqs]
        useful, n_req = sum(lens), len(reqs)
        row: dict[str, Any] = {"model": name, "requests": n_req, "output_tokens": useful}
        toks, t = cinq_generate(folder, prompts, lens, args.device, "bfloat16", max_num_seqs=256,
                                max_num_batched_tokens=8192, kv_cache_memory=args.kv_gib)
        assert sum(len(x) for x in toks) == useful
        row["cinq_tok_s"] = useful / t
        row.update(hf_run(folder, reqs, args.device, "bfloat16", [int(b) for b in args.hf_batch_sizes.split(",")]))
        best = max(v for k, v in row.items() if k.startswith("hf_b"))
        row["hf_best_tok_s"], row["ratio"] = best, row["cinq_tok_s"] / best
        print(f"throughput {name}: cinq {row['cinq_tok_s']:.0f} tok/s, HF best {best:.0f}, {row['ratio']:.2f}x",
              flush=True)
        rows.append(row)
    return {"rows": rows}


def copy_bandwidth(device: str) -> float:
    """Bytes/s moved (read + write) by a large device-to-device copy, best of several."""
    n = (1 << 30) if device.startswith("cuda") else (64 << 20)
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        y.copy_(x)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n / best


def decode_row(name: str, folder: str, args: argparse.Namespace, bw: float, new: int,
               **engine_args: Any) -> dict[str, Any]:
    from safetensors import safe_open
    weight_bytes = 0
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                s = h.get_slice(k)
                weight_bytes += _numel(s.get_shape()) * _dtype_bytes(s.get_dtype())
    prompt = [list(range(300, 428))] if not args.quick else [list(range(10, 42))]
    _, t = cinq_generate(folder, prompt, [new], args.device, "bfloat16", kv_cache_memory=1.0, **engine_args)
    row = {"model": name, "new_tokens": new, "weight_bytes": weight_bytes, "cinq_tok_s": new / t,
           "roofline_tok_s": bw / weight_bytes}
    row["cinq_fraction_of_roofline"] = row["cinq_tok_s"] / row["roofline_tok_s"]
    if not args.skip_hf_decode:
        row["hf_tok_s"] = hf_run(folder, [BenchRequest(prompt[0], new)], args.device, "bfloat16", [1])["hf_b1_tok_s"]
        row["ratio"] = row["cinq_tok_s"] / row["hf_tok_s"]
    print(f"decode {name}: cinq {row['cinq_tok_s']:.0f} tok/s ({row['cinq_fraction_of_roofline']:.0%} of roofline)"
          + (f", HF {row['hf_tok_s']:.0f}, {row['ratio']:.2f}x" if "hf_tok_s" in row else ""), flush=True)
    return row


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _dtype_bytes(dtype: str) -> float:
    return {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "I8": 1, "U8": 1}.get(dtype, 2)


def section_decode(args: argparse.Namespace) -> dict[str, Any]:
    from cinq.assets import resolve_model_path
    bw = copy_bandwidth(args.device) / 2  # a decode step reads its weights once: count the read half
    new = 16 if args.quick else 256
    rows = [decode_row("cinq-tiny", str(resolve_model_path("cinq-tiny")), args, bw, new)]
    for name in args.models.split(","):
        folder, _ = model_folder(args, name)
        rows.append(decode_row(name, folder, args, bw, new))
    return {"read_bandwidth_gb_s": bw / 1e9, "rows": rows}


CUDA_GRAPHS = {"mode": 3, "compile_sizes": [1, 2, 4, 8]}


def section_graphs(args: argparse.Namespace) -> dict[str, Any]:
    from cinq.assets import resolve_model_path
    tiny = str(resolve_model_path("cinq-tiny"))
    prompts, lens = [list(range(10, 10 + n)) for n in (5, 17, 40, 3)], [24] * 4  # steps of 1-4 decodes
    eager, _ = cinq_generate(tiny, prompts, lens, args.device, "float32")
    graphs, _ = cinq_generate(tiny, prompts, lens, args.device, "float32", compilation_config=CUDA_GRAPHS)
    out: dict[str, Any] = {"fp32_tokens_identical": eager == graphs, "agreement": agreement(eager, graphs)}
    print(f"graphs: float32 greedy tokens identical to eager: {out['fp32_tokens_identical']}", flush=True)
    bw = copy_bandwidth(args.device) / 2
    new = 16 if args.quick else 256
    out["rows"] = []
    for name, folder in [("cinq-tiny", tiny)] + [(n, model_folder(args, n)[0]) for n in args.models.split(",")]:
        for mode, cc in (("eager", None), ("cuda graphs", CUDA_GRAPHS)):
            out["rows"].append({"mode": mode, **decode_row(name, folder, args, bw, new, compilation_config=cc)})
    return out


def section_int4(args: argparse.Namespace) -> dict[str, Any]:
    name = args.models.split(",")[-1]
    folder, shape = model_folder(args, name)
    qfolder = Path(args.work) / f"{name}-rtn-int4"
    out: dict[str, Any] = {"model": name, "method": "rtn int4 group 128 (cinq quantize)"}
    if not (qfolder / "config.json").is_file():
        t = time.perf_counter()
        group = "128" if not args.quick else "32"
        subprocess.run([sys.executable, "-m", "cinq.cli", "quantize", str(folder), "--method", "rtn", "--bits", "4",
                        "--group-size", group, "--out", str(qfolder), "--no-eval"], check=True, cwd=ROOT)
        out["quantize_s"] = time.perf_counter() - t
    bw = copy_bandwidth(args.device) / 2
    new = 16 if args.quick else 256
    sk, args.skip_hf_decode = args.skip_hf_decode, True
    out["decode_bf16"] = decode_row(name, str(folder), args, bw, new)
    out["decode_int4"] = decode_row(f"{name}-int4", str(qfolder), args, bw, new)
    args.skip_hf_decode = sk
    out["decode_int4_over_bf16"] = out["decode_int4"]["cinq_tok_s"] / out["decode_bf16"]["cinq_tok_s"]
    reqs = requests(args, shape)
    prompts, lens = [r.prompt for r in reqs], [r.output_len for r in reqs]
    for label, f in (("bf16", folder), ("int4", qfolder)):
        _, t = cinq_generate(str(f), prompts, lens, args.device, "bfloat16", max_num_seqs=256,
                             max_num_batched_tokens=8192, kv_cache_memory=args.kv_gib)
        out[f"throughput_{label}_tok_s"] = sum(lens) / t
    out["throughput_int4_over_bf16"] = out["throughput_int4_tok_s"] / out["throughput_bf16_tok_s"]
    print(f"int4 {name}: decode {out['decode_int4_over_bf16']:.2f}x bf16, throughput "
          f"{out['throughput_int4_over_bf16']:.2f}x bf16", flush=True)
    if args.device.startswith("cuda"):
        out["kernel"] = int4_kernel_rows(shape)
    return out


def int4_kernel_rows(shape: LlamaShape) -> list[dict[str, Any]]:
    """The Triton int4 GEMM alone against a bf16 matmul, for the model's gate_up shape."""
    from cinq.kernels.triton.int4_gemm import triton_weight_only_mm
    from cinq.layers.quantization.kernels import triton_tensors
    from cinq.quant.rtn import rtn_quantize
    hidden, inter = shape.hidden, shape.intermediate
    w = torch.randn(2 * inter, hidden, dtype=torch.bfloat16)
    qw = rtn_quantize(w.float(), bits=4, group_size=128, sym=True)
    t = triton_tensors(qw, torch.device("cuda"))
    wd = w.cuda()
    rows = []
    for m in (1, 16, 256):
        x = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda")
        ti = _bench(lambda: triton_weight_only_mm(x, t, 4))
        tb = _bench(lambda: x @ wd.t())
        rows.append({"rows": m, "k": hidden, "n": 2 * inter, "int4_us": ti * 1e6, "bf16_us": tb * 1e6,
                     "int4_over_bf16_speed": tb / ti})
    return rows


def _bench(fn: Callable[[], Any], reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "check": section_check, "throughput": section_throughput, "decode": section_decode, "int4": section_int4,
    "graphs": section_graphs}


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    return env


def run(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    result["environment"] = environment(args.device)
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            result[name] = SECTIONS[name](args)
        except Exception as e:  # noqa: BLE001 - one section's failure must not cost the others' device time
            traceback.print_exc()
            result[name] = {"error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc().replace(f"{ROOT}/", "")}  # no machine paths
        result[name]["seconds"] = time.perf_counter() - t
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"section {name} done in {result[name]['seconds']:.0f} s", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu-out", help="folder for gpu.json (sections merge into an existing one)")
    ap.add_argument("--work", default="/tmp/cinq-gpu-models", help="folder for the generated model folders")
    ap.add_argument("--sections", default="check,throughput,decode,int4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="llama-110m,llama-1b")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--hf-batch-sizes", default="64,256")
    ap.add_argument("--kv-gib", type=float, default=16.0)
    ap.add_argument("--skip-hf-decode", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run of the code paths")
    ap.add_argument("--report", default=None, help="render this gpu.json into benchmarks/results/gpu.{json,md}")
    args = ap.parse_args()
    if args.report:
        r = json.loads(Path(args.report).read_text())
        (RESULTS / "gpu.json").write_text(json.dumps(r, indent=2) + "\n")
        (RESULTS / "gpu.md").write_text(render(r, SECTIONS) + "\n")
        print(render(r, SECTIONS))
        return
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"--sections: unknown {sorted(unknown)}; choose from {sorted(SECTIONS)}")
    r = run(args)
    print(render(r, SECTIONS))


if __name__ == "__main__":
    main()
