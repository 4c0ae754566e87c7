"""Batch-1 decode speed of quantized folders against their dense baseline, measured in one run: every folder is
loaded once (the serving engine, bf16, cinq's kernels for its format), then greedy requests of ``--tokens`` tokens
(prefill excluded) run round-robin over the folders, ``--rounds`` times, so that a change of the machine's load
falls on all of them alike; the median per folder is reported with its ratio to the first folder and to the
``--int4`` one. The study rows (cinq eval) measure each row once, minutes apart; this is the paired comparison.

    python benchmarks/float_codes_decode.py bf16=DENSE int4-rtn-g64=STUDY/variants/rtn-w4-g64 nf4=... \\
        --name quant_study_float_codes_decode
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="LABEL=FOLDER; the first is the baseline")
    ap.add_argument("--int4", default=None, help="the label of the int4 row for the second ratio column")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="quant_study_float_codes_decode")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    from cinq.eval.generation import EngineGenerator
    from cinq.model.tokenizer import Tokenizer
    pairs = [f.split("=", 1) for f in args.folders]
    gens = {label: EngineGenerator(path, dtype="bfloat16", max_num_seqs=1, tokens_per_seq=256)
            for label, path in pairs}
    tok = Tokenizer.from_pretrained(pairs[0][1])
    prompt = tok.encode("Question: Anna has 12 apples. Then Anna buys 5 more. How many apples does Anna have?")
    load_start = os.getloadavg()[0]
    rates: dict[str, list[float]] = {label: [] for label in gens}
    for _ in range(args.rounds):
        for label, gen in gens.items():
            rates[label].append(gen.decode_tokens_per_s(prompt, args.tokens, 1))
    med = {k: statistics.median(v) for k, v in rates.items()}
    base = pairs[0][0]
    kernels = {label: gen.kernels() for label, gen in gens.items()}
    lines = [f"# Batch-1 decode of quantized folders vs {base} (one run, round-robin)", "",
             f"**DRAFT**: a shared 2-core machine (load average {load_start:.2f} at the start, "
             f"{os.getloadavg()[0]:.2f} at the end); `python benchmarks/float_codes_decode.py` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}), {args.threads} thread(s), {args.tokens} "
             f"greedy tokens after the prefill, {args.rounds} rounds, median.", "",
             "| folder | kernels | tok/s (median) | runs | vs " + base + (f" | vs {args.int4}" if args.int4 else "")
             + " |", "|---|---|---:|---|---:|" + ("---:|" if args.int4 else "")]
    for label, m in med.items():
        runs = ", ".join(f"{r:.1f}" for r in rates[label])
        extra = f" | {m / med[args.int4]:.2f}x" if args.int4 else ""
        lines.append(f"| {label} | {', '.join(kernels[label])} | {m:.1f} | {runs} | {m / med[base]:.2f}x{extra} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{args.name}.json").write_text(json.dumps({"rates": rates, "median": med, "kernels": kernels,
                                                       "tokens": args.tokens, "threads": args.threads,
                                                       "load_start": load_start}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
