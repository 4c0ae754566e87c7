"""Speculative decoding on the real SmolLM2-135M-Instruct: plain decoding vs n-gram and an EAGLE-3 head (chain,
fixed k and adaptive), same target, same prompts, one run; tau per language at batch 1.

Prompts: the held-out chat turns of cinq/train/spec_head_prompts.py (test topics, which no head trained on), the
same number per language, rendered with the model's chat template; greedy decoding (so outputs can be compared
with plain decoding), ``--max-tokens`` new tokens each, in waves of ``batch`` requests
(cinq/bench/spec.py ``measure`` / ``compare``). Plain decoding is measured before and after each method's runs
at each batch size (once for all methods); the baseline is their mean.

    python benchmarks/speculative_smollm2.py --head runs/eagle3-smollm2/head        # ~7 min on a quiet machine
    python benchmarks/speculative_smollm2.py --head H --batch-sizes 1 --max-tokens 16 --no-languages   # smoke

Writes benchmarks/results/speculative_smollm2.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

from cinq.bench.report import BenchResult, Table, machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.bench.spec import compare, measure  # noqa: E402
from cinq.config import EngineConfig, resolve_model  # noqa: E402
from cinq.model.tokenizer import Tokenizer  # noqa: E402
from cinq.train.spec_head_prompts import CHAT_LANGUAGES, chat_prompts  # noqa: E402

MODEL = "smollm2-135m-instruct"


def methods(head: str | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        "ngram k=4": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                      "prompt_lookup_min": 2}}
    if head:
        out["eagle3 k=3"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 3}
        out["eagle3 adaptive k<=4"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 4,
                                       "adaptive": True}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default=None, help="EAGLE-3 head folder for SmolLM2 (omit: n-gram only)")
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--per-language", type=int, default=2, help="held-out prompts per language")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-languages", action="store_true", help="skip the per-language tau table")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "speculative_smollm2"))
    args = ap.parse_args()
    draft, note = run_conditions(os.getloadavg()[0])
    folder = resolve_model(MODEL)
    pairs = chat_prompts(Tokenizer.from_pretrained(folder), args.per_language * len(CHAT_LANGUAGES), 0, 256, "test")
    prompts = [p for _, p in pairs]
    plain = EngineConfig(model=MODEL, dtype=args.dtype)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows: list[dict[str, Any]] = []
    table = Table("Plain decoding vs speculation (greedy)", ["method", "batch", "plain tok/s", "spec tok/s",
                                                             "speedup", "tau", "acceptance per position",
                                                             "draft share (%)", "greedy identical"])
    configs = {name: dataclasses.replace(plain, speculative_config=dict(sc)) for name, sc in methods(args.head).items()}
    for b in batches:  # one baseline per batch size, shared by the methods: plain before and after them all
        first = measure(plain, prompts, b, args.max_tokens)
        specs = {name: measure(cfg, prompts, b, args.max_tokens) for name, cfg in configs.items()}
        last = measure(plain, prompts, b, args.max_tokens)
        drift = round(last["tok_s"] / first["tok_s"], 3)
        first["tok_s"] = (first["tok_s"] + last["tok_s"]) / 2
        for name, spec in specs.items():
            row = compare({"method": name, "batch": b, "baseline_drift": drift}, first, spec)
            rows.append(row)
            table.rows.append([name, b, row["plain_tok_s"], row["spec_tok_s"], row["speedup"], row["tau"],
                               ", ".join(f"{a:.2f}" for a in row["accept_per_pos"]), 100 * row["draft_share"],
                               row["greedy_identical"]])
            print(f"{name} batch {b}: {row['speedup']:.2f}x tau {row['tau']}", flush=True)
    tables = [table]
    langs: dict[str, dict[str, Any]] = {}
    if not args.no_languages:
        lt = Table("Per language at batch 1: tau (speedup against plain on the same prompts)",
                   ["method", *CHAT_LANGUAGES, "worst/best tau"])
        for lang in CHAT_LANGUAGES:
            lp = [p for lg, p in pairs if lg == lang]
            base = measure(plain, lp, 1, args.max_tokens)
            for name, cfg in configs.items():
                spec = measure(cfg, lp, 1, args.max_tokens)
                langs.setdefault(name, {})[lang] = {"tau": spec["tau"], "speedup": spec["tok_s"] / base["tok_s"]}
        for name, per in langs.items():
            taus = [v["tau"] or 1.0 for v in per.values()]
            lt.rows.append([name, *(f"{per[lg]['tau'] or 1:.2f} ({per[lg]['speedup']:.2f}x)" for lg in CHAT_LANGUAGES),
                            f"{min(taus) / max(taus):.2f}"])
        tables.append(lt)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    best = max(rows, key=lambda r: r["speedup"]) if rows else None
    result = BenchResult(
        "speculative_smollm2", "Speculative decoding on SmolLM2-135M-Instruct (n-gram, EAGLE-3 head)",
        f"{note} Target {MODEL} ({args.dtype}), {len(prompts)} held-out chat prompts ({args.per_language} per "
        f"language: {', '.join(CHAT_LANGUAGES)}), {args.max_tokens} new tokens each, greedy, ignore_eos. Head: "
        f"{args.head or 'none'}. Commit {commit}.", tables,
        (f"best: {best['method']} at batch {best['batch']}: {best['speedup']:.2f}x (tau {best['tau']})"
         if best else "no rows"),
        {"draft": draft, "machine": machine_info(), "commit": commit, "head": args.head, "rows": rows,
         "languages": langs,
         "options": {**vars(args), "out": str(Path(args.out).relative_to(ROOT)) if Path(args.out).is_relative_to(ROOT) else args.out}})
    print_report(result)
    write_report(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
