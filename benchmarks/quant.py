"""Quantized serving speed, weight bytes and `cinq quantize` cost, measured in one run against bf16.

Model: the ~110M-parameter Llama of the serving-core benchmark (benchmarks/throughput.py: hidden 768, 12
layers, 12 heads, intermediate 2048, vocab 32000, tied embeddings), random bf16 weights. Variants, all served
by the engine (`LLMEngine`, ignore_eos, greedy, bf16 activations):

* bf16: the dense folder (decode-sized rows through the native AVX512-BF16 skinny kernel);
* int8: RTN 8-bit per channel (GPTQ file) -> `_weight_int8pack_mm`;
* int4: RTN 4-bit, group 128 (GPTQ file) -> cinq's native int4 kernel (cinq/kernels/cpu/grouped_int_linear.cpp);
* w8a8: SmoothQuant (cinq W8A8 file) -> `torch._int_mm` with per-token int8 activations.

Speed does not depend on how the integers were chosen, so RTN stands for GPTQ/AWQ here. The LM head (tied to
the embedding: 22% of the parameters) stays bf16 in the usual variants, as GPTQ/AWQ files keep it; the row
"int4 + int4 lm_head" is `cinq quantize --lm-head` (GPTQ's "lm_head": true): the head is its own int4 tensor,
so that file keeps the dense embedding too (more bytes on disk) while decode reads a quarter of the head's.

Thread count: `--threads` (default 1). With other jobs on the 2 cores, two OpenMP threads stall each other
(a decode step measured 20 ms with 1 thread and 750 ms with 2 under the same load), so the default is the
one that gives stable ratios on a shared machine; run `--threads 2` on a quiet one.

Decode tokens/s: batch 1 (one request, 128 new tokens) and batch 32 (32 requests, 64 new tokens each), prompts
of 32 random tokens; the prefill step is excluded; median of --repeats runs. Then each method's
`cinq quantize` run (separate process): wall time and peak RSS.

    python benchmarks/quant.py             # writes benchmarks/results/quant.{md,json}
    python benchmarks/quant.py --quick     # smoke run: fewer tokens, tiny calibration

Quality (`--quality MODEL`): the quantization study of `cinq eval --variants` (cinq.eval.quant_study, the one
implementation: same rows, findings, cache and plot) on a fixed set of variants: RTN int8 per channel and int4,
GPTQ int4, AWQ int4 (group 128, or 32 when the model is too narrow), SmoothQuant W8A8 dynamic; `--variants` /
`--group-sizes` take `cinq eval`'s grammar instead. Perplexity, KL / top-1 to the float model, arithmetic
accuracy and step accuracy with standard errors, bytes, batch-1 tokens/s and the flagged findings go to
benchmarks/results/quant_quality.{md,json,png}; finished rows are cached under --work-dir (a rerun resumes).

    python benchmarks/quant.py --quality cinq/assets/cinq-tiny --calib data/corpus/validation.jsonl \
        --ppl data/corpus/test.jsonl     # .jsonl: the "text" fields, joined

Reasoning that can be lost (`--finetune-tokens N --task arithmetic-easy`): cinq-tiny scores near chance on the
corpus-level arithmetic, so first fine-tune it on the easy level, then quantize and report on that task
(benchmarks/results/quant_quality_arithmetic_easy.*):

    python benchmarks/quant.py --quality cinq/assets/cinq-tiny --calib data/corpus/validation.jsonl \
        --ppl data/corpus/test.jsonl --task arithmetic-easy --finetune-tokens 1.6e6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.bench.drive import run_until_done  # noqa: E402
from benchmarks.random_model import LLAMA_110M, build_random_llama  # noqa: E402
from cinq.markdown_table import markdown_table  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402
from cinq.engine.engine import LLMEngine  # noqa: E402
from cinq.model.config import ModelConfig  # noqa: E402
from cinq.sampling_params import OutputKind, SamplingParams  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHAPE = {"hidden": LLAMA_110M.hidden, "layers": LLAMA_110M.layers, "heads": LLAMA_110M.heads,
         "intermediate": LLAMA_110M.intermediate, "vocab": LLAMA_110M.vocab}  # as recorded in quant.json
LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def calibration_text(path: Path, n: int) -> Path:
    from cinq.tasks import arithmetic_problems
    path.write_text("".join(p.text() for p in arithmetic_problems(n, seed=0, split="validation")))
    return path


def tensor_bytes(folder: Path) -> tuple[int, int]:
    """(bytes of the decoder linears' tensors, bytes of all tensors) of a model folder."""
    from safetensors import safe_open

    from cinq.model.loader import checkpoint_files
    sizes = {"F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1}
    linear = total = 0
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                nbytes = math.prod(sl.get_shape()) * sizes[sl.get_dtype()]
                total += nbytes
                if any(f".{s}." in name for s in LINEAR_SUFFIXES):
                    linear += nbytes
    return linear, total


def quantize(src: Path, out: Path, method: str, args: list[str], calib: Path | None, threads: int) -> dict:
    """Run `cinq quantize` in its own process; parse its summary line (time, peak RSS)."""
    cmd = [sys.executable, "-m", "cinq.cli", "quantize", str(src), "--method", method, "--out", str(out),
           "--no-eval", "--no-progress", *args]
    if calib is not None:
        cmd += ["--calib", str(calib)]
    t0 = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    m = re.search(r"([\d.]+) s, peak RSS (\d+) MiB, (\d+) calibration tokens", proc.stdout)
    assert m, proc.stdout
    return {"method": method, "args": " ".join(args), "seconds": float(m.group(1)), "process_seconds": wall,
            "peak_rss_mib": int(m.group(2)), "calib_tokens": int(m.group(3))}


def decode_speed(folder: Path, batch: int, new_tokens: int, repeats: int, prompt_len: int = 32) -> dict:
    """Decode tokens/s (prefill step excluded), median over ``repeats`` runs on one engine."""
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16", max_num_seqs=max(batch, 1),
                                    max_num_batched_tokens=max(2048, batch * prompt_len), kv_cache_memory=1.0,
                                    enable_prefix_caching=False))
    kinds = sorted({getattr(m, "kind", "dense") for m in engine.model.modules()
                    if type(m).__name__.endswith("Linear") and m is not engine.model.lm_head})
    rng = random.Random(0)
    rates = []
    for r in range(repeats + 1):  # the first run warms up
        for i in range(batch):
            prompt = [rng.randrange(300, SHAPE["vocab"]) for _ in range(prompt_len)]
            engine.add_request(f"r{r}-{i}", prompt, SamplingParams(temperature=0, max_tokens=new_tokens,
                                                                   ignore_eos=True,
                                                                   output_kind=OutputKind.FINAL_ONLY))
        engine.step()  # prefill (and each request's first token)
        t0 = time.perf_counter()
        generated = sum(len(out.outputs[0].token_ids) - 1 for out in run_until_done(engine).values())
        if r:
            rates.append(generated / (time.perf_counter() - t0))
    return {"tokens_per_s": statistics.median(rates), "runs": rates, "kernels": kinds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "cinq-bench-quant"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (see the module docstring)")
    ap.add_argument("--skip-methods", default="", help="comma-separated methods not to time in `cinq quantize`")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--quality", default=None, help="model folder for the quality table (e.g. cinq/assets/cinq-tiny)")
    ap.add_argument("--calib", default=None, help="calibration text (default: arithmetic validation problems)")
    ap.add_argument("--ppl", default=None, help="perplexity text (default: arithmetic test problems)")
    ap.add_argument("--ppl-chars", type=int, default=60_000, help="use at most this much of the --ppl text")
    ap.add_argument("--n-problems", type=int, default=300)
    ap.add_argument("--task", default="arithmetic", help="reasoning task of the quality table: arithmetic or "
                    "arithmetic-easy")
    ap.add_argument("--variants", default=None, help="with --quality: `cinq eval --variants` text instead of the "
                    "fixed set")
    ap.add_argument("--group-sizes", default=None, help="with --variants: `cinq eval --group-sizes`")
    ap.add_argument("--finetune-tokens", type=float, default=0,
                    help="with --quality MODEL: first fine-tune MODEL on --task for this many tokens (cinq.train."
                         "finetune) and report on the fine-tuned model; results go to quant_quality_<task>.*")
    args = ap.parse_args()
    if args.quality:
        torch.set_num_threads(args.threads)
        return quality(args)
    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    src = build_random_llama(work / "bf16", LLAMA_110M)
    calib = calibration_text(work / "calib.txt", 300 if args.quick else 3000)
    calib_small = ["--calib-samples", "8", "--calib-seq-len", "128"] if args.quick else []
    load_before = os.getloadavg()

    variants: dict[str, Path] = {"bf16": src}
    costs = []
    specs = {"int8": ("rtn", ["--bits", "8", "--group-size", "-1"], None),
             "int4": ("rtn", ["--bits", "4", "--group-size", "128"], None),
             "w8a8": ("smoothquant", ["--bits", "8"] + calib_small, calib),
             "int4 + int4 lm_head": ("rtn", ["--bits", "4", "--group-size", "128", "--lm-head"], None)}
    for name, (method, extra, cal) in specs.items():
        out = work / name.replace(" ", "").replace("+", "-")
        costs.append(quantize(src, out, method, extra, cal, args.threads) | {"variant": name})
        variants[name] = out
    skip = set(filter(None, args.skip_methods.split(",")))
    for method, extra in (("gptq", ["--bits", "4", "--group-size", "128"]),
                          ("awq", ["--bits", "4", "--group-size", "128"])):
        if method not in skip:
            costs.append(quantize(src, work / method, method, extra + calib_small, calib, args.threads)
                         | {"variant": method})

    b1_tokens, b32_tokens = (16, 8) if args.quick else (128, 64)
    rows = []
    for name, folder in variants.items():
        linear, total = tensor_bytes(folder)
        b1 = decode_speed(folder, 1, b1_tokens, args.repeats)
        b32 = decode_speed(folder, 32, b32_tokens, max(1, args.repeats - 1))
        rows.append({"variant": name, "linear_bytes": linear, "total_bytes": total, "batch1": b1, "batch32": b32})
        print(f"{name}: {b1['tokens_per_s']:.1f} tok/s @1, {b32['tokens_per_s']:.1f} tok/s @32, "
              f"kernels {b1['kernels']}",
              flush=True)
    base = rows[0]
    for r in rows:
        r["ratio_batch1"] = r["batch1"]["tokens_per_s"] / base["batch1"]["tokens_per_s"]
        r["ratio_batch32"] = r["batch32"]["tokens_per_s"] / base["batch32"]["tokens_per_s"]
        r["ratio_linear_bytes"] = r["linear_bytes"] / base["linear_bytes"]
        r["ratio_total_bytes"] = r["total_bytes"] / base["total_bytes"]
    load_after = os.getloadavg()
    env = {"torch": torch.__version__, "threads": args.threads, "cpu": platform.processor() or
           platform.machine(), "cores": os.cpu_count(), "load_avg_before": load_before, "load_avg_after": load_after,
           "quick": args.quick}
    result = {"model": SHAPE, "env": env, "serving": rows, "quantize": costs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "quant_quick" if args.quick else "quant"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render(result))
    print(render(result))
    return 0


def quality(args: argparse.Namespace) -> int:
    """The quality study on --quality MODEL (see the module docstring), through cinq.eval.quant_study."""
    from cinq.eval.quant_quality import EvalSettings
    from cinq.eval.quant_study import StudyConfig, run_study
    from cinq.tasks import arithmetic_problems
    from cinq.eval.texts import read_text
    from cinq.quant.variants import parse_group_sizes, parse_variants
    work = Path(args.work_dir) / "quality"
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.quality)
    finetuned = None
    if args.finetune_tokens:
        from benchmarks.finetune import FinetuneJob, finetune_on_task
        summary = finetune_on_task(FinetuneJob(base=str(model), out_dir=str(work / f"finetune-{args.task}"),
                                               task=args.task, token_budget=int(args.finetune_tokens),
                                               progress=False))
        # elapsed_s: training time over all invocations (a finished run is reused, not retrained)
        finetuned = {"base": str(model), "tokens": summary["tokens_seen"], "seconds": summary["elapsed_s"]}
        model = Path(summary["model_dir"])
    calib = (read_text(Path(args.calib), 500_000, "calib") if args.calib else
             "".join(p.text() for p in arithmetic_problems(3000, seed=0, split="validation")))
    if args.ppl:
        ppl_text = read_text(Path(args.ppl), args.ppl_chars)
        how = ", documents sampled across the file" if args.ppl.endswith(".jsonl") else ""
        ppl_source = f"{args.ppl} ({len(ppl_text):,} characters{how})"
    else:
        ppl_text = "".join(p.text() for p in arithmetic_problems(200, seed=1, split="test"))
        ppl_source = "200 held-out arithmetic test problems (text)"
    hidden = ModelConfig.from_pretrained(model).hidden_size
    group = "128" if hidden % 128 == 0 and hidden >= 256 else "32"
    variants = args.variants or f"rtn:8/channel,4/{group};gptq:4/{group};awq:4/{group};smoothquant:dynamic"
    specs, skipped = parse_variants(variants, parse_group_sizes(args.group_sizes or group))
    title = model.name
    if finetuned is not None:
        title = (f"{Path(finetuned['base']).name} fine-tuned on {args.task} ({finetuned['tokens']:,} tokens, "
                 f"{finetuned['seconds'] / 60:.1f} min with benchmarks/finetune.py), then quantized")
    name = "quant_quality" if finetuned is None else f"quant_quality_{args.task.replace('-', '_')}"
    cfg = StudyConfig(model, work / name, specs, settings=EvalSettings(task=args.task, n_problems=args.n_problems),
                      ppl_text=ppl_text, ppl_source=ppl_source, calib_text=calib, skipped=skipped, base_label="float",
                      title=f"Quantization quality: {title}")
    report = run_study(cfg)
    for row in report.rows:  # no machine-specific paths in the committed results
        if Path(row.path).is_relative_to(work):
            row.path = f"<work-dir>/{Path(row.path).relative_to(work)}"
    report.notes = [f"`python benchmarks/quant.py {' '.join(sys.argv[1:])}`", "",
                    "Quantization time per variant (in process, calibration forwards in bf16):", "",
                    markdown_table(["variant", "seconds"], [[r.label, f"{r.quantize_seconds:.1f}"]
                                                            for r in report.rows[1:]], "ll"), "",
                    f"load average at the end: {os.getloadavg()[0]:.2f}; {args.threads} thread(s)."]
    report.save(Path(args.out), name)
    print(report.to_markdown())
    return 0


def reading(serving: list[dict]) -> str:
    """What the run says, from its own ratios: which variants beat bf16 at batch 1 and at batch 32."""
    def verdict(key: str) -> str:
        rows = [r for r in serving if r["variant"] != "bf16"]
        won = [f"{r['variant']} {r[key]:.2f}x" for r in rows if r[key] > 1.0]
        lost = [f"{r['variant']} {r[key]:.2f}x" for r in rows if r[key] <= 1.0]
        return f"faster than bf16: {', '.join(won) or 'none'}; not faster: {', '.join(lost) or 'none'}"
    base = next(r for r in serving if r["variant"] == "bf16")
    kernels = ", ".join(base["batch1"]["kernels"])
    return (f"Reading it (computed from this run; the bf16 baseline's linears: {kernels}): at batch 1, "
            f"{verdict('ratio_batch1')}. At batch 32, {verdict('ratio_batch32')}.")


def render(res: dict) -> str:
    env = res["env"]
    rows = [[r["variant"], ", ".join(r["batch1"]["kernels"]), f"{r['linear_bytes'] / 2**20:.1f}",
             f"{r['ratio_linear_bytes']:.2f}", f"{r['total_bytes'] / 2**20:.1f}", f"{r['ratio_total_bytes']:.2f}",
             f"{r['batch1']['tokens_per_s']:.1f}", f"{r['ratio_batch1']:.2f}", f"{r['batch32']['tokens_per_s']:.1f}",
             f"{r['ratio_batch32']:.2f}"] for r in res["serving"]]
    lines = ["# Quantized serving on CPU: ~110M Llama (768/12L/12H/2048, vocab 32000, tied), bf16 activations", "",
             f"torch {env['torch']}, {env['threads']} threads, {env['cores']} cores; load average before "
             f"{env['load_avg_before'][0]:.2f}, after {env['load_avg_after'][0]:.2f} (other jobs share the CPU)."
             + (" QUICK smoke run." if env["quick"] else ""), "",
             markdown_table(["variant", "kernel", "decoder-linear MiB", "x bf16", "all tensors MiB", "x bf16",
                             "batch-1 tok/s", "x bf16", "batch-32 tok/s", "x bf16"], rows, "l" * 10),
             "", reading(res["serving"]), "",
             "`cinq quantize` of the same model (own process each; calibration: arithmetic text, bf16 forwards):", "",
             markdown_table(["method", "args", "calibration tokens", "seconds", "peak RSS MiB"],
                            [[c["method"], c["args"], c["calib_tokens"], f"{c['seconds']:.1f}", c["peak_rss_mib"]]
                             for c in res["quantize"]], "lllll")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
