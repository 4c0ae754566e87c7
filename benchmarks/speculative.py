"""Speculative decoding: plain decoding vs every method, same target, same prompts, one run.

Target: the embedded cinq-tiny (bf16, and a GPTQ int4 g128 copy made here from corpus calibration text).
Methods: n-gram (prompt lookup), draft model (cinq-tiny-student), Medusa, EAGLE and EAGLE-3 heads shipped in
cinq/assets (chain drafts; trees where built), each with a fixed k and adaptive. Greedy decoding, so that
"identical" can be checked against plain decoding in the same run.

Tables (benchmarks/results/speculative.{md,json} + speculative.png):
* batch sweep 1 / 4 / 16 / 32 on held-out multilingual prompts (corpus test split, all languages mixed):
  output tokens/s, speedup over plain at the same batch, tau, acceptance per position, draft overhead share;
* per language at batch 1: tau and speedup for en/de/es/it/ru/pl/cs/zh, and the worst/best tau ratio;
* the copy workload (the answer repeats the prompt) where prompt lookup pays.

Each measurement is `cinq bench spec`'s (cinq/bench/spec.py: ``measure``, ``compare``); this script sweeps every
shipped method over both targets, the languages and the copy workload.

    python benchmarks/speculative.py               # writes the results
    python benchmarks/speculative.py --quick       # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

import torch  # noqa: E402

from cinq.assets import ASSETS_DIR, shipped_model_path  # noqa: E402
from cinq.bench.spec import compare as bench_compare  # noqa: E402
from cinq.bench.spec import measure  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".cache" / "bench"
TARGET = shipped_model_path("cinq-tiny")
# a static tree of 3 drafts (two candidates for the next token, one after the best): 4 rows, one head step past
# the catch-up; EAGLE-2's dynamic tree with the same budget: 2 candidates per level, 2 levels, the 3 best nodes
TREE = [[0], [1], [0, 0]]
DYNAMIC = {"tree_topk": 2, "tree_depth": 2}
LANGUAGES = ("en", "de", "es", "it", "ru", "pl", "cs", "zh")  # the corpus's natural languages, high to low resource
COPY_PASSAGES = [
    "The river runs north through the valley, past the old mill and the stone bridge, and into the lake where "
    "the fishermen wait each morning for the mist to lift.",
    "To build the project, install the compiler, run the configure script, and then call make with the number "
    "of cores you have; the tests run with make check.",
    "Die Stadt liegt am Fluss, und im Sommer sitzen die Leute bis spät am Abend draußen vor den Cafés am Ufer.",
    "El mercado abre temprano: los vendedores llegan antes del amanecer con frutas, pan y flores del campo.",
]


def methods(k: int) -> dict[str, dict]:
    """name -> speculative_config, for what is shipped (a head folder missing: that method is skipped)."""
    out = {"ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
           "draft_model": {"method": "draft_model", "model": "cinq-tiny-student", "num_speculative_tokens": k}}
    for method in ("medusa", "eagle", "eagle3"):
        folder = shipped_model_path(f"cinq-tiny-{method}")
        if folder is not None:
            out[method] = {"method": method, "model": str(folder), "num_speculative_tokens": k}
            out[f"{method}-tree"] = {"method": method, "model": str(folder), "num_speculative_tokens": len(TREE),
                                     "speculative_token_tree": TREE}
            if method == "eagle3":
                out["eagle3-dynamic"] = {"method": method, "model": str(folder), "num_speculative_tokens": len(TREE),
                                         **DYNAMIC}
    return out


def corpus_dir() -> Path:
    """The corpus test split's prompts (`cinq data build`, ~40 s, built once into .cache)."""
    data = CACHE / "corpus"
    if not (data / "test.tokens.npy").is_file():  # written last
        from cinq.train.build import build_dataset
        from cinq.train.corpus import CorpusSettings
        from cinq.train.sources import debian_sources
        build_dataset(debian_sources(), data, CorpusSettings(), 8192, str(ASSETS_DIR / "tokenizer"))
    return data


def language_prompts(per_lang: int) -> dict[str, list[list[int]]]:
    from cinq.train.seqkd import balanced_prompts
    pairs = balanced_prompts(corpus_dir(), per_lang * 16, seed=11, max_prompt=24, split="test")
    out: dict[str, list[list[int]]] = {lang: [] for lang in LANGUAGES}
    for lang, prompt in pairs:
        if lang in out and len(out[lang]) < per_lang:
            out[lang].append(prompt)
    return {lang: ps for lang, ps in out.items() if ps}


def int4_target() -> Path:
    """cinq-tiny quantized with GPTQ (int4, groups of 128) on corpus text, made once into .cache."""
    out = CACHE / "cinq-tiny-gptq-int4"
    if (out / "config.json").is_file():
        return out
    from cinq.quant.calibration import calibration_windows
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    from cinq.train.data import TokenSplit
    stream = TokenSplit.load(corpus_dir(), "train").stream(max_tokens=200_000)
    calib = calibration_windows(list(stream), 64, 256, 0)
    quantize_model(TARGET, out, QuantConfig(method="gptq", bits=4, group_size=128), calib, progress=False)
    return out


THREADS: int | None = None  # --threads


def run(target: Path, spec: dict | None, prompts: list[list[int]], batch: int, max_tokens: int) -> dict:
    """One measurement (cinq/bench/spec.py's ``measure``) of ``target`` with ``spec`` (None: plain decoding)."""
    config = EngineConfig(model=str(target), dtype="bfloat16", speculative_config=spec, kv_cache_memory=0.5,
                          num_threads=THREADS)
    return measure(config, prompts, batch, max_tokens)


def compare(rows: list[dict], label: dict, base: dict, r: dict) -> None:
    rows.append(bench_compare(label, base, r))
    row = rows[-1]
    print(" ".join(f"{k}={v}" for k, v in label.items()),
          f"{base['tok_s']:.1f} -> {r['tok_s']:.1f} tok/s (RATIO {row['speedup']:.2f}x) tau "
          f"{r['tau'] or 0:.2f} draft {100 * r['draft_share']:.0f}% identical={row['greedy_identical']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--per-lang", type=int, default=4, help="held-out prompts per language")
    ap.add_argument("--methods", default=None, help="comma list (default: every shipped method)")
    ap.add_argument("--int4-batches", default="1,32", help="batch sizes measured on the int4 target")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    max_tokens = 16 if args.quick else args.max_tokens
    batches = [1, 4] if args.quick else [int(b) for b in args.batches.split(",")]
    specs = methods(args.k)
    if args.methods:
        specs = {m: specs[m] for m in args.methods.split(",")}
    by_lang = language_prompts(1 if args.quick else args.per_lang)
    mixed = [p for ps in zip(*by_lang.values()) for p in ps]
    targets = {"bf16": TARGET} if args.quick else {"bf16": TARGET, "int4": int4_target()}
    sweep, lang_rows, copy_rows = [], [], []
    int4_batches = [int(b) for b in args.int4_batches.split(",")]
    for tname, target in targets.items():
        for batch in batches if tname == "bf16" else int4_batches:
            # plain decoding before and after the methods: the baseline is their mean, and their spread says how
            # much the machine drifted meanwhile (a shared machine: read the ratios with it)
            base = run(target, None, mixed, batch, max_tokens)
            results = [(mname, adaptive, run(target, {**spec, "adaptive": adaptive}, mixed, batch, max_tokens))
                       for mname, spec in specs.items() for adaptive in (False, True)]
            again = run(target, None, mixed, batch, max_tokens)
            drift = again["tok_s"] / base["tok_s"]
            base["tok_s"] = (base["tok_s"] + again["tok_s"]) / 2
            for mname, adaptive, r in results:
                compare(sweep, {"target": tname, "batch": batch, "method": mname, "adaptive": adaptive,
                                "baseline_drift": round(drift, 3)}, base, r)
    for lang, prompts in by_lang.items():
        base = run(TARGET, None, prompts, 1, max_tokens)
        for mname, spec in specs.items():
            compare(lang_rows, {"lang": lang, "method": mname}, base, run(TARGET, spec, prompts, 1, max_tokens))
    from cinq.model.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(TARGET)
    copy = [tok.encode(f"{p}\n\nAgain, word for word:\n\n{p[:40]}") for p in COPY_PASSAGES]
    base = run(TARGET, None, copy, 1, max_tokens)
    for mname, spec in specs.items():
        compare(copy_rows, {"workload": "copy", "method": mname}, base, run(TARGET, spec, copy, 1, max_tokens))
    if not args.quick:
        write(sweep, lang_rows, copy_rows, max_tokens, args.k)


def write(sweep: list[dict], lang_rows: list[dict], copy_rows: list[dict], max_tokens: int, k: int) -> None:
    from benchmarks.speculative_report import render
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "loadavg_at_end": os.getloadavg(), "max_tokens": max_tokens, "k": k}
    data = {"machine": meta, "batch_sweep": sweep, "languages": lang_rows, "copy": copy_rows}
    (RESULTS / "speculative.json").write_text(json.dumps(data, indent=2) + "\n")
    render(data, RESULTS / "speculative.md", RESULTS / "speculative.png")
    print(f"wrote {RESULTS / 'speculative.md'}")


if __name__ == "__main__":
    main()
