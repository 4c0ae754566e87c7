"""Time to first token of one prompt on SmolLM2's Q4_1 file, by how the quantized layers run prompt-sized inputs
(issue 26), in one process: the engine is built once and each arm switches the path in place before its request.

* ``before``: what ran before issue 26's change: the int8-activation kernel up to 511 rows, from 512 the blocks
  dequantized by torch's ops for BLAS's float32 GEMM (as ``gguf_linear.DEQUANT_ROWS`` 512 and
  ``bf16_gemm_is_emulated`` returning True in ``prefill_gemm`` and ``native`` make it);
* ``bf16 GEMM, torch dequant``: rounded to bf16 for oneDNN's bf16 GEMM, dequantized by torch's ops;
* ``bf16 GEMM``: the same GEMM on blocks dequantized by cinq/kernels/cpu/block_dequant.cpp (what runs now).

The two bf16 arms take the GEMM from ``gguf_linear.DEQUANT_ROWS`` rows (256 with bf16 instructions), the kernel
below. Each prompt is new random ids (nothing cached), max_tokens 1, one warm-up round, then
``--rounds`` rounds with the arms' order reversed every other round; the figure is the median per arm and its ratio
to the ``before`` arm. Needs a CPU with bf16 instructions (elsewhere the three arms are one path).

    python benchmarks/prefill_ttft.py        # writes benchmarks/results/prefill_ttft_smollm2.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP, as the engine does

import torch  # noqa: E402

from cinq import LLM, SamplingParams  # noqa: E402
from cinq.bench.report import run_conditions  # noqa: E402
from cinq.kernels import prefill_gemm  # noqa: E402
from cinq.kernels.cpu_native import bf16_gemm_is_emulated  # noqa: E402
from cinq.layers.quantization import gguf_linear, native  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ARMS = ["before", "bf16 GEMM, torch dequant", "bf16 GEMM"]
DEQUANT_ROWS = gguf_linear.DEQUANT_ROWS
DEQUANT_MODULE = native.dequant_module


def select(arm: str) -> None:
    """Route the GGUF layers' prompt-sized inputs the way ``arm`` names (module attributes read at each call)."""
    emulated = (lambda: True) if arm == "before" else bf16_gemm_is_emulated
    prefill_gemm.bf16_gemm_is_emulated = native.bf16_gemm_is_emulated = emulated
    gguf_linear.DEQUANT_ROWS = 512 if arm == "before" else DEQUANT_ROWS
    native.dequant_module = (lambda: None) if arm == "bf16 GEMM, torch dequant" else DEQUANT_MODULE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="256,512,1024,2048", help="prompt lengths in tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if bf16_gemm_is_emulated():
        print("needs a CPU with bf16 instructions: with an emulated bf16 GEMM the arms are one path")
        return 1
    draft, conditions = run_conditions(os.getloadavg()[0])
    lengths = [int(n) for n in args.prompts.split(",")]
    llm = LLM("smollm2-135m-instruct", engine_core="inproc", max_num_batched_tokens=max(lengths))
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    times: dict[tuple[int, str], list[float]] = {}

    def once(n: int, arm: str) -> float:
        select(arm)
        prompt = [int(t) for t in torch.randint(100, 40000, (n,), generator=gen)]
        t = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - t

    for rnd in range(args.rounds + 1):
        for n in lengths:
            for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                dt = once(n, arm)
                if rnd:  # round 0 warms up
                    times.setdefault((n, arm), []).append(dt)
    select("bf16 GEMM")
    lines = ["# Time to first token by prefill GEMM: SmolLM2's Q4_1 file", "", conditions, "",
             __doc__.split("\n\n")[0].replace("\n", " "), "",
             "| prompt | " + " | ".join(f"{a} (ms)" for a in ARMS) + " | now / before | native / torch dequant |",
             "|---:|" + "---:|" * (len(ARMS) + 2)]
    rows: list[dict[str, object]] = []
    median: Callable[[int, str], float] = lambda n, a: statistics.median(times[(n, a)]) * 1e3  # noqa: E731
    for n in lengths:
        ms = {a: median(n, a) for a in ARMS}
        rows.append({"prompt": n, **{a: ms[a] for a in ARMS},
                     "speedup": ms["before"] / ms["bf16 GEMM"],
                     "native_over_torch": ms["bf16 GEMM, torch dequant"] / ms["bf16 GEMM"]})
        lines.append(f"| {n} | " + " | ".join(f"{ms[a]:.0f}" for a in ARMS)
                     + f" | {rows[-1]['speedup']:.2f}x | {rows[-1]['native_over_torch']:.2f}x |")
    head = ("time to first token on the Q4_1 file, now (bf16 GEMM on natively dequantized blocks) over before: "
            + ", ".join(f"{r['prompt']} tokens {r['speedup']:.2f}x" for r in rows)
            + "; native over torch dequantization: "
            + ", ".join(f"{r['prompt']} {r['native_over_torch']:.2f}x" for r in rows))
    lines += ["", f"**{head}**", "", f"{args.rounds} rounds after a warm-up; load average at the end: "
              f"{os.getloadavg()[0]:.2f}. Generated by `benchmarks/prefill_ttft.py`."]
    print("\n".join(lines))
    if not args.no_write:
        (RESULTS / "prefill_ttft_smollm2.md").write_text("\n".join(lines) + "\n")
        (RESULTS / "prefill_ttft_smollm2.json").write_text(json.dumps(
            {"kind": "prefill_ttft", "title": lines[0].lstrip("# "), "headline": head, "draft": draft,
             "rounds": args.rounds, "rows": rows, "loadavg_at_end": os.getloadavg()[0]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
