"""OMP_WAIT_POLICY A/B that is fair to each engine: every (engine, policy, threads) runs in its OWN process, so
llama.cpp's OpenMP pool never shares a process (and a policy) with torch's, and each engine is measured under both
policies. cinq's default (cinq/process_env.py) is then picked from the data.

Why separate processes: OpenMP reads OMP_WAIT_POLICY once, when the runtime loads; `cinq bench latency` runs all
its engines in one process, so every engine there got cinq's policy (PASSIVE), which llama.cpp, whose own
default is to spin, may not want.

Each child times batch-1 greedy decode with cinq/bench/latency.py's measurement (a warm-up generation, then
--rounds generations; decode tok/s = 1 / the median step of a generation, median over generations). The parent
alternates policies and engines in one run (the baseline, PASSIVE, is measured beside ACTIVE).

    python benchmarks/omp_wait_policy.py                         # SmolLM2 q4_0 file, cinq int4 vs llama.cpp q4_0
    python benchmarks/omp_wait_policy.py --variants int4,bf16    # + the bf16 pair
    python benchmarks/omp_wait_policy.py --child ...             # one measurement as JSON (what the parent runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
POLICIES = ("PASSIVE", "ACTIVE")


def child(engine: str, variant: str, threads: int, model: str, prompt_len: int, new_tokens: int,
          rounds: int) -> dict[str, Any]:
    """One engine in this process (its policy: this process's OMP_WAIT_POLICY): its latency row."""
    import torch

    from cinq.bench.latency import LatencyOptions, latency_prompts, measure
    from cinq.bench.latency_engines import (GGUF_TYPE, CinqRunner, LlamaCppRunner, TimedEngine, dense_folder,
                                            gguf_file, source_gguf, variant_config)
    from cinq.cache import cache_dir
    from cinq.config import EngineConfig

    torch.set_num_threads(threads)
    work = cache_dir() / "bench-latency"
    work.mkdir(parents=True, exist_ok=True)
    config = EngineConfig(model=model, dtype="bfloat16")
    options = LatencyOptions(input_lens=(prompt_len,), output_len=new_tokens, num_iters=1, rounds=rounds,
                             baselines=(), variants=(variant,), threads_list=(threads,), work_dir=work)
    if engine == "cinq":
        runner: Any = CinqRunner(variant_config(config, variant, work))
        name, vocab = f"cinq {variant}", runner.engine.vocab_size
    else:
        path = source_gguf(config) if variant == "file" else gguf_file(dense_folder(config, work),
                                                                          GGUF_TYPE[variant], work)
        runner = LlamaCppRunner(path, threads, prompt_len + new_tokens + 16)
        name, vocab = f"llama.cpp {GGUF_TYPE.get(variant, 'file')}", runner.greedy.llm.n_vocab()
    rows = measure([TimedEngine(name, threads, runner)], latency_prompts(options, vocab), options, progress=False)
    return {**rows[0], "policy": os.environ.get("OMP_WAIT_POLICY"), "loadavg": os.getloadavg()}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (variant, threads, engine, policy), each in a fresh child process, policies alternated."""
    rows = []
    for variant in args.variants.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            for engine in ("cinq", "llama.cpp"):
                for policy in POLICIES:
                    env = dict(os.environ, OMP_WAIT_POLICY=policy, PYTHONPATH=str(ROOT))
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--engine", engine,
                           "--variants", variant, "--threads", str(threads), "--model", args.model,
                           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
                           "--rounds", str(args.rounds)]
                    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
                    row = json.loads(out.strip().splitlines()[-1])
                    print(f"{row['engine']:>16} {threads} thr {policy:>7}: {row['tok_s']:.1f} tok/s", flush=True)
                    rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], load_at_start: float, args: argparse.Namespace) -> Any:
    from cinq.bench.report import BenchResult, Table, machine_info, run_conditions
    _, conditions = run_conditions(load_at_start)
    tok = {(r["engine"], r["threads"], r["policy"]): r["tok_s"] for r in rows}
    table = Table("decode tok/s by OMP_WAIT_POLICY, each engine in its own process",
                  ["engine", "threads", "PASSIVE tok/s", "ACTIVE tok/s", "ACTIVE / PASSIVE"])
    for engine, threads in dict.fromkeys((r["engine"], r["threads"]) for r in rows):
        p, a = tok.get((engine, threads, "PASSIVE")), tok.get((engine, threads, "ACTIVE"))
        table.rows.append([engine, threads, p, a, a / p if p and a else None])
    cinq = [row for row in table.rows if row[0].startswith("cinq") and row[4] is not None]
    headline = "cinq ACTIVE / PASSIVE decode tok/s: " + ", ".join(f"{r[4]:.2f}x ({r[0]}, {r[1]} thr)" for r in cinq)
    setup = (f"{conditions} `python benchmarks/omp_wait_policy.py --variants {args.variants} --threads "
             f"{args.threads}`: {args.model}, batch 1, greedy, prompt {args.prompt_len}, {args.new_tokens} new "
             f"tokens, {args.rounds} generations after a warm-up one; every (engine, policy, threads) in its own "
             f"process with OMP_WAIT_POLICY set before the OpenMP runtime loads.")
    return BenchResult("omp_wait_policy", "OMP_WAIT_POLICY: each engine in its own process", setup, [table],
                       headline, {"rows": rows, "machine": machine_info(load_at_start)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--variants", default="int4", help="cinq variants (bf16, int8, int4, file), each vs llama.cpp's")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="cinq", help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.engine, args.variants, int(args.threads), args.model, args.prompt_len,
                               args.new_tokens, args.rounds), default=str))
        return 0
    load_at_start = os.getloadavg()[0]
    rows = run(args)
    sys.path.insert(0, str(ROOT))
    from cinq.bench.report import print_report, write_report
    result = report(rows, load_at_start, args)
    print_report(result)
    if not args.no_write:
        write_report(result, RESULTS / "omp_wait_policy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
