"""Batch-1 decode latency, side by side: cinq, llama.cpp (same weights, exported by `cinq export --format gguf`)
and Hugging Face transformers `generate`, in one process, on the same prompt token ids.

Models: the embedded cinq-tiny and the ~110M random Llama of benchmarks/throughput.py (hidden 768, 12 layers,
vocab 32000, tied embeddings). Precisions, paired by the bytes a decode step reads:
* cinq bf16        vs llama.cpp bf16 (and HF bf16);
* cinq int8 (RTN 8-bit per channel, GPTQ file)  vs llama.cpp q8_0 (blocks of 32, one scale each);
* cinq int4 (GPTQ 4-bit, group 128, cinq's quantizer on a small calibration set: speed does not depend on how
  the integers were chosen)  vs llama.cpp q4_0 (blocks of 32, embedding and output q8_0; cinq's int4 keeps
  the LM head bf16).
Each measurement: a greedy generation of --new-tokens tokens after a prompt of 128 (and 1024) random ids; the
prefill is timed apart; ms/step = the median decode step of a generation, decode tok/s = 1000 / that (the
mean is kept in the JSON), then medians over --rounds rounds. HF's steps are timed by a streamer (the committed
latency.json, measured before the fold, took (generate(N + 1) - generate(1)) / N). Threads 1 and 2 (torch
threads for cinq and HF; n_threads for llama.cpp). The machine is shared and noisy: every round runs every
engine once per setting, in an order rotated each round, and the load average is recorded with every
measurement.

A thin caller of cinq/bench/latency.py (the same measurement as `cinq bench latency MODEL --variants
bf16,int8,int4 --baselines hf,llama.cpp --threads-list 1,2 --input-lens 128,1024 --output-len 32 --num-iters 1
--rounds 3`), once per model, the rows merged into one report.

llama.cpp is an optional baseline: `pip install 'cinq[llama]'` (llama-cpp-python, compiled from source). When it
is absent the table says so and the other rows are still measured.

    python benchmarks/latency.py                # writes benchmarks/results/latency.{md,json}
    python benchmarks/latency.py --quick        # smoke run: cinq-tiny, prompt 128, 1 round, not written
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py

from cinq.bench.latency import LatencyOptions, run_latency  # noqa: E402
from cinq.bench.latency_report import latency_result  # noqa: E402
from benchmarks.random_model import LLAMA_110M, build_random_llama  # noqa: E402
from cinq.bench.report import markdown  # noqa: E402
from cinq.cache import cache_dir  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORK = cache_dir() / "bench-latency"


def model_folder(name: str) -> str:
    """The folder (or embedded name) of a benchmark model."""
    return "cinq-tiny" if name == "cinq-tiny" else str(build_random_llama(WORK / "llama-110m", LLAMA_110M))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cinq-tiny,llama-110m")
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--quick", action="store_true", help="cinq-tiny, prompt 128, 1 round, 16 tokens; not written")
    ap.add_argument("--render", action="store_true", help="rewrite latency.md from latency.json, measuring nothing")
    args = ap.parse_args()
    if args.render:
        data = json.loads((RESULTS / "latency.json").read_text())
        (RESULTS / "latency.md").write_text(markdown(latency_result(data)))
        return 0
    if args.quick:
        args.models, args.prompt_lens, args.rounds, args.new_tokens = "cinq-tiny", "128", 1, 16
    prompt_lens = tuple(int(x) for x in args.prompt_lens.split(","))
    options = LatencyOptions(input_lens=prompt_lens, output_len=args.new_tokens, num_iters=1, seed=1,
                             baselines=("llama.cpp",) if args.skip_hf else ("hf", "llama.cpp"),
                             variants=("bf16", "int8", "int4"),
                             threads_list=tuple(int(x) for x in args.threads.split(",")), rounds=args.rounds,
                             work_dir=WORK)
    max_len = max(prompt_lens) + args.new_tokens + 16
    data: dict = {}
    for name in args.models.split(","):
        # the whole prompt in one step (batched-token budget = max_len): TTFT is one prefill
        config = EngineConfig(model=model_folder(name), dtype="bfloat16", kv_cache_memory=0.25, max_model_len=max_len,
                              max_num_batched_tokens=max_len, enable_prefix_caching=False, seed=0)
        part = run_latency(config, options).data
        for row in part["rows"]:
            row["model"] = name
        data = {**part, "rows": data.get("rows", []) + part["rows"]} if data else part
    text = markdown(latency_result(data))
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "latency.json").write_text(json.dumps(data, indent=1))
        (RESULTS / "latency.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
