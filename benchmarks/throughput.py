"""Offline throughput: cinq vs Hugging Face transformers `generate` on the same model and the same requests.

A thin caller of `cinq bench throughput` (cinq/bench/throughput.py) on the workload of issue 2: a ~110M-parameter
Llama with random weights (hidden 768, 12 layers, 12 heads, vocab 32000), 128 requests, prompt lengths uniform
32-512, output lengths uniform 32-256, ignore_eos, bf16, greedy. Also measured there: batch-1 decode tokens/s
against the memory roofline and KV-cache waste against a naive max_model_len reservation.

    python benchmarks/throughput.py            # full run, writes benchmarks/results/throughput.{md,json,png}
    python benchmarks/throughput.py --quick    # small smoke version, writes nothing

With ``--smollm2``, issue 26's run on the real model (goal >= 5x HF, >= 40% of the compute roofline):
SmolLM2-135M-Instruct, 64 requests, prompts uniform 32-256 and outputs 32-64 (as throughput_gemma3; scaled down so
that transformers' part stays near 4 minutes), the engine's default batching. cinq runs the Q4_1 GGUF file natively
(bf16 activations) and its bf16 copy (the file dequantized, exported as bf16 GGUF); transformers runs the dense
folder of the same dequantized weights in bf16 at its two best batch sizes of the 110M run (32, 64: the probe at 64
runs every request and is its full run). Writes benchmarks/results/throughput_smollm2.{md,json,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py

from benchmarks.random_model import LLAMA_110M, build_random_llama  # noqa: E402
from cinq.bench.report import print_report, write_report  # noqa: E402
from cinq.bench.throughput import ThroughputOptions, run_throughput  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny workload for a smoke run (not for the record)")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--hf-batch-sizes", default="8,16,32,64")
    ap.add_argument("--hf-probe-requests", type=int, default=32,
                    help="requests used to pick HF's best batch size before its full run")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--model-dir", default=str(Path(os.environ.get("CINQ_CACHE_DIR", Path.home() / ".cache" / "cinq"))
                                                / "bench-llama-110m"))
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--smollm2", action="store_true", help="the real model's run (see above)")
    ap.add_argument("--variants", default="file,bf16", help="cinq variants with --smollm2 (default %(default)s)")
    args = ap.parse_args()
    if args.smollm2:
        smollm2(args)
        return
    opts = ThroughputOptions(num_requests=args.num_requests, input_lens=(32, 512), output_lens=(32, 256),
                             baseline=not args.skip_hf,
                             hf_batch_sizes=tuple(int(b) for b in args.hf_batch_sizes.split(",")),
                             hf_probe_requests=args.hf_probe_requests, decode_tokens=256,
                             low_token=300)  # past the byte tokenizer's specials
    if args.quick:
        opts.num_requests, opts.hf_probe_requests, opts.hf_batch_sizes = 16, 8, (8,)
        opts.input_lens, opts.output_lens, opts.decode_tokens = (32, 128), (32, 64), 64
    path = build_random_llama(Path(args.model_dir), LLAMA_110M)
    config = EngineConfig(model=str(path), dtype="bfloat16", max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=4.0,
                          num_threads=args.threads)
    result = run_throughput(config, opts)
    # the model's shape, as the results always recorded it (cinq plan --calibrate reads it)
    result.data["workload"]["model"] = {"hidden": LLAMA_110M.hidden, "layers": LLAMA_110M.layers,
                                        "heads": LLAMA_110M.heads, "intermediate": LLAMA_110M.intermediate,
                                        "vocab": LLAMA_110M.vocab, "params": None}
    print_report(result)
    if not args.quick:
        print("wrote", ", ".join(str(p) for p in write_report(result, RESULTS / "throughput")))


def smollm2(args: argparse.Namespace) -> None:
    """SmolLM2-135M-Instruct's file and bf16 copy against transformers on the file's dense folder."""
    opts = ThroughputOptions(num_requests=64, input_lens=(32, 256), output_lens=(32, 64), baseline=not args.skip_hf,
                             hf_batch_sizes=(64,), hf_probe_requests=64, decode_tokens=128,
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
