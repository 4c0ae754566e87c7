"""Data-parallel scaling: 1 vs 2 engine replicas (Ray actors) on a shared-prefix workload, with prefix-aware
routing against random routing.

Workload: ``--groups`` system prompts of ``--prefix-tokens`` tokens each; every request is one of them (chosen at
random, seeded) plus a short unique suffix, ``--max-tokens`` greedy tokens out, ``--concurrency`` clients in a
closed loop. Each replica's KV cache holds ``--kv-blocks`` blocks: sized so that half of the system prompts fit
in one replica and all of them do not, so where a prompt goes decides whether its prefix is still cached.

Runs, all in this process against one local Ray cluster, each measured in the same run:
  dp1          one replica (the baseline; it goes through the same Ray front end)
  dp2-prefix   two replicas, prefix-aware routing (cinq.dp.router, the default)
  dp2-random   two replicas, random routing
Reported: output tokens/s (ratio to dp1), mean and p50 TTFT, the replicas' prefix-cache hit rate over the run,
and the router's decisions. Writes benchmarks/results/scale_dp.{json,md}.

Usage: ``python benchmarks/scale_dp.py [--requests 48] [--concurrency 4] [--num-cpus 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cinq.config import EngineConfig, resolve_model  # noqa: E402
from cinq.dp.dp_engine import DPAsyncLLM  # noqa: E402
from cinq.dp.router import RouterConfig  # noqa: E402
from cinq.sampling_params import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = (("dp1", 1, "prefix"), ("dp2-prefix", 2, "prefix"), ("dp2-random", 2, "random"),
        ("dp2-kill", 2, "prefix"))  # the fault run: replica 0 killed a third of the way through


def workload(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(10, vocab) for _ in range(args.prefix_tokens)] for _ in range(args.groups)]
    return [prefixes[rng.randrange(args.groups)] + [rng.randrange(10, vocab) for _ in range(args.suffix_tokens)]
            for _ in range(args.requests)]


async def drive(llm: DPAsyncLLM, prompts: list[list[int]], args: argparse.Namespace, tag: str,
                kill_after: int | None = None) -> dict:
    """Closed-loop clients over ``prompts``; with ``kill_after``, replica 0's actor is killed once that many
    requests have finished (the fault run): a request that fails is counted, not retried by the client."""
    import ray
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    todo = list(enumerate(prompts))
    ttfts: list[float] = []
    tokens = ok = errors = 0

    async def client() -> None:
        nonlocal tokens, ok, errors
        while todo:
            i, prompt = todo.pop(0)
            last = None
            try:
                async for out in llm.generate(prompt, params, f"{tag}-{i}"):
                    last = out
            except Exception as e:
                errors += 1
                print(f"  {tag}-{i}: {type(e).__name__}: {e}", flush=True)
                continue
            ok += 1
            if ok == kill_after:
                ray.kill(llm.replicas[0].handle, no_restart=True)
            m = last.metrics
            if m is not None and m.first_token_time is not None:
                ttfts.append(m.first_token_time - m.arrival_time)
            tokens += len(last.outputs[0].token_ids)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall, "client_ok": ok,
            "client_errors": errors, "ttft_mean_s": statistics.fmean(ttfts), "ttft_p50_s": statistics.median(ttfts)}


def replica_hits(llm: DPAsyncLLM) -> tuple[int, int]:
    import ray
    snaps = ray.get([r.handle.snapshot.remote() for r in llm.replicas])
    return sum(s.stats.prefix_cache_hits for s in snaps), sum(s.stats.prefix_cache_queries for s in snaps)


def run_one(name: str, dp: int, policy: str, args: argparse.Namespace, model: str) -> dict:
    # One torch thread per replica: dp1 computes on one core, dp2 on two (what a second replica adds).
    config = EngineConfig(model=model, dtype=args.dtype, num_kv_blocks=args.kv_blocks, block_size=16,
                          num_threads=1)
    llm = DPAsyncLLM(config, dp, router_config=RouterConfig(policy, 16, seed=args.seed),
                     replica_num_cpus=args.num_cpus / 2)
    prompts = workload(args, llm.engine.vocab_size)

    async def main() -> dict:
        llm.start()
        try:
            await drive(llm, prompts[:args.concurrency], args, f"{name}-warmup")  # first-step costs, not timed
            h0, q0 = replica_hits(llm)
            decisions0 = dict(llm.counters.decisions)
            c0 = llm.counters
            before = (c0.retried, c0.failed, c0.completed, c0.restarts, c0.aborted)
            row = await drive(llm, prompts, args, name, len(prompts) // 3 if name == "dp2-kill" else None)
            deadline = time.monotonic() + 120
            while not all(r.alive for r in llm.replicas) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # the fault run: wait for the restart, to report it
            c = llm.counters
            row["faults"] = dict(zip(("retried", "failed", "completed", "restarts", "aborted"),
                                     (c.retried - before[0], c.failed - before[1], c.completed - before[2],
                                      c.restarts - before[3], c.aborted - before[4])))
            await asyncio.sleep(0.7)  # replicas publish stats at least every 0.5 s
            h1, q1 = replica_hits(llm)
            row["prefix_hit_rate"] = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
            row["decisions"] = {k: v - decisions0[k] for k, v in llm.counters.decisions.items()}
            return row
        finally:
            await llm.shutdown_async()

    row = asyncio.run(main())
    row.update(name=name, data_parallel_size=dp, policy=policy)
    print(f"{name:11s} {row['tokens_per_s']:7.1f} tok/s  TTFT mean {row['ttft_mean_s'] * 1e3:7.1f} ms  "
          f"p50 {row['ttft_p50_s'] * 1e3:7.1f} ms  prefix hit rate {row['prefix_hit_rate']:.2f}  "
          f"{row['decisions']} {row['faults']}", flush=True)
    return row


def render(rows: list[dict], args: argparse.Namespace) -> str:
    base = rows[0]["tokens_per_s"]
    lines = [
        "# Data-parallel scaling (benchmarks/scale_dp.py)", "",
        f"Model cinq-tiny ({args.dtype}), CPU, {os.cpu_count()} cores visible to a local Ray cluster of "
        f"{args.num_cpus} CPUs; {platform.python_version()}.",
        f"Workload: {args.requests} requests, {args.groups} shared system prompts of {args.prefix_tokens} tokens "
        f"+ {args.suffix_tokens} unique tokens each, {args.max_tokens} greedy tokens out, {args.concurrency} "
        f"concurrent clients; {args.kv_blocks} KV blocks of 16 tokens per replica (half of the system prompts "
        f"fit in one replica, all of them do not).", "",
        "**This is a 2-core CPU machine, shared with other work (a training run, other benchmarks):** each "
        "replica runs torch on one thread, so dp1 computes on one core and dp2 on both; the two replicas compete "
        "for those two cores with everything else on the machine (and with this front end and Ray's own "
        "processes), so the dp2/dp1 ratio is a lower bound of what a second replica adds on a machine with idle "
        "cores. The routing comparison (dp2-prefix vs dp2-random) is on equal terms: prefix-aware routing keeps "
        "each system prompt on one replica, where it stays cached, while random routing makes both replicas "
        "hold (and evict) all of them.", "",
        "| run | replicas | routing | output tok/s | vs dp1 | TTFT mean (ms) | TTFT p50 (ms) | prefix-cache hit "
        "rate | router decisions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["name"] == "dp2-kill":
            continue
        decisions = ", ".join(f"{k} {v}" for k, v in r["decisions"].items() if v)
        lines.append(f"| {r['name']} | {r['data_parallel_size']} | {r['policy']} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s'] / base:.2f}x | {r['ttft_mean_s'] * 1e3:.0f} | {r['ttft_p50_s'] * 1e3:.0f} | "
                     f"{r['prefix_hit_rate']:.2f} | {decisions} |")
    by = {r["name"]: r for r in rows}
    if "dp2-prefix" in by and "dp2-random" in by:
        p, q = by["dp2-prefix"], by["dp2-random"]
        lines += ["", f"Prefix-aware vs random routing (dp2, same run): throughput "
                      f"{p['tokens_per_s'] / q['tokens_per_s']:.2f}x, mean TTFT "
                      f"{p['ttft_mean_s'] / q['ttft_mean_s']:.2f}x, hit rate {p['prefix_hit_rate']:.2f} vs "
                      f"{q['prefix_hit_rate']:.2f}."]
    if "dp2-kill" in by:
        k = by["dp2-kill"]
        f = k["faults"]
        lines += ["", f"Fault run (dp2-kill, prefix routing): replica 0's actor killed (`ray.kill`) after "
                      f"{args.requests // 3} of {args.requests} requests had finished. Front end: {f['completed']} "
                      f"completed, {f['retried']} re-sent to the live replica (they had not streamed yet), "
                      f"{f['failed']} failed with an error (they were streaming), {f['aborted']} aborted, "
                      f"{f['restarts']} replica "
                      f"restart(s). Clients: {k['client_ok']} ok + {k['client_errors']} errors = "
                      f"{k['client_ok'] + k['client_errors']} of {args.requests} (none lost, none hung); "
                      f"{k['tokens_per_s']:.1f} tok/s over the run."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=384)
    ap.add_argument("--suffix-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default=",".join(r[0] for r in RUNS))
    args = ap.parse_args()
    import ray
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    model = resolve_model(None)
    wanted = args.runs.split(",")
    rows = [run_one(name, dp, policy, args, model) for name, dp, policy in RUNS if name in wanted]
    ray.shutdown()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale_dp.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    text = render(rows, args)
    (RESULTS / "scale_dp.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
