"""Build "where we stand" from the results, not by hand: ``benchmarks/results/README.md`` (every result file, one row
each: its headline figure, the script that measured it, quiet / draft) and README.md's headline table (at most 12
rows, the real model first), both from the JSON files in benchmarks/results/.

    python benchmarks/results_table.py           # rewrite both (seconds; reads JSON, runs nothing)
    python benchmarks/results_table.py --check   # exit 1 when either is not what the results say

A new result is picked up by itself: every ``results/*.json`` gets a row, its figure the JSON's ``headline`` (what
``cinq.bench.report.write_report`` writes) or the bold headline line of its ``.md``, or one computed from the
JSON by a function in ``FIGURES`` (benchmarks/results_figures.py). Give it its script in ``SCRIPTS`` (a row without
one says so); a headline row is a ``Headline`` in ``HEADLINES`` (at most 12). A figure typed in from a log, not
written by a script, is labelled so (``FROM_A_LOG``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_figures import FIGURES, quant_study  # noqa: E402
from cinq.bench.report import QUIET_LOAD  # noqa: E402
from cinq.markdown_table import markdown_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- headline table: benchmarks/results_table.py -->", "<!-- end of the headline table -->"

# result file stem -> the script (or command) that writes it; a stem not here still gets its row
SCRIPTS = {
    "attention": "benchmarks/attention.py", "compile": "benchmarks/compile.py",
    "decode_kernels": "benchmarks/decode_kernels.py", "decode_kernels_float_codes": "benchmarks/decode_kernels.py",
    "distill": "cinq distill --report", "draft_divergence": "benchmarks/draft_divergence.py",
    "gemma3": "benchmarks/gemma3.py", "gpu": "benchmarks/gpu.py", "huge_pages": "benchmarks/huge_pages.py",
    "head_language_balance": "benchmarks/head_language_balance.py",
    "interactions_batch_mates": "benchmarks/interactions.py --only batch-mates",
    "interactions_chunked_prefill": "benchmarks/interactions.py --only chunked-prefill",
    "interactions_quant_spec": "benchmarks/quant_spec.py",
    "interactions_smoothquant_mix": "benchmarks/interactions.py --only smoothquant-mix",
    "interactions_spec_rate": "benchmarks/interactions.py --only spec-rate",
    "latency": "benchmarks/latency.py", "prefill_gemm": "benchmarks/prefill_gemm.py",
    "prefill_gemm_bf16": "benchmarks/prefill_gemm.py", "prefill_ttft_smollm2": "benchmarks/prefill_ttft.py",
    "eagle3_smollm2_head_before_after": "benchmarks/head_before_after.py",
    "eagle3_smollm2_head_more_data": "benchmarks/head_before_after.py --before runs/eagle3-smollm2-v3 "
                                     "--after runs/eagle3-smollm2-v4",
    "eagle3_smollm2_head_more_topics": "benchmarks/head_before_after.py --before runs/eagle3-smollm2-v4-shipped "
                                       "--after runs/eagle3-smollm2-v5",
    "eagle3_smollm2_head_longer": "benchmarks/head_before_after.py --before runs/eagle3-smollm2-v5 "
                                  "--after runs/eagle3-smollm2-v6 --held-out runs/eagle3-smollm2-v5/target-test-*.npz",
    "eagle3_smollm2_head_language_balance": "benchmarks/head_before_after.py --before runs/eagle3-smollm2-english "
                                            "--after runs/eagle3-smollm2-balanced "
                                            "--held-out runs/spec-lang-smollm2/target-test-*.npz",
    "eagle3_smollm2_head_q4_0_target": "benchmarks/head_before_after.py --before runs/eagle3-smollm2-balanced "
                                       "--after runs/eagle3-smollm2-q4_0 --target <the q4_0 file>",
    "latency_hf": "cinq bench latency", "latency_smollm2": "cinq bench latency",
    "latency_smollm2_bf16": "benchmarks/latency.py", "omp_wait_policy": "benchmarks/omp_wait_policy.py",
    "omp_wait_policy_draft": "benchmarks/omp_wait_policy.py --out omp_wait_policy_draft",
    "omp_wait_policy_after_attention": "benchmarks/omp_wait_policy.py --engines cinq,llama.cpp --variants int4,bf16 "
                                       "--policies PASSIVE,ACTIVE,SPIN=10000,SPIN=300000 --out "
                                       "omp_wait_policy_after_attention",
    "omp_wait_policy_gemma3": "benchmarks/omp_wait_policy.py --model gemma3-270m --variants file --out "
                              "omp_wait_policy_gemma3",
    "omp_wait_policy_avx2": "benchmarks/omp_wait_policy.py --engines cinq,llama.cpp --variants int4,bf16 --threads "
                            "1,2 --policies PASSIVE,ACTIVE --under-load 0 --rounds 3 --new-tokens 64 --repeats 2 "
                            "--out omp_wait_policy_avx2",
    "thread_scaling": "benchmarks/thread_scaling.py",
    "kernel_ab_bf16_avx2_rows": "benchmarks/kernel_ab.py --before a0c6be9 --kernels bf16 --rows 1,4,5,8 --threads 1,2 "
                                "--rounds 4 --out benchmarks/results/kernel_ab_bf16_avx2_rows",
    "thread_scaling_smollm2": "benchmarks/thread_scaling.py --model smollm2-135m-instruct --variants bf16,file "
                              "--out benchmarks/results/thread_scaling_smollm2",
    "omp_wait_policy_draft_small_spin": "benchmarks/omp_wait_policy.py --out omp_wait_policy_draft_small_spin",
    "prefix": "cinq bench prefix", "quant": "benchmarks/quant.py",
    "quant_quality": "benchmarks/quant.py --quality", "quant_quality_arithmetic_easy": "benchmarks/quant.py --quality",
    "quant_study": "benchmarks/quant.py --quality", "quant_study_float_codes": "benchmarks/quant_study_real.py",
    "quant_study_float_codes_decode": "benchmarks/float_codes_decode.py",
    "quant_study_smollm2": "benchmarks/quant_study_real.py",
    "quant_study_smollm2_files": "benchmarks/quant_study_real.py",
    "quant_study_smollm2_capitals": "benchmarks/quant_study_real.py", "reliability": "benchmarks/reliability.py",
    "scale": "benchmarks/scale.py", "scale_dp": "benchmarks/scale_dp.py", "serving": "benchmarks/serving.py",
    "serving_inproc-core": "benchmarks/serving.py", "serving_llama23m": "benchmarks/serving.py",
    "serving_split": "cinq bench serve", "speculative": "benchmarks/speculative.py", "stack": "cinq bench stack",
    "step_breakdown": "benchmarks/step_breakdown.py",
    "step_breakdown_context_b1": "benchmarks/step_breakdown.py --smollm2-only --prompt-len 1024 --batch 1",
    "step_breakdown_context_b4": "benchmarks/step_breakdown.py --smollm2-only --prompt-len 1024 --batch 4",
    "step_breakdown_smollm2_1t": "benchmarks/step_breakdown.py --smollm2-only --baseline none --threads 1",
    "step_breakdown_smollm2_threads": "benchmarks/step_breakdown.py --smollm2-only --baseline 1723494 --threads 1,2",
    "structured_backends": "benchmarks/structured_backends.py",
    "structured_outputs": "benchmarks/structured_outputs.py", "throughput": "benchmarks/throughput.py",
    "throughput_gemma3": "benchmarks/throughput.py", "throughput_smollm2": "benchmarks/throughput.py --smollm2",
    "throughput_smollm2_long": "bash scripts/bench_real_model.sh throughput (cinq bench throughput, 64 requests, "
                               "outputs 32-256)",
    "train_sizing": "cinq train --measure",
    "tune": "cinq tune", "vattention": "benchmarks/vattention.py", "wide_linear": "benchmarks/wide_linear.py",
    "int8_activations": "benchmarks/int8_activations.py", "offline_engine_core": "benchmarks/offline_engine_core.py",
    "serving_smollm2": "scripts/bench_real_model.sh serve", "speculative_smollm2": "benchmarks/speculative_smollm2.py",
    "speculative_smollm2_copy": "benchmarks/speculative_smollm2.py --workload copy",
    "speculative_smollm2_bf16": "benchmarks/speculative_smollm2.py --weights bf16",
    "speculative_smollm2_bf16_b1": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                   "smollm2-135m-instruct-eagle3 --batch-sizes 1 --rounds 5 --sample-batches '' "
                                   "--no-languages",
    "speculative_smollm2_bf16_b1_sampled": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                           "smollm2-135m-instruct-eagle3 --batch-sizes 1 --rounds 3 "
                                           "--sample-batches 1 --no-languages",
    "speculative_smollm2_gptq4_b1": "cinq quantize <the dense folder> --method gptq --bits 4 --group-size 64 "
                                    "--calib calibration --calib-samples 16 --calib-dtype float32; "
                                    "benchmarks/speculative_smollm2.py --target <that folder> --head "
                                    "smollm2-135m-instruct-eagle3 --batch-sizes 1 --rounds 3 --sample-batches '' "
                                    "--no-languages",
    "speculative_smollm2_q4_0_b1": "benchmarks/speculative_smollm2.py --weights q4_0 --head "
                                   "smollm2-135m-instruct-eagle3 --batch-sizes 1 --rounds 3 --sample-batches '' "
                                   "--no-languages",
    "speculative_smollm2_bf16_batches": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                        "smollm2-135m-instruct-eagle3 --batch-sizes 4,8,16,32 --rounds 3 "
                                        "--sample-batches '' --no-languages",
    "speculative_smollm2_copy_bf16": "benchmarks/speculative_smollm2.py --workload copy --weights bf16",
    "speculative_smollm2_trees_bf16": "benchmarks/speculative_smollm2.py --weights bf16 --trees",
    "speculative_smollm2_bf16_languages": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                          "smollm2-135m-instruct-eagle3 --batch-sizes 1 --sample-batches '' --rounds 1",
    "speculative_smollm2_bf16_languages_english": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                                  "runs/eagle3-smollm2-english/head --batch-sizes 1 --sample-batches "
                                                  "'' --per-language 4 --rounds 2",
    "speculative_smollm2_bf16_languages_balanced": "benchmarks/speculative_smollm2.py --weights bf16 --head "
                                                   "runs/eagle3-smollm2-balanced/head --batch-sizes 1 --sample-batches "
                                                   "'' --per-language 4 --rounds 2",
    "speculative_smollm2_copy_bf16_eos": "benchmarks/speculative_smollm2.py --workload copy --weights bf16 "
                                         "--stop-at-eos --head smollm2-135m-instruct-eagle3 --batch-sizes 1,4 "
                                         "--rounds 3",
    "speculative_smollm2_copy_bf16_eos_b1": "benchmarks/speculative_smollm2.py --workload copy --weights bf16 "
                                            "--stop-at-eos --head smollm2-135m-instruct-eagle3 --batch-sizes 1 "
                                            "--rounds 5",
    "speculative_smollm2_copy_eos": "benchmarks/speculative_smollm2.py --workload copy --stop-at-eos",
    "speculative_smollm2_greedy": "benchmarks/speculative_smollm2.py --no-languages --sample-batches ''",
    "speculative_draft_vocab": "benchmarks/speculative_draft_vocab.py",
    "eagle3_smollm2_head": "cinq distill --heads eagle3 --target smollm2-135m-instruct",
    "decode_kernels_int8_activations": "benchmarks/decode_kernels.py",
    "decode_kernels_int8_activations_5d401d7": "benchmarks/decode_kernels.py (at 5d401d7)",
    "decode_kernels_int8_vnni": 'benchmarks/decode_kernels.py --kernels "q4_0 i8,q4_1 i8,q8_0 i8,int4 g64 i8" '
                                "--rows 1,2,5,8 (AVX512-VNNI, after the lane-order rows kernels)",
    "decode_kernels_lane_rows": 'benchmarks/kernel_ab.py --before 98fe25e --kernels "q4_0 i8,q4_1 i8,q8_0 i8" '
                                "--rows 1,2,3,5,8 --threads 1,2 --rounds 11",
    "decode_kernels_bf16_6439ce9": "benchmarks/decode_kernels.py --kernels bf16 --repeats 10 (at 6439ce9, before the "
                                   "row-streamed tiles)",
    "kernel_ab": "benchmarks/kernel_ab.py",
    "decode_attention_ab": "benchmarks/decode_attention_ab.py --before 1723494",
    "decode_attention_ab_gemma3": "benchmarks/decode_attention_ab.py --before 1723494 --heads gemma3 --contexts "
                                  "320,1024,4096 --rounds 6",
    "kernel_ab_bf16": "benchmarks/kernel_ab.py --before 9b7d116 --kernels bf16 --rows 1,2,5,8 --threads 1,2",
    "decode_kernels_bf16": "benchmarks/decode_kernels.py --kernels bf16 --rows 1,2,5,8,16,32",
    "verify_step_cost": "benchmarks/verify_step_cost.py",
    "verify_step_cost_bf16": "benchmarks/verify_step_cost.py --weights bf16",
    "verify_step_cost_9117cfd": "benchmarks/verify_step_cost.py (copied into a checkout of 9117cfd)",
}
# results whose JSON was typed in from a run's log, not written by the script that measured them
FROM_A_LOG = {"gpu": "typed from the H200 run's log (benchmarks/gpu.py has no section writing kernel_tests and "
                     "attention_quick)"}
NOT_RESULTS = {"tune.config"}  # JSON in results/ that is an output to use, not a measurement


def load(stem: str) -> dict[str, Any]:
    data = json.loads((RESULTS / f"{stem}.json").read_text())
    return data if isinstance(data, dict) else {"rows": data}


def md_text(stem: str) -> str:
    path = RESULTS / f"{stem}.md"
    return path.read_text() if path.is_file() else ""


def label(stem: str, data: dict[str, Any]) -> str:
    """quiet / draft as the run recorded it (``conditions``), and the vector instruction set of the CPU it ran on
    where the run recorded one (``cinq.plan.cpu.cpu_label``): "quiet, AVX512-BF16"."""
    where = conditions(stem, data)
    said = [json.dumps(data.get("machine", {})), str(data.get("cpu", "")),
            *re.findall(r"CPU: ([^.]*)\.", md_text(stem))]  # the setup line run_conditions writes
    said = [re.sub(r"no [\w-]+", "", text) for text in said]  # "AVX2 + FMA, no AVX512-BF16" names AVX2
    isa = next((isa for isa in ISAS for text in said if isa in text), "")
    return f"{where}, {isa}" if isa and where != "from a log" else where


# What cinq.plan.cpu.vector_isa names, widest first (a label naming AVX2 says "no AVX512-BF16").
ISAS = ("AMX", "AVX512-BF16", "AVX2 + FMA")


def conditions(stem: str, data: dict[str, Any]) -> str:
    """quiet / draft as the run recorded it: the JSON's own flag or start load first, then the markdown's words;
    "not recorded" when neither says."""
    if stem in FROM_A_LOG:
        return "from a log"
    if isinstance(data.get("draft"), bool):
        return "draft" if data["draft"] else "quiet"
    conditions = data.get("conditions")
    if isinstance(conditions, dict):
        conditions = " ".join(map(str, conditions.values()))
    if isinstance(conditions, str):
        return "draft" if "DRAFT" in conditions else "quiet"
    for key in ("load_at_start", "load_start", "load_average_at_start"):
        for where in (data, *[v for v in data.values() if isinstance(v, dict)]):
            if isinstance(where.get(key), (int, float)):
                return "quiet" if where[key] <= QUIET_LOAD else "draft"
    text = md_text(stem)
    if "DRAFT" in text or "**Draft" in text:
        return "draft"
    if "Quiet machine" in text:
        return "quiet"
    return "not recorded"


def figure_of(stem: str, data: dict[str, Any]) -> str:
    """A result's one-line figure: computed from its JSON where ``FIGURES`` (or its shape: a quantization study)
    says how, else the headline its script wrote (the JSON's, else the markdown's bold line)."""
    if stem in FIGURES:
        return FIGURES[stem](data)
    if "flat_ppl_pct" in data and data.get("rows"):
        return quant_study(data)
    if isinstance(data.get("headline"), str):
        return data["headline"]
    for line in md_text(stem).splitlines():
        if line.startswith("**") and line.rstrip().endswith("**") and len(line) > 4:
            return line.strip("* ")
    return f"tables in {stem}.md"


def title_of(stem: str, data: dict[str, Any]) -> str:
    if isinstance(data.get("title"), str):
        return data["title"]
    first = md_text(stem).splitlines()[:1]
    return first[0].lstrip("# ").strip() if first else stem


def cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


@dataclass(slots=True, frozen=True)
class Headline:
    """One row of README.md's headline table: what, the result it reads (its figure: ``figure_of``), the
    baseline it is measured against."""

    what: str
    stem: str
    baseline: str


HEADLINES = [
    Headline("SmolLM2-135M-Instruct batch-1 decode, the same GGUF weights, 2 threads (and 1), prompt 128",
             "latency_smollm2", "llama.cpp on the same file, same run, one process (under cinq's PASSIVE OpenMP "
             "policy, which slows llama.cpp's 2-thread rows: the next row is the fair pair)"),
    Headline("SmolLM2 batch-1 decode, each engine in its own process at its best OpenMP wait policy and thread count",
             "omp_wait_policy_after_attention", "llama.cpp on the same weights, every policy, same run"),
    Headline("Gemma 3 270M (Q4_K_M GGUF) batch-1 decode, each engine in its own process at its best OpenMP wait "
             "policy and thread count (the one-process run under cinq's policy: gemma3.md); its KV memory",
             "omp_wait_policy_gemma3", "llama.cpp on the same file, every policy, same run; one shared block table"),
    Headline("offline throughput, SmolLM2-135M-Instruct, 64 requests", "throughput_smollm2",
             "HF generate on the same weights at its best batch, same run"),
    Headline("speculative decoding on SmolLM2's Q4_1 file (n-gram; the shipped EAGLE-3 head), 3 rounds: an arm at "
             "k = 0 decodes plain, its figure is the run's noise",
             "speculative_smollm2_greedy", "plain decoding, same run"),
    Headline("speculative decoding on SmolLM2, the file dequantized to bf16 weights (same methods; the shipped EAGLE-3 "
             "head, 315k tokens it wrote, 1,846 steps; 'eagle3+lookup': prompt lookup first), batch 1, 5 rounds",
             "speculative_smollm2_bf16_b1",
             "plain decoding, same run"),
    Headline("quantization quality, SmolLM2 (NF4 / FP8 / int4 / int8 rows)", "quant_study_float_codes",
             "dense bf16 from the same file"),
    Headline("OpenAI server, rate = inf, SmolLM2", "serving_smollm2", "the offline engine, same run"),
    Headline("speculative decoding on a copy workload (code edits, extractions; SmolLM2 on bf16 weights, n-gram and "
             "EAGLE-3 with prompt lookup first, each answer to its end of text)", "speculative_smollm2_copy_bf16_eos",
             "plain decoding, same run"),
    Headline("structured outputs (xgrammar), 60 schemas", "structured_outputs", "unconstrained requests, same engine"),
    Headline("server under soak / overload / disconnects", "reliability", "RSS bound +15%"),
    Headline("the CUDA path on one H200", "gpu", "HF generate on the same GPU"),
]
assert len(HEADLINES) <= 12, "README's headline table holds at most 12 rows"


def headline_table() -> str:
    rows = []
    for h in HEADLINES:
        data = load(h.stem)
        rows.append([h.what, cell(figure_of(h.stem, data)), h.baseline,
                     f"[{h.stem}.md](benchmarks/results/{h.stem}.md)",
                     label(h.stem, data)])
    return markdown_table(["what", "measured", "baseline", "result", "run"], rows, "lllll")


def full_table() -> str:
    stems = sorted(p.stem for p in RESULTS.glob("*.json") if p.stem not in NOT_RESULTS)
    rows = []
    for stem in stems:
        data = load(stem)
        script = SCRIPTS.get(stem, "not registered: add it to SCRIPTS in benchmarks/results_table.py")
        run = label(stem, data) + (f": {FROM_A_LOG[stem]}" if stem in FROM_A_LOG else "")
        rows.append([f"[{stem}]({stem}.md)", cell(title_of(stem, data)), cell(figure_of(stem, data)),
                     f"`{script}`", run])
    only_md = sorted(p.stem for p in RESULTS.glob("*.md")
                     if p.stem != "README" and not (RESULTS / f"{p.stem}.json").exists())
    lines = ["# Where we stand: every result", "",
             "Written by `python benchmarks/results_table.py` from the JSON files here; do not edit by hand. "
             "Each figure is computed from the JSON (`FIGURES` in results_figures.py) or is the one-line headline its "
             "script wrote (the JSON's `headline`, or the bold line of its `.md`); `run` is how the run recorded its "
             "machine: quiet (nothing else running when it began), draft (shared machine: rerun alone before "
             "quoting timings), not recorded, or from a log.", "",
             markdown_table(["result", "what", "figure", "script", "run"], rows, "lllll"), ""]
    if only_md:
        lines += ["Written by hand, no JSON (their figures are not in the tables above): "
                  + ", ".join(f"[{s}]({s}.md)" for s in only_md) + ".", ""]
    return "\n".join(lines)


def with_headline(readme: str, table: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    head, rest = readme.split(BEGIN, 1)
    return head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    args = ap.parse_args()
    wanted = {RESULTS / "README.md": full_table(), README: with_headline(README.read_text(), headline_table())}
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)} (run python benchmarks/results_table.py)")
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
