"""Offline ``LLM``: the engine core in this process (``engine_core="inproc"``) against the core in its own process
behind ZMQ (``engine_core="process"``), on one offline batch per model (random token-id prompts, greedy, exactly
``output_len`` tokens each). Both arms take turns for ``--rounds`` rounds (the order rotated each round, so the
machine's drift hits both); the median round of each is reported, and the ratio process / inproc. The faster arm
is ``LLM``'s default (cinq/engine/llm.py).

    python benchmarks/offline_engine_core.py                  # cinq-tiny and smollm2-135m-instruct
    python benchmarks/offline_engine_core.py --models cinq-tiny --rounds 1

Writes benchmarks/results/offline_engine_core.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch is imported: see cinq/process_env.py

from cinq.bench.rate_run import median_by, rotated  # noqa: E402
from cinq.bench.report import BenchResult, Table, machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.bench.workload import around, random_requests  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODES = ("inproc", "process")


def one_round(model: str, mode: str, num_prompts: int, input_len: int, output_len: int,
              dtype: str) -> dict[str, Any]:
    """Start an ``LLM`` with the core ``mode``, warm it up on the batch's shapes, then time the batch."""
    from cinq.engine.llm import LLM
    from cinq.sampling_params import SamplingParams
    llm = LLM(model, engine_core=mode, dtype=dtype)
    try:
        vocab = llm.engine.vocab_size
        reqs = random_requests(num_prompts, vocab, around(input_len), (output_len, output_len), seed=0,
                               low_token=min(1000, vocab - 1))
        params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in reqs]
        llm.generate([r.prompt for r in reqs], params)  # warm-up: kernels, allocator, the batch's shapes
        t0, cpu0 = time.perf_counter(), time.process_time()
        outs = llm.generate([r.prompt for r in reqs], params)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"mode": mode, "seconds": seconds, "output_tokens": tokens, "tok_s": tokens / seconds,
                "front_end_cores": (time.process_time() - cpu0) / seconds}
    finally:
        llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cinq-tiny,smollm2-135m-instruct")
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--input-len", type=int, default=96)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=str(RESULTS / "offline_engine_core"))
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]  # sampled before every round: a run that began quiet may not stay so
    table = Table("Offline LLM.generate, one batch (median round)",
                  ["model", "engine_core", "tok/s", "seconds", "front-end cores", "x inproc"])
    data: dict[str, Any] = {"config": {**vars(args), "out": Path(args.out).name}, "runs": {}}
    ratios = []
    for model in args.models.split(","):
        rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for n in range(args.rounds):
            for mode in rotated(list(MODES), n):
                loads.append(os.getloadavg()[0])
                rounds[mode].append(one_round(model, mode, args.num_prompts, args.input_len, args.output_len,
                                              args.dtype))
        best = {mode: median_by(rounds[mode], "tok_s") for mode in MODES}
        ratio = best["process"]["tok_s"] / best["inproc"]["tok_s"]
        ratios.append(f"{model} {ratio:.2f}x")
        data["runs"][model] = rounds
        for mode in MODES:
            r = best[mode]
            table.rows.append([model, mode, r["tok_s"], r["seconds"], r["front_end_cores"],
                               r["tok_s"] / best["inproc"]["tok_s"]])
    data["machine"] = machine_info()
    draft, conditions = run_conditions(max(loads))  # the busiest moment decides (the label says "began")
    data.update(draft=draft, load_samples=[round(x, 2) for x in loads])
    result = BenchResult(
        "offline_engine_core", "Offline LLM: engine core in process vs in its own process",
        f"{conditions} {args.num_prompts} prompts of ~{args.input_len} tokens, {args.output_len} output tokens "
        f"each, greedy; {args.rounds} rounds, arms rotated; dtype {args.dtype}.",
        [table], "engine_core='process' vs 'inproc' (tokens/s): " + ", ".join(ratios), data)
    print_report(result)
    for path in write_report(result, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
