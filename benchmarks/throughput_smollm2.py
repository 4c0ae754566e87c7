"""Offline throughput on the real model: SmolLM2-135M-Instruct, cinq vs Hugging Face transformers `generate`.

A thin caller of `cinq bench throughput` (cinq/bench/throughput.py) with the goal of issue 26 (>= 5x HF, >= 40% of
the compute roofline): 64 requests queued at once, prompts uniform 32-256 and outputs uniform 32-128 tokens
(issue 2's workload scaled down so that transformers' part stays near 4 minutes), ignore_eos, greedy, the
engine's default batching. cinq runs the Q4_1 GGUF file natively (bf16 activations) and its bf16 copy (the file
dequantized, exported as bf16 GGUF); transformers runs the dense folder of the same dequantized weights in bf16,
probed at its two best batch sizes of the 110M run (32, 64; the probe at 64 runs every request and is its full
run).

    python benchmarks/throughput_smollm2.py          # writes benchmarks/results/throughput_smollm2.{md,json,png}
    python benchmarks/throughput_smollm2.py --quick  # a smoke version, writes nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py

from cinq.bench.report import print_report, write_report  # noqa: E402
from cinq.bench.throughput import ThroughputOptions, run_throughput  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny workload for a smoke run (not for the record)")
    ap.add_argument("--variants", default="file,bf16", help="cinq variants (default %(default)s)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    opts = ThroughputOptions(num_requests=64, input_lens=(32, 256), output_lens=(32, 128), baseline=not args.skip_hf,
                             hf_batch_sizes=(32, 64), hf_probe_requests=32, decode_tokens=128,
                             variants=tuple(v for v in args.variants.split(",") if v))
    if args.quick:
        opts.num_requests, opts.hf_probe_requests, opts.hf_batch_sizes = 8, 4, (4, 8)
        opts.input_lens, opts.output_lens, opts.decode_tokens = (16, 32), (4, 8), 8
    config = EngineConfig(model="smollm2-135m-instruct", dtype="bfloat16", kv_cache_memory=2.0,
                          num_threads=args.threads)
    result = run_throughput(config, opts)
    print_report(result)
    if not args.quick:
        print("wrote", ", ".join(str(p) for p in write_report(result, RESULTS / "throughput_smollm2")))


if __name__ == "__main__":
    main()
