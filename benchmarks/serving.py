"""Online serving benchmark in the style of `vllm bench serve`: a thin caller of `cinq bench serve`
(cinq/bench/serve.py), which starts `cinq serve` on a free loopback port, sends Poisson arrivals at several request
rates (streaming completions), reports TTFT, TPOT, ITL (mean / median / p99), request and output-token throughput
and the load average, and measures the offline engine on the rate=inf workload as the baseline.

    python benchmarks/serving.py                         # default model, rates 2,8,32,inf
    python benchmarks/serving.py --model runs/llama-30m --tag llama30m
    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --no-baseline

Writes benchmarks/results/serving.{md,json,png} (serving_TAG.* with --tag).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before the offline baseline imports torch: see cinq/process_env.py

from cinq.bench.report import print_report, write_report  # noqa: E402
from cinq.bench.serve import ServeOptions, run_serve  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    ap.add_argument("--base-url", default=None, help="benchmark this running server instead of starting one")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--rates", default="2,8,32,inf", help="comma-separated request rates (req/s); inf = all at once")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (server and baseline)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--engine-core", default="process", choices=("process", "inproc"),
                    help="the server's engine core: its own process (default) or inside the server")
    ap.add_argument("--tag", default="default-model")
    ap.add_argument("--note", default="", help="a line for the markdown (e.g. how --model was built)")
    ap.add_argument("--quick", action="store_true", help="16 requests, rates 8,inf (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.rates = 16, "8,inf"
    config = EngineConfig(model=args.model or "", dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                          num_threads=args.num_threads)
    opts = ServeOptions(request_rates=tuple(float(r) for r in args.rates.split(",")), num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len, seed=args.seed,
                        baseline=not args.no_baseline, base_url=args.base_url,
                        served_model_name=args.served_model_name, tag=args.tag, note=args.note,
                        engine_core=args.engine_core,
                        command="python benchmarks/serving.py " + " ".join(sys.argv[1:]))
    result = run_serve(config, opts)
    print_report(result)
    stem = "serving" if args.tag == "default-model" else f"serving_{args.tag}"
    print("wrote", ", ".join(str(p) for p in write_report(result, RESULTS / stem)))


if __name__ == "__main__":
    main()
