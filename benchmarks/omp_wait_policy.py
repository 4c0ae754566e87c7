"""OpenMP wait-policy A/B that is fair to each engine: every (engine, policy, threads) runs in its OWN process, so
llama.cpp's OpenMP pool never shares a process (and a policy) with torch's, and each engine is measured under every
policy. cinq's default (cinq/process_env.py) is then picked from the data.

Why separate processes: OpenMP reads its wait settings once, when the runtime loads; `cinq bench latency` runs
all its engines in one process, so every engine there got cinq's policy (PASSIVE), which llama.cpp, whose own
default is to spin, may not want.

Policies (``--policies``, comma-separated; the variables each child gets: cinq.process_env.omp_wait_env, the
same function ``set_omp_wait_policy`` uses, and any OMP_WAIT_POLICY / GOMP_SPINCOUNT of this shell is dropped):

    PASSIVE   OMP_WAIT_POLICY=PASSIVE                      idle workers sleep at once (cinq's default)
    ACTIVE    OMP_WAIT_POLICY=ACTIVE                       idle workers spin until the next parallel region
    SPIN=n    OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=n     libgomp workers spin n times (~100k a ms), then sleep

``--under-load N`` (or a list, ``0,2``) runs every measurement again beside N busy pure-Python processes
(benchmarks/background_load.py), started before and killed after that condition's runs, so "under load" is a
condition the run creates and labels; the machine's own load when the run began labels it quiet or draft.

Each child times batch-1 greedy decode with cinq/bench/latency.py's measurement (a warm-up generation, then
--rounds generations; decode tok/s = 1 / the median step of a generation, median over generations). The parent
alternates policies within each (engine, threads) so the baseline, PASSIVE, is measured beside the others.

    python benchmarks/omp_wait_policy.py                         # SmolLM2 int4 vs llama.cpp q4_0, every policy
    python benchmarks/omp_wait_policy.py --variants int4,bf16    # + the bf16 pair
    python benchmarks/omp_wait_policy.py --policies PASSIVE,SPIN=100000 --under-load 0,2 --out omp_wait_policy_draft
    python benchmarks/omp_wait_policy.py --child ...             # one measurement as JSON (what the parent runs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.background_load import busy_processes  # noqa: E402
from cinq.errors import InvalidParameterError  # noqa: E402
from cinq.process_env import OMP_WAIT_ENV_VARS, omp_wait_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_POLICIES = "PASSIVE,ACTIVE,SPIN=10000,SPIN=100000,SPIN=300000"
BASELINE = "PASSIVE"
FAILED_NOTE = "n/a for a speed: that child failed or ran past --child-timeout (its error is in the JSON's rows)."


def policy_label(policy: str) -> str:
    """One spelling per policy (``spin=10_000`` -> ``SPIN=10000``), from the variables it sets."""
    env = omp_wait_env(policy)
    return f"SPIN={env['GOMP_SPINCOUNT']}" if "GOMP_SPINCOUNT" in env else env["OMP_WAIT_POLICY"]


def parse_policies(text: str) -> list[str]:
    """``--policies``: canonical labels, in the order given, each once."""
    try:
        return list(dict.fromkeys(policy_label(p) for p in text.split(",") if p.strip()))
    except InvalidParameterError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_loads(text: str) -> list[int]:
    """``--under-load``: busy-process counts, each 0 or more."""
    loads = [int(n) for n in text.split(",") if n.strip()]
    if not loads or min(loads) < 0:
        raise argparse.ArgumentTypeError(f"--under-load takes counts of busy processes, 0 or more: got {text!r}")
    return list(dict.fromkeys(loads))


def child_env(policy: str) -> dict[str, str]:
    """This process's environment with exactly ``policy``'s OpenMP variables (this shell's own ones dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_WAIT_ENV_VARS}
    return {**env, **omp_wait_env(policy), "PYTHONPATH": str(ROOT)}


def child(engine: str, variant: str, threads: int, model: str, prompt_len: int, new_tokens: int,
          rounds: int) -> dict[str, Any]:
    """One engine in this process (its policy: this process's OpenMP variables): its latency row."""
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
    extra = {}
    if engine == "cinq":  # the bandwidth roofline's two terms: bytes a token reads, and what this machine reads
        from cinq.plan.probe import read_bandwidth
        info = runner.engine.info
        extra = {"weight_bytes": info.weight_bytes, "step_read_bytes": info.step_read_bytes,
                 "probe_gb_s": read_bandwidth() / 1e9}
    return {**rows[0], **extra, "omp_env": {k: os.environ.get(k) for k in OMP_WAIT_ENV_VARS},
            "loadavg": os.getloadavg()}


def measure_one(args: argparse.Namespace, engine: str, variant: str, threads: int, policy: str) -> dict[str, Any]:
    """One child's row; a child that fails or runs past --child-timeout gives a row with tok_s None and why."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--engine", engine, "--variants", variant,
           "--threads", str(threads), "--model", args.model, "--prompt-len", str(args.prompt_len),
           "--new-tokens", str(args.new_tokens), "--rounds", str(args.rounds)]
    try:
        done = subprocess.run(cmd, env=child_env(policy), cwd=ROOT, capture_output=True, text=True,
                              timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"tok_s": None, "error": f"ran past --child-timeout {args.child_timeout} s"}
    if done.returncode != 0:
        return {"tok_s": None, "error": done.stderr.strip()[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (load, variant, threads, engine, policy), each in a fresh child process, policies alternated, the
    whole cycle of policies --repeats times."""
    rows = []
    for load in args.under_load:
        with busy_processes(load):
            for variant in args.variants.split(","):
                for threads in (int(t) for t in args.threads.split(",")):
                    for engine in args.engines.split(","):
                        for repeat, policy in ((r, p) for r in range(args.repeats) for p in args.policies):
                            row = measure_one(args, engine, variant, threads, policy)
                            row.update(engine_kind=engine, variant=variant, threads=threads, policy=policy,
                                       under_load=load, repeat=repeat)
                            row.setdefault("engine", f"{engine} {variant}")
                            tok = "failed: " + row["error"][-200:] if row["tok_s"] is None else f"{row['tok_s']:.1f}"
                            print(f"load {load} {row['engine']:>16} {threads} thr {policy:>12}: {tok} tok/s",
                                  flush=True)
                            rows.append(row)
    return name_failed_rows(rows)


def name_failed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A failed child reported no engine name (``llama.cpp q4_0`` for variant int4): give it the name its engine
    and variant's measured rows have, so it lands in their table row."""
    names = {(r["engine_kind"], r["variant"]): r["engine"] for r in rows if r["tok_s"] is not None}
    for r in rows:
        if r["tok_s"] is None:
            r["engine"] = names.get((r["engine_kind"], r["variant"]), r["engine"])
    return rows


def load_title(load: int) -> str:
    return "" if load == 0 else f", under load ({load} busy processes started by the benchmark)"


def roofline(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """Per (cinq variant, threads), without a benchmark-made load: the bytes of weights a decode step reads (the
    engine's ``step_read_bytes``: every weight once per token at batch 1, a tied embedding once as the LM head, an
    untied one not at all; runs recorded before it existed give all the engine's weights), the
    read probe (median over its children), the roofline (probe / bytes, tok/s) and each engine's best speed over
    the policies as a share of it; llama.cpp's against the same roofline where it ran the same weights (bf16)."""
    out = {}
    for (variant, threads) in dict.fromkeys((r["variant"], r["threads"]) for r in rows if "weight_bytes" in r):
        mine = [r for r in rows if r["variant"] == variant and r["threads"] == threads and not r["under_load"]]
        probes = [r["probe_gb_s"] for r in mine if "probe_gb_s" in r]
        if not probes:
            continue
        nbytes = next(r.get("step_read_bytes") or r["weight_bytes"] for r in mine if "weight_bytes" in r)
        tok_s = nbytes and statistics.median(probes) * 1e9 / nbytes
        cell = {"weight_mb": nbytes / 1e6, "probe_gb_s": statistics.median(probes), "roofline_tok_s": tok_s}
        for kind in ("cinq", "llama.cpp"):
            speeds = [r["tok_s"] for r in mine if r["engine_kind"] == kind and r["tok_s"] is not None]
            if speeds and tok_s and (kind == "cinq" or variant == "bf16"):
                cell[f"{kind}_share"] = max(speeds) / tok_s
        out[(variant, threads)] = cell
    return out


def roofline_table(rows: list[dict[str, Any]]) -> Any:
    from cinq.bench.report import Table
    table = Table("bandwidth roofline at batch 1 (read probe / weight bytes per token; best policy)",
                  ["variant", "threads", "weights MB", "read probe GB/s", "roofline tok/s", "cinq % of it",
                   "llama.cpp % of it"])
    for (variant, threads), c in roofline(rows).items():
        table.rows.append([variant, threads, c["weight_mb"], c["probe_gb_s"], c["roofline_tok_s"],
                           *(100 * c[k] if k in c else None for k in ("cinq_share", "llama.cpp_share"))])
    return table


def report(rows: list[dict[str, Any]], load_at_start: float, args: argparse.Namespace) -> Any:
    """One table per load condition: a row per (engine, threads), a column per policy, then each policy / PASSIVE
    (or / the first policy when PASSIVE was not run), each speed the median over the repeats that gave one; the
    headline: cinq's ratios."""
    from cinq.bench.report import BenchResult, Table, machine_info, run_conditions
    _, conditions = run_conditions(load_at_start)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    base = BASELINE if BASELINE in policies else policies[0]
    others = [p for p in policies if p != base]
    runs: dict[tuple, list[float]] = {}
    for r in rows:
        runs.setdefault((r["under_load"], r["engine"], r["threads"], r["policy"]), [])
        if r["tok_s"] is not None:
            runs[(r["under_load"], r["engine"], r["threads"], r["policy"])].append(r["tok_s"])
    tok = {key: statistics.median(v) if v else None for key, v in runs.items()}
    tables, headline = [], []
    for load in dict.fromkeys(r["under_load"] for r in rows):
        table = Table(f"decode tok/s by OpenMP wait policy, each engine in its own process{load_title(load)}",
                      ["engine", "threads"] + [f"{p} tok/s" for p in policies] + [f"{p} / {base}" for p in others])
        for engine, threads in dict.fromkeys((r["engine"], r["threads"]) for r in rows if r["under_load"] == load):
            speeds = [tok.get((load, engine, threads, p)) for p in policies]
            b = tok.get((load, engine, threads, base))
            ratios = [s / b if s and b else None for p, s in zip(policies, speeds) if p != base]
            table.rows.append([engine, threads, *speeds, *ratios])
            if engine.startswith("cinq") and any(x is not None for x in ratios):
                at = f"{engine} {threads} thr" + (f" under load {load}" if load else "")
                headline.append(at + ": " + ", ".join(f"{p} {x:.2f}x" for p, x in zip(others, ratios)
                                                      if x is not None))
        tables.append(table)
    roof = roofline_table(rows)
    if roof.rows:
        tables.append(roof)
    envs = "; ".join(f"{p}: " + " ".join(f"{k}={v}" for k, v in omp_wait_env(p).items()) for p in policies)
    command = (f"python benchmarks/omp_wait_policy.py --engines {args.engines} --variants {args.variants} "
               f"--threads {args.threads} --policies {','.join(policies)} "
               f"--under-load {','.join(map(str, args.under_load))} "
               f"--rounds {args.rounds} --new-tokens {args.new_tokens} --repeats {args.repeats}")
    setup = (f"{conditions} `{command}`: {args.model}, batch 1, greedy, prompt {args.prompt_len}, "
             f"{args.new_tokens} new tokens, {args.rounds} generations after a warm-up one, the median of "
             f"{args.repeats} such run(s); every (engine, policy, threads) in its own process with its OpenMP "
             f"variables set before the runtime loads ({envs}). Under load: that many pure-Python busy processes "
             f"ran beside every measurement of the condition.")
    return BenchResult("omp_wait_policy", "OpenMP wait policy: each engine in its own process", setup, tables,
                       f"cinq decode tok/s vs {base}: " + "; ".join(headline),
                       {"rows": rows, "policies": {p: omp_wait_env(p) for p in policies},
                        "machine": machine_info(load_at_start)},
                       notes=[FAILED_NOTE] if any(r["tok_s"] is None for r in rows) else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--variants", default="int4", help="cinq variants (bf16, int8, int4, file), each vs llama.cpp's")
    ap.add_argument("--engines", default="cinq,llama.cpp", help="cinq, llama.cpp or both")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--policies", type=parse_policies, default=DEFAULT_POLICIES,
                    help="PASSIVE, ACTIVE, SPIN=n (spin n times, then sleep), comma-separated")
    ap.add_argument("--under-load", type=parse_loads, default="0",
                    help="busy background processes beside every measurement; a list runs each condition")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="cycles of every policy per (engine, threads)")
    ap.add_argument("--child-timeout", type=float, default=900.0, help="seconds one measurement may take")
    ap.add_argument("--out", default="omp_wait_policy", help="result file name in benchmarks/results/")
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
    from cinq.bench.report import publish
    publish(report(rows, load_at_start, args), None if args.no_write else RESULTS / args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
