"""What a speculative verify step costs on SmolLM2-135M-Instruct, against a plain decode step of the same sequences,
in the same run: the price every draft must pay back, and what adaptive k explores.

The engines decode the held-out chat prompts with n-gram drafts at a fixed k (no adaptive choice, so every shape
occurs), and with speculation off. Every engine step is timed and keyed by its shape: decode-only steps by
(sequences, rows), where rows = sequences is a plain step and more rows verify drafts; a step is "ragged" when its
requests verify different numbers of drafts (some found no n-gram match). Per shape seen at least
``--min-steps`` times: the median step time, and its ratio to the plain engine's median step at the same number of
sequences.

    python benchmarks/verify_step_cost.py                       # the Q4_1 file, batch 1, 2, 4, 8
    python benchmarks/verify_step_cost.py --weights bf16 --out benchmarks/results/verify_step_cost_bf16
    python benchmarks/verify_step_cost.py --batch-sizes 2 --rounds 1 --out /tmp/smoke   # smoke

Writes benchmarks/results/verify_step_cost.{json,md}. ``--before OLD.json``: a run of an older checkout (this
script copied into it), shown beside this one per shape (each run's ratios are against its own plain steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

from cinq.bench.report import BenchResult, Table, machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.bench.spec import engine, measure  # noqa: E402
from cinq.config import EngineConfig, resolve_model  # noqa: E402
from cinq.model.tokenizer import Tokenizer  # noqa: E402
from cinq.train.spec_head_prompts import CHAT_LANGUAGES, chat_prompts  # noqa: E402

MODEL = "smollm2-135m-instruct"


class StepTimes:
    """Wall time of every ``step()`` of an in-process LLM, keyed by the shape its scheduler gave it:
    ("decode", sequences, rows) or ("prefill", sequences, rows)."""

    def __init__(self, llm: Any) -> None:
        self.times: dict[tuple[str, int, int], list[float]] = {}
        eng, self._key = llm.engine, None
        schedule, step = eng.scheduler.schedule, eng.step

        def timed_schedule() -> Any:
            out = schedule()
            self._key = ("prefill" if out.num_prompt_tokens else "decode", len(out.seqs), out.num_batched_tokens)
            return out

        def timed_step() -> Any:
            t0 = time.perf_counter()
            outs = step()
            if self._key is not None and self._key[1]:
                self.times.setdefault(self._key, []).append(time.perf_counter() - t0)
            self._key = None
            return outs

        eng.scheduler.schedule, eng.step = timed_schedule, timed_step


def shapes(times: StepTimes, k: int, min_steps: int) -> list[dict[str, Any]]:
    """Decode-only shapes seen at least ``min_steps`` times: sequences, rows, whether ragged, steps, median ms."""
    out = []
    for (kind, seqs, rows), ts in sorted(times.times.items()):
        if kind != "decode" or len(ts) < min_steps:
            continue
        out.append({"seqs": seqs, "rows": rows, "ragged": rows not in (seqs, seqs * (k + 1)), "steps": len(ts),
                    "median_ms": 1000 * statistics.median(ts)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", choices=("file", "bf16"), default="file")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--k", type=int, default=2, help="n-gram drafts per step (fixed)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the prompts per engine and batch size")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--min-steps", type=int, default=20)
    ap.add_argument("--before", default="", help="a verify_step_cost .json of an older checkout, shown beside")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "verify_step_cost"))
    args = ap.parse_args()
    draft, note = run_conditions(os.getloadavg()[0])
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    tokenizer = Tokenizer.from_pretrained(resolve_model(MODEL))
    prompts = [p for _, p in chat_prompts(tokenizer, 2 * len(CHAT_LANGUAGES), 0, 256, "test")]
    model = MODEL
    if args.weights == "bf16":
        from cinq.bench.latency_engines import dense_folder
        from cinq.cache import cache_dir
        model = str(dense_folder(EngineConfig(model=MODEL), cache_dir() / "bench-latency"))
    base = EngineConfig(model=model, dtype="bfloat16")
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    llms = {"plain": engine(base), "ngram": engine(dataclasses.replace(base, speculative_config=spec))}
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        timers = {name: StepTimes(llm) for name, llm in llms.items()}
        for _ in range(args.rounds):
            for llm in llms.values():
                measure(llm, prompts, b, args.max_tokens)
        for llm in llms.values():  # the timers wrap this batch size's steps only
            llm.engine.__dict__.pop("step", None)
            llm.engine.scheduler.__dict__.pop("schedule", None)
        plain = {s["seqs"]: s["median_ms"] for s in shapes(timers["plain"], 0, args.min_steps)}
        for s in shapes(timers["ngram"], args.k, args.min_steps):
            s.update(batch=b, plain_ms=plain.get(s["seqs"]))
            s["ratio"] = s["median_ms"] / s["plain_ms"] if s["plain_ms"] else None
            rows.append(s)
    before = {}
    if args.before:
        old = json.loads(Path(args.before).read_text())
        before = {(r["batch"], r["seqs"], r["rows"]): r for r in old["rows"]}
        before_commit = old.get("commit", "?")
    cols = ["batch", "sequences", "rows", "ragged", "steps", "step ms", "plain step ms", "cost / plain"]
    if before:
        cols += [f"cost / plain at {before_commit}", "step ms before / now"]
    table = Table("Decode-only steps of the n-gram engine, by shape", cols)
    for r in rows:
        if r["rows"] == r["seqs"] and not before:
            continue
        cells = [r["batch"], r["seqs"], r["rows"], "yes" if r["ragged"] else "", r["steps"], r["median_ms"],
                 r["plain_ms"], r["ratio"]]
        if before:
            o = before.get((r["batch"], r["seqs"], r["rows"]))
            cells += [o and o["ratio"], o and o["median_ms"] / r["median_ms"]]
        table.rows.append(cells)
    ragged = [r["ratio"] for r in rows if r["ragged"] and r["ratio"]]
    uniform = [r["ratio"] for r in rows if not r["ragged"] and r["rows"] > r["seqs"] and r["ratio"]]
    headline = (f"verify step over plain, median over shapes: uniform {statistics.median(uniform):.2f}x, ragged "
                f"{statistics.median(ragged):.2f}x" if ragged and uniform else "too few verify steps")
    if before:
        olds = [before[(r["batch"], r["seqs"], r["rows"])]["ratio"] for r in rows if r["ragged"]
                and (r["batch"], r["seqs"], r["rows"]) in before and before[(r["batch"], r["seqs"], r["rows"])]["ratio"]]
        if olds:
            headline += f" (ragged at {before_commit}: {statistics.median(olds):.2f}x)"
    result = BenchResult(
        Path(args.out).name, "What a verify step costs on SmolLM2-135M-Instruct",
        f"{note} Target {MODEL} ({'its Q4_1 file' if args.weights == 'file' else 'the file dequantized to bf16'}), "
        f"{len(prompts)} held-out chat prompts, {args.max_tokens} new tokens each, ignore_eos, greedy; n-gram k = "
        f"{args.k} (fixed) and plain decoding, each {args.rounds} pass(es) per batch size, alternating. Step time: the "
        f"median wall time of the engine's step() per shape (decode-only steps seen >= {args.min_steps} times); "
        f"cost / plain: over the plain engine's median step with as many sequences. Commit {commit}.",
        [table], headline, {"draft": draft, "machine": machine_info(), "commit": commit, "rows": rows,
                            "k": args.k, "weights": args.weights})
    print_report(result)
    write_report(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
