"""Speculative decoding on the real SmolLM2-135M-Instruct: plain decoding vs n-gram and an EAGLE-3 head (chain,
fixed k and adaptive; alone and behind prompt lookup), same target, same prompts, one run; greedy and sampled
(temperature 0.7, top-p 0.9, the same per-request seeds for plain and speculative runs); tau per language at
batch 1.

Two workloads (``--workload``):
- ``chat``: the held-out chat turns of cinq/train/spec_head_prompts.py (test topics, which no head trained on),
  the same number per language; the batch sweep (``--batch-sizes``) and the sampled rows (``--sample-batches``).
- ``copy``: code edits and extractions over standard-library functions (benchmarks/copy_prompts.py), where the
  answer copies the prompt: n-gram at several k and adaptive, with the verify/decode step-cost ratio the
  adaptive run measured (what caps the speedup).

Outputs are compared with plain decoding's: the mismatch rate is the fraction of greedy outputs that differ (in
bf16 a near-tie can flip under the verify step's other row count; in float32 none may). At each batch size,
``--rounds`` rounds of plain decoding then every method (rotated), and plain once more: a method's speedup is the
median over rounds of its rate over the plain runs either side; "baseline drift" is the last plain run's rate over
the first's.

    python benchmarks/speculative_smollm2.py --head runs/eagle3-smollm2/head --no-languages       # sweep, ~8 min
    python benchmarks/speculative_smollm2.py --workload copy --batch-sizes 1,4                  # copy, ~5 min
    python benchmarks/speculative_smollm2.py --batch-sizes 1 --max-tokens 16 --no-languages   # smoke
    python benchmarks/speculative_smollm2.py --weights bf16 --head cinq/assets/smollm2-135m-instruct-eagle3 --trees \
        --batch-sizes 1,4 --sample-batches "" --no-languages --rounds 4 \
        --out benchmarks/results/speculative_smollm2_trees_bf16        # chain vs static vs dynamic tree
    python benchmarks/speculative_smollm2.py --weights bf16 --out benchmarks/results/speculative_smollm2_bf16
                                                        # the same on bf16 weights (verify rows cost less there)

Writes benchmarks/results/speculative_smollm2.{json,md} (``copy``: speculative_smollm2_copy.{json,md}).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

from benchmarks.copy_prompts import copy_prompts  # noqa: E402
from cinq.bench.report import BenchResult, Table, machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.bench.spec import compare, engine, measure  # noqa: E402
from cinq.config import EngineConfig, resolve_model  # noqa: E402
from cinq.model.tokenizer import Tokenizer  # noqa: E402
from cinq.train.spec_head_prompts import CHAT_LANGUAGES, chat_prompts  # noqa: E402

MODEL = "smollm2-135m-instruct"
# --weights: what the target serves
WEIGHTS = {"file": "its Q4_1 file", "bf16": "the file dequantized to bf16 weights",
           "q4_0": "the bf16 weights exported as a q4_0 file, served natively (a second quantization)"}
SAMPLED = (0.7, 0.9)  # temperature, top_p of the sampled rows


def ngram(k: int, adaptive: bool = False, lookup_min: int = 2) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": lookup_min,
            "adaptive": adaptive}


# EAGLE's trees against the chain, within the 8 verify rows a step costs about as much as 1 on this CPU (the skinny
# bf16 kernel's one pass): a static tree of 6 nodes (the 3 best first drafts, the 2 best after the best of them, and
# the best after that) and EAGLE-2's dynamic tree (the 2 best children of the 2 best nodes per level, 3
# levels, the 6 most likely nodes verified), against the chain of k = 3 (the best fixed chain at batch 1); each
# alone and behind prompt lookup (a request whose tokens repeat verifies its copy as a chain, the others the tree).
STATIC_TREE = [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0]]
DYNAMIC_TREE = {"tree_topk": 2, "tree_depth": 3}


OFF = "eagle3 off (k=0)"  # the arm that never drafts


def methods(workload: str, head: str | None, trees: bool = False) -> dict[str, dict[str, Any]]:
    if trees:
        if not head:
            raise SystemExit("--trees needs --head (an EAGLE-3 head folder)")
        e3 = {"method": "eagle3", "model": head}
        lookup = {key: ngram(4)[key] for key in ("prompt_lookup_max", "prompt_lookup_min")}
        chain = {**e3, "num_speculative_tokens": 3}
        dynamic = {**e3, "num_speculative_tokens": 6, **DYNAMIC_TREE}
        return {"eagle3 chain k=3": chain,
                "eagle3 static tree (6 nodes)": {**e3, "num_speculative_tokens": len(STATIC_TREE),
                                                 "speculative_token_tree": STATIC_TREE},
                "eagle3 dynamic tree (top-2, depth 3, 6 nodes)": dynamic,
                "eagle3+lookup chain k=3": {**chain, **lookup},
                "eagle3+lookup dynamic tree (6 nodes)": {**dynamic, **lookup}}
    if workload == "copy":
        out = {**{f"ngram k={k}": ngram(k) for k in (2, 4, 6, 8)}, "ngram adaptive k<=8": ngram(8, True)}
        # matching a single token too: more steps draft (0.85 of them against 0.55 over this workload's greedy
        # answers, offline), each a little less often right; with verify steps near a plain step's cost, 1.06x more
        # decode speed in that offline model
        out["ngram k=6 lookup 1-4"] = ngram(6, lookup_min=1)
        if head:  # prompt lookup first: the copy's n-gram drafts where the answer repeats the prompt, the head's
            lookup = {key: ngram(4)[key] for key in ("prompt_lookup_max", "prompt_lookup_min")}
            out["eagle3+lookup k=4"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 4, **lookup}
            out["eagle3+lookup adaptive k<=8"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 8,
                                                  "adaptive": True, **lookup}
        return out
    out = {"ngram k=4": ngram(4), "ngram adaptive k<=4": ngram(4, True)}
    if head:
        out["eagle3 k=3"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 3}
        out["eagle3 adaptive k<=4"] = {"method": "eagle3", "model": head, "num_speculative_tokens": 4,
                                       "adaptive": True}
        # prompt lookup first (SpeculativeConfig.lookup_first): the n-gram rows' lookup where the text repeats,
        # the head elsewhere
        lookup = {key: ngram(4)[key] for key in ("prompt_lookup_max", "prompt_lookup_min")}
        out["eagle3+lookup k=3"] = {**out["eagle3 k=3"], **lookup}
        out["eagle3+lookup adaptive k<=4"] = {**out["eagle3 adaptive k<=4"], **lookup}
        # speculation configured but off at every batch size: what adaptive k's plain arm costs over plain
        # decoding (the target's three feature layers kept each step for the head's next catch-up)
        out[OFF] = {**out["eagle3 k=3"], "num_speculative_tokens_per_batch_size": [[1, 1024, 0]]}
    return out


def verify_ratios(row: dict[str, Any]) -> str | None:
    """What a step verifying k drafts cost over a plain decode step, per k, as the adaptive run measured them in
    the row's batch bucket (its moving averages: a rough figure, and none for a fixed-k method)."""
    bucket = 1 << max(row["batch"] - 1, 0).bit_length()
    arms = {int(key.split(",")[1]): s for key, s in row["step_seconds"].items() if int(key.split(",")[0]) == bucket}
    if not arms.get(0):
        return None
    return ", ".join(f"k={k}: {s / arms[0]:.2f}" for k, s in sorted(arms.items()) if k)


def sweep(plain: Any, configs: dict[str, Any], prompts: list[list[int]], batches: list[int],
          max_tokens: int, sampling: tuple[float, float], table: Table, rounds: int = 1,
          ignore_eos: bool = True) -> list[dict[str, Any]]:
    """At each batch size, ``rounds`` rounds of plain decoding then every method (in an order rotated each round),
    and plain decoding once more at the end; one row per method. A method's speedup is the median over rounds of
    its tokens/s over the mean of the plain runs either side of its round (on this shared 2-core machine two plain
    runs minutes apart differ by up to ~10%, more than the effect an adaptive method must show); its other columns
    are its last round's. ``plain`` and ``configs`` are engines (cinq/bench/spec.py ``engine``)."""
    rows = []
    mode = "greedy" if sampling[0] == 0 else f"T={sampling[0]}, top-p {sampling[1]}"
    names = list(configs)
    for b in batches:
        plains, specs = [], {name: [] for name in names}
        for r in range(rounds):
            plains.append(measure(plain, prompts, b, max_tokens, *sampling, ignore_eos=ignore_eos))
            for name in names[r % len(names):] + names[:r % len(names)]:
                specs[name].append(measure(configs[name], prompts, b, max_tokens, *sampling, ignore_eos=ignore_eos))
        plains.append(measure(plain, prompts, b, max_tokens, *sampling, ignore_eos=ignore_eos))
        rates = [p["tok_s"] for p in plains]
        drift = round(rates[-1] / rates[0], 3)
        base = dict(plains[0], tok_s=statistics.median(rates))
        decode = [p["decode_tok_s"] for p in plains]
        for name, runs in specs.items():
            ratios = [run["tok_s"] * 2 / (rates[i] + rates[i + 1]) for i, run in enumerate(runs)]
            decode_ratios = [run["decode_tok_s"] * 2 / (decode[i] + decode[i + 1]) for i, run in enumerate(runs)]
            spec = dict(runs[-1], tok_s=statistics.median(run["tok_s"] for run in runs))
            row = compare({"method": name, "batch": b, "sampling": mode, "baseline_drift": drift}, base, spec)
            row["speedup"] = statistics.median(ratios)
            row["speedup_per_round"] = [round(x, 3) for x in ratios]
            row["decode_speedup"] = statistics.median(decode_ratios)
            row["plain_tok_s_runs"] = [round(x, 1) for x in rates]
            row["verify_cost_ratio"] = verify_ratios(row)
            rows.append(row)
            table.rows.append([name, b, mode, row["plain_tok_s"], row["spec_tok_s"], row["speedup"],
                               row["decode_speedup"],
                               ", ".join(f"{x:.2f}" for x in ratios) if rounds > 1 else None, row["tau"],
                               row["tokens_per_step"],
                               ", ".join(f"{a:.2f}" for a in row["accept_per_pos"]), 100 * row["draft_share"],
                               ", ".join(f"{100 * a:.0f}" for a in row["k_share"]) or None,
                               row["verify_cost_ratio"], row["mismatch_rate"] if sampling[0] == 0 else None, drift])
            print(f"{name} batch {b} {mode}: {row['speedup']:.2f}x tau {row['tau']}", flush=True)
    return rows


def language_table(plain: Any, configs: dict[str, Any], pairs: list[tuple[str, list[int]]],
                   max_tokens: int) -> tuple[Table, dict[str, dict[str, Any]]]:
    lt = Table("Per language at batch 1: tau (speedup against plain on the same prompts)",
               ["method", *CHAT_LANGUAGES, "worst/best tau"])
    langs: dict[str, dict[str, Any]] = {}
    for lang in CHAT_LANGUAGES:
        lp = [p for lg, p in pairs if lg == lang]
        base = measure(plain, lp, 1, max_tokens)
        for name, cfg in configs.items():
            spec = measure(cfg, lp, 1, max_tokens)
            langs.setdefault(name, {})[lang] = {"tau": spec["tau"], "speedup": spec["tok_s"] / base["tok_s"]}
    for name, per in langs.items():
        taus = [v["tau"] or 1.0 for v in per.values()]
        lt.rows.append([name, *(f"{per[lg]['tau'] or 1:.2f} ({per[lg]['speedup']:.2f}x)" for lg in CHAT_LANGUAGES),
                        f"{min(taus) / max(taus):.2f}"])
    return lt, langs



def _describe(target: str) -> str:
    """A --target folder as its quantization config says (no path: results stay machine-independent)."""
    from cinq.model.config import ModelConfig
    q = ModelConfig.from_pretrained(target).quantization_config or {}
    return (f"a {q.get('quant_method', 'quantized')} folder, {q.get('bits', '?')} bits, group "
            f"{q.get('group_size', '?')}, served natively")

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("chat", "copy"), default="chat")
    ap.add_argument("--head", default=None, help="EAGLE-3 head folder for SmolLM2 (omit: n-gram only)")
    ap.add_argument("--batch-sizes", default="1,4,8,16,32")
    ap.add_argument("--sample-batches", default="1,8", help="batch sizes of the sampled rows ('' for none)")
    ap.add_argument("--per-language", type=int, default=2, help="held-out chat prompts per language")
    ap.add_argument("--num-copy-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per request (default: 48 chat, "
                    "128 copy: a renamed function is answered whole)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--weights", choices=tuple(WEIGHTS), default="file",
                    help="the target's weights: its Q4_1 file (int8-activation kernels), the file dequantized to a "
                         "bf16 folder (the skinny bf16 kernel; cinq bench latency's 'bf16' variant), or that folder "
                         "exported as a q4_0 file (latency's 'int4': a second quantization, served natively)")
    ap.add_argument("--target", default=None,
                    help="a quantized folder of SmolLM2 (e.g. `cinq quantize ... --method gptq`) as the target, in "
                         "place of --weights")
    ap.add_argument("--no-languages", action="store_true", help="skip the per-language tau table")
    ap.add_argument("--trees", action="store_true",
                    help="EAGLE-3's chain against a static and EAGLE-2's dynamic tree (within 8 verify rows), alone and "
                         "behind prompt lookup, instead of the n-gram / EAGLE-3 chain set")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of plain + every method per batch size (speedup: the median over rounds)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="end each request at its end of text (default: ignore it and write --max-tokens). For the "
                         "copy workload the answer is the work: what the 135M model writes after it (new chat turns "
                         "of its own) copies nothing, and n-gram lookup cannot draft it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.max_tokens = args.max_tokens or (128 if args.workload == "copy" else 48)
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               ("speculative_smollm2_copy" if args.workload == "copy" else "speculative_smollm2"))
    draft, note = run_conditions(os.getloadavg()[0])
    # the code that runs: read at the start (a commit during a long run must not be credited with it)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    tokenizer = Tokenizer.from_pretrained(resolve_model(MODEL))
    if args.workload == "copy":
        pairs = copy_prompts(tokenizer, args.num_copy_prompts)
        what = f"{len(pairs)} copy prompts (code edit / extraction over standard-library functions)"
    else:
        pairs = chat_prompts(tokenizer, args.per_language * len(CHAT_LANGUAGES), 0, 256, "test")
        what = f"{len(pairs)} held-out chat prompts ({args.per_language} per language: {', '.join(CHAT_LANGUAGES)})"
    prompts = [p for _, p in pairs]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    specs = methods(args.workload, args.head, args.trees)
    # a KV pool for the largest wave (not the default share of memory: five engines stay loaded)
    k_max = max(sc["num_speculative_tokens"] for sc in specs.values())
    longest = max(len(p) for p in prompts) + args.max_tokens + k_max + 1
    blocks = max(batches + [int(b) for b in args.sample_batches.split(",") if b]) * -(-longest // 16) + 16
    model = MODEL
    if args.target is not None:
        model = args.target
    elif args.weights != "file":  # the latency benchmark's files, cached where it keeps them
        from cinq.bench.latency_engines import dense_folder, variant_config
        from cinq.cache import cache_dir
        work = cache_dir() / "bench-latency"
        model = (str(dense_folder(EngineConfig(model=MODEL), work)) if args.weights == "bf16"
                 else variant_config(EngineConfig(model=MODEL), "int4", work).model)
    plain_config = EngineConfig(model=model, dtype=args.dtype, num_kv_blocks=blocks)
    # each engine loads once: an adaptive one keeps what it learned at other batch sizes, as a server would
    plain = engine(plain_config)
    configs = {name: engine(dataclasses.replace(plain_config, speculative_config=dict(sc)))
               for name, sc in specs.items()}
    table = Table("Plain decoding vs speculation", [
        "method", "batch", "sampling", "plain tok/s", "spec tok/s", "speedup", "decode speedup", "per round", "tau",
        "tokens per step",
        "acceptance per position",
        "draft share (%)", "adaptive: steps at k = 0, 1, .. (%)", "verify/decode step cost",
        "greedy mismatch rate", "baseline drift"])
    eos = {"ignore_eos": not args.stop_at_eos}
    rows = sweep(plain, configs, prompts, batches, args.max_tokens, (0.0, 1.0), table, args.rounds, **eos)
    sampled = [c for c in configs if c in ("ngram k=4", "eagle3 adaptive k<=4", "eagle3+lookup adaptive k<=4")] \
        if args.workload == "chat" else []
    if args.sample_batches and sampled:
        rows += sweep(plain, {c: configs[c] for c in sampled}, prompts,
                      [int(b) for b in args.sample_batches.split(",")], args.max_tokens, SAMPLED, table, args.rounds,
                      **eos)
    tables, langs = [table], {}
    if args.workload == "chat" and not args.no_languages:
        lt, langs = language_table(plain, configs, pairs, args.max_tokens)
        tables.append(lt)
    greedy = [r for r in rows if r["sampling"] == "greedy"]
    worst = {b: min(r["speedup"] for r in greedy if r["batch"] == b and "adaptive" in r["method"]) for b in batches
             if any("adaptive" in r["method"] for r in greedy if r["batch"] == b)}
    off = {r["batch"]: r["speedup"] for r in greedy if r["method"] == OFF}
    best = max((r for r in greedy if r["method"] != OFF), key=lambda r: r["speedup"])
    headline = (f"best: {best['method']} at batch {best['batch']}: {best['speedup']:.2f}x "
                f"(decode {best['decode_speedup']:.2f}x, tau {best['tau'] or 1:.2f}, "
                f"{best['tokens_per_step']:.2f} tokens per step)"
                + ("; slowest adaptive per batch: " + ", ".join(f"{v:.2f}x (b{b})" for b, v in worst.items())
                   if worst else "")
                + ("; speculation off: " + ", ".join(f"{v:.2f}x (b{b})" for b, v in off.items()) if off else ""))
    result = BenchResult(
        out.name, f"Speculative decoding on SmolLM2-135M-Instruct ({args.workload} workload)",
        f"{note} Target {MODEL} ({WEIGHTS[args.weights] if args.target is None else _describe(args.target)}, "
        f"{args.dtype} compute), {what}, "
        f"{'up to ' if args.stop_at_eos else ''}{args.max_tokens} new tokens each, "
        f"{'ending at end of text' if args.stop_at_eos else 'ignore_eos'}; greedy "
        f"rows, and sampled rows (T={SAMPLED[0]}, top-p {SAMPLED[1]}, request i seeded with i in both runs). "
        f"{args.rounds} round(s) per batch size: plain, then every method in an order rotated each round, and plain "
        f"again at the end; speedup = the median over rounds of a method's rate over the mean of the plain runs "
        f"either side of its round ('per round': each round's ratio). Decode speedup: the same over the tokens after "
        f"each request's first and the time after each wave's last first token (prefill, which speculation does not "
        f"touch, left out). Tau: 1 + the accepted drafts per step that "
        f"drafted; tokens per step: the tokens a request got per forward, steps without a draft included. "
        f"Verify/decode step cost: the adaptive run's measured step time per k over plain's (same batch bucket; "
        f"arms it never measured there are absent). Head: {args.head or 'none'}. Commit {commit}.", tables, headline,
        {"draft": draft, "machine": machine_info(), "commit": commit, "head": args.head, "rows": rows,
         "languages": langs,
         "options": {**vars(args), "out": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else out.name,
                     "target": None if args.target is None else _describe(args.target)}})  # no machine path
    print_report(result)
    write_report(result, str(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
