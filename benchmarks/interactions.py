"""Interaction tables (issue 12): how cinq's techniques change each other, each section its own measured table.

* batch-mates: SmoothQuant W8A8 static vs dynamic activation scales under continuous batching: does a request's
  greedy output change with its batch mates? (benchmarks/batch_mates.py)
* smoothquant-mix: SmoothQuant static (per tensor, calibrated on the shipped calibration text; and a copy
  calibrated on its English records alone) vs dynamic (per token) vs bf16 serving the mixed multilingual chat + code + arithmetic workload: KL to bf16 overall and per
  language, arithmetic accuracy as served, tokens/s, TTFT and TPOT at rate = inf and a fixed rate; the
  batch-mates result folded in (benchmarks/smoothquant_mix.py)
* spec-rate: plain decoding vs EAGLE k=3 (the shipped head) and prompt lookup, adaptive off and on, at Poisson
  rates from a batch near 1 to saturation: tokens/s, TPOT, mean running batch, tau and the crossover rate
  (benchmarks/spec_rate.py)
* chunked-prefill: max_num_batched_tokens vs TTFT of long prompts and ITL of the requests decoding beside them
  (benchmarks/chunked_prefill.py)

Target: the embedded cinq-tiny (this checkout's assets). Each section writes
benchmarks/results/interactions_<section>.{json,md,png}.

    python benchmarks/interactions.py                          # every section
    python benchmarks/interactions.py --only spec-rate         # one section (repeat --only for more)
    python benchmarks/interactions.py --quick                  # smoke run of the sections, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
SECTIONS = ("batch-mates", "smoothquant-mix", "spec-rate", "chunked-prefill")
MODEL = "cinq-tiny"


def out_prefix(section: str) -> Path:
    return RESULTS / f"interactions_{section.replace('-', '_')}"


def batch_mates_section(quick: bool, variants_dir: str | None) -> dict[str, list[dict[str, Any]]]:
    """SmoothQuant static / dynamic / bf16: a target's greedy output alone vs among random batch mates."""
    from cinq.assets import resolve_model_path
    from benchmarks.batch_mates import batch_mates
    from cinq.bench.report import machine_info
    from benchmarks.smoothquant_mix import SmoothQuantMixOptions, smoothquant_models
    from cinq.bench.workload import TokenWindows, text_tokens
    from cinq.config import EngineConfig
    from cinq.model.tokenizer import Tokenizer
    n_targets, n_pool, prompt_len, max_tokens = (2, 8, 16, 4) if quick else (8, 48, 48, 24)
    sizes = (2, 4) if quick else (2, 8, 16)
    src = str(resolve_model_path(MODEL))
    text = TokenWindows(text_tokens(Tokenizer.from_pretrained(src), "held-out"))
    targets = [text.take(prompt_len) for _ in range(n_targets)]
    pool = [text.take(prompt_len) for _ in range(n_pool)]
    models = smoothquant_models(src, SmoothQuantMixOptions(variants_dir=variants_dir))
    results = {}
    for name, folder in models.items():
        label = f"{name} (control)" if folder == src else name
        cfg = EngineConfig(model=folder, seed=0, max_num_seqs=max(sizes), enable_prefix_caching=False)
        results[label] = batch_mates(cfg, targets, pool, sizes, max_tokens)
        print(label, results[label], flush=True)
    if quick:
        return results
    m = machine_info()
    lines = ["# Interactions: SmoothQuant static vs dynamic under continuous batching", "",
             f"Does a request's greedy output change with its batch mates? cinq-tiny (this checkout's assets) as "
             f"bf16 and SmoothQuant W8A8 copies (alpha 0.5, calibrated on the shipped calibration text). "
             f"{n_targets} target prompts of {prompt_len} held-out tokens, each generated alone ({max_tokens} greedy "
             f"tokens, ignore_eos), then at each batch size inside two different random sets of mates (from "
             f"{n_pool} other held-out windows) at a random position; a pair 'differs' when any of the target's "
             f"tokens differs from its solo output. Prefix caching off (a mate never shares cached blocks). "
             f"CPU threads {m['threads']}, load average {m['loadavg_at_end']}.", "",
             "| model | batch | pairs | outputs differing from solo | mean first divergent token |",
             "|---|---:|---:|---:|---:|"]
    for name, rows in results.items():
        for r in rows:
            pos = "n/a" if r["mean_first_divergence"] is None else f"{r['mean_first_divergence']:.1f}"
            lines.append(f"| {name} | {r['batch']} | {r['pairs']} | {r['differ']} | {pos} |")
    lines += ["", "Reading: 0 differing pairs means the scheme's output does not depend on the batch it runs in. "
              "Dynamic scales here are per token (each row's own max), static ones per tensor and fixed at "
              "calibration, so neither mixes rows; any difference comes from the kernels (integer GEMM or the "
              "bf16 layers around it) computing a row differently at another row count.", ""]
    out = out_prefix("batch-mates")
    out.with_suffix(".md").write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps({"machine": m, "targets": n_targets, "pool": n_pool,
                                                    "prompt_len": prompt_len, "max_tokens": max_tokens,
                                                    "results": results}, indent=2) + "\n")
    print("wrote", out.with_suffix(".md"))
    return results


def saved_batch_mates() -> dict[str, list[dict[str, Any]]] | None:
    """The batch-mates rows of the last full run (its own file, else the first interactions run's file)."""
    path = out_prefix("batch-mates").with_suffix(".json")
    return json.loads(path.read_text())["results"] if path.is_file() else None


# interactions.md: every interaction table of issue 12 in one file, in this order (file stem, heading, and the
# "## " section of that file to take, None for all of it). quant_spec is written by benchmarks/quant_spec.py and
# the eviction sweep by the prefix benchmark; the rest by this script.
INDEX = (("interactions_quant_spec", "Quantized target x speculation", None),
         ("interactions_smoothquant_mix", "SmoothQuant static vs dynamic under mixed batches", None),
         ("interactions_batch_mates", "SmoothQuant: does a request's output depend on its batch mates?", None),
         ("interactions_spec_rate", "Speculation vs request rate, adaptive off and on", None),
         ("prefix", "Prefix-cache hit rate vs KV budget", "## Eviction"),
         ("interactions_chunked_prefill", "Chunked-prefill budget vs TTFT and ITL", None))


def assemble() -> Path:
    """Write benchmarks/results/interactions.md from the section files that exist (each measured on its own; this
    only gathers them, one level deeper, under one table of contents)."""
    parts, toc = [], []
    for stem, title, only in INDEX:
        path = RESULTS / f"{stem}.md"
        if not path.is_file():
            continue
        lines = path.read_text().splitlines()
        if only is not None:  # one "## " section of a larger report
            start = next(i for i, line in enumerate(lines) if line.startswith(only))
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            lines = lines[start + 1:end]
        elif lines and lines[0].startswith("# "):
            lines = lines[1:]
        body = [("#" + line) if line.startswith("#") else line for line in lines]
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")  # GitHub's heading anchors
        toc.append(f"- [{title}](#{anchor}) (from `{path.name}`)")
        parts += [f"## {title}", "", f"*From `{path.name}`.*", "", *body, ""]
    out = RESULTS / "interactions.md"
    out.write_text("\n".join(["# Interactions: how cinq's techniques change each other", "",
                               "Each section is its own measured run (its file, model, load and commands are in the "
                               "section); `python benchmarks/interactions.py --assemble` gathers them here.", "",
                               *toc, "", *parts]).rstrip() + "\n")
    return out


def main() -> int:
    from cinq.process_env import set_omp_wait_policy
    set_omp_wait_policy()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run this section (repeatable; default all)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, writes nothing")
    ap.add_argument("--assemble", action="store_true", help="only gather the section files into interactions.md")
    ap.add_argument("--variants-dir", default=None, help="keep the quantized copies here (default: the cinq cache; "
                                                         "with --quick a temp dir)")
    args = ap.parse_args()
    if args.assemble:
        print("wrote", assemble().relative_to(ROOT))
        return 0
    from benchmarks.chunked_prefill import ChunkedPrefillOptions, run_chunked_prefill
    from cinq.bench.mixed_workload import MixedOptions
    from cinq.bench.report import print_report, write_report
    from cinq.bench.served_quality import QualitySettings
    from benchmarks.smoothquant_mix import SmoothQuantMixOptions, run_smoothquant_mix
    from benchmarks.spec_rate import SpecRateOptions, run_spec_rate
    from cinq.config import EngineConfig
    sections = args.only or list(SECTIONS)
    variants = args.variants_dir or (tempfile.mkdtemp(prefix="cinq-interactions-") if args.quick else None)
    config = EngineConfig(model=MODEL, seed=0)
    mates = None
    for section in sections:
        print(f"== {section}", flush=True)
        if section == "batch-mates":
            mates = batch_mates_section(args.quick, variants)
            continue
        if section == "smoothquant-mix":
            opts = SmoothQuantMixOptions(variants_dir=variants)
            if args.quick:
                opts = SmoothQuantMixOptions(workload=MixedOptions(num_requests=4, output_len=(2, 4)),
                                             quality=QualitySettings(ppl_tokens=64, n_problems=1),
                                             language_tokens=32, request_rate=20.0, variants_dir=variants)
            result = run_smoothquant_mix(config, opts, mates or saved_batch_mates())
        elif section == "spec-rate":
            opts = SpecRateOptions()
            if args.quick:
                opts = SpecRateOptions(rates=(20.0, math.inf), workload=MixedOptions(num_requests=4,
                                                                                     output_len=(4, 8)))
            result = run_spec_rate(config, opts)
        else:
            opts = ChunkedPrefillOptions()
            if args.quick:
                opts = ChunkedPrefillOptions(budgets=(64, 512), num_decoding=2, decode_output_len=8, num_long=1,
                                             long_prompt_len=(256, 320), repeats=1, first_long_s=0.0)
            result = run_chunked_prefill(config, opts)
        print_report(result)
        if not args.quick:
            for path in write_report(result, out_prefix(section)):
                print("wrote", path.relative_to(ROOT), flush=True)
    if not args.quick:
        print("wrote", assemble().relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
