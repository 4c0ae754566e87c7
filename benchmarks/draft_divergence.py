"""Which distillation divergence makes the best speculative draft model (DistillSpec's question), measured.

The shipped draft candidate cinq-tiny-student (forward KL, 2M tokens) is trained further with the same extra
budget under each divergence (`cinq distill --student <shipped folder> --loss L`, off-policy corpus windows,
same lr / warmup / seed; forward KL is the control), once per peak learning rate of ``--lrs``. Every resulting
student, and the untouched shipped one, is then measured as a draft for cinq-tiny:

* greedy acceptance at k = 3 on the target's own greedy continuations (float32, cinq's engine) of held-out
  prompts from the corpus test split, balanced over languages: tau and acceptance per position, overall and per
  language (benchmarks/draft_acceptance.py, offline: one teacher-forced draft forward per sequence);
* the same tau from the serving engine's own counters (`speculative_config` method draft_model, float32, language
  tags), which also checks the speculative output equals the target's plain greedy output;
* held-out perplexity on the test split and forward KL to the teacher (cinq/train/evaluate.py, as model cards).

Noise: a tau difference gets a 95% interval from a paired bootstrap over the held-out sequences (same sequences
for both drafts); an interval holding 0 is reported as no difference.

    python benchmarks/draft_divergence.py                 # runs (resumable) + results/draft_divergence.{md,json}
    python benchmarks/draft_divergence.py --no-engine     # skip the engine cross-check
    python benchmarks/draft_divergence.py --quick         # smoke run: runs/draft-div-quick (report included)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cinq.assets import shipped_model_path  # noqa: E402
from benchmarks.draft_acceptance import (measure_draft, paired_tau_difference, sequence_batches,  # noqa: E402
                                        served_batches)
from cinq.eval.spec_acceptance import measure_ngram  # noqa: E402
from cinq.model.loader import load_model  # noqa: E402
from cinq.spec.head_folder import TargetFingerprint  # noqa: E402
from cinq.train.distill import load_teacher  # noqa: E402
from cinq.train.evaluate import kl_to_teacher, language_perplexities  # noqa: E402
from cinq.plan.cpu import cpu_label  # noqa: E402
from cinq.train.spec_head_data import GenerationSettings, TargetSequences, target_sequences  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DATA = "data/corpus"
TARGET = shipped_model_path("cinq-tiny")
SHIPPED = shipped_model_path("cinq-tiny-student")
K = 3
# run name -> the divergence flags of `cinq distill`; fkl first: it is the control the others are compared with
LOSSES: dict[str, list[str]] = {
    "fkl": ["--loss", "fkl"],
    "tv": ["--loss", "tv"],
    "gjsd": ["--loss", "gjsd", "--beta", "0.5"],
    "rkl": ["--loss", "rkl"],
}
LABELS = {"shipped": "shipped (fkl, 2M tokens)", "fkl": "forward KL (control)", "tv": "total variation",
          "gjsd": "generalized JSD, beta 0.5", "rkl": "reverse KL"}


def rel(p: str | Path) -> str:
    """``p`` relative to the repository root when it lies inside it (for recorded commands)."""
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def distill_command(name: str, out: Path, tokens: float, lr: float, warmup: int, seed: int) -> list[str]:
    """The `cinq distill` call that continues the shipped student under run ``name``'s divergence."""
    return ["cinq", "distill", "--teacher", rel(TARGET), "--student", rel(SHIPPED), "--data", DATA,
            "--out", rel(out), *LOSSES[name], "--regime", "offpolicy", "--tokens", f"{tokens:g}", "--lr", f"{lr:g}",
            "--warmup", str(warmup), "--seed", str(seed), "--threads", "1", "--no-progress", "--name", name]


def run_distill(cmd: list[str]) -> float:
    """Run (or resume; a finished run only re-exports) one distillation; returns its wall time here."""
    exe = str(Path(sys.executable).with_name("cinq"))
    t0 = time.perf_counter()
    subprocess.run([exe, *cmd[1:]], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def held_out(target: Any, prompts: int, max_tokens: int, cache: Path) -> TargetSequences:
    """The target's greedy float32 continuations of balanced test-split prompts (cached in ``cache``)."""
    settings = GenerationSettings("test", prompts, 24, max_tokens, 0.0, 0, "engine", "float32")
    fp = TargetFingerprint.of(target, TARGET.name).fingerprint
    return target_sequences(TARGET, target, DATA, settings, cache, fp, list(target.config.eos_token_ids))


def engine_acceptance(draft_dir: Path, seqs: TargetSequences, k: int, max_tokens: int) -> dict[str, Any]:
    """tau, acceptance per position and per-language tau from the engine's counters for ``draft_dir`` drafting
    k tokens for the target (float32, greedy), on the prompts of ``seqs``; ``identical``: every output equals the
    target's plain greedy continuation stored in ``seqs``."""
    from cinq import LLM, SamplingParams

    prompts = [seqs.sequence(i)[:int(seqs.prompt_lens[i])].astype(int).tolist() for i in range(len(seqs))]
    wants = [seqs.sequence(i)[int(seqs.prompt_lens[i]):].astype(int).tolist() for i in range(len(seqs))]
    longest = max(len(p) for p in prompts) + max_tokens + k + 1
    llm = LLM(str(TARGET), dtype="float32", max_num_seqs=16, enable_prefix_caching=False,
              max_model_len=longest, num_kv_blocks=16 * (longest // 16 + 2) + 16,
              speculative_config={"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k})
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, skip_special_tokens=False),
                        language=[str(x) for x in seqs.langs])
    elapsed = time.perf_counter() - t0
    st = llm.engine.get_stats()
    got = [list(o.outputs[0].token_ids) for o in outs]
    drafts = max(st.spec_decode_num_drafts, 1)
    per_pos = list(st.spec_decode_num_accepted_tokens_per_pos) + [0] * k
    return {"tau": st.spec_decode_mean_acceptance_length, "verify_steps": st.spec_decode_num_drafts,
            "accept_per_step": [per_pos[j] / drafts for j in range(k)],
            "per_language": {lang: s.mean_acceptance_length for lang, s in sorted(st.spec_decode_by_language.items())},
            "identical": sum(g == w for g, w in zip(got, wants)), "requests": len(got), "elapsed_s": elapsed}


def evaluate(folder: Path, target: Any, batches: list, seqs: TargetSequences, max_tokens: int, engine: bool,
             ppl_tokens: int | None, cache: Path) -> dict[str, Any]:
    """Every measurement of one draft folder (``max_tokens``: the held-out requests' limit), cached in ``cache``
    under a key of the weights and the held-out set, so a rerun only evaluates new or retrained drafts."""
    key = {"weights": hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16],
           "held_out": {k: seqs.info.get(k) for k in ("settings", "target")}, "k": K, "engine": engine,
           "ppl_tokens": ppl_tokens}
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return saved["result"]
    t0 = time.perf_counter()
    model = load_model(folder, dtype="float32").eval()
    out: dict[str, Any] = {"folder": rel(folder), "acceptance": measure_draft(model, batches, K, max_tokens),
                           "perplexity": language_perplexities(model, DATA, "test", max_tokens=ppl_tokens),
                           "kl_to_teacher": kl_to_teacher(model, target, DATA)}
    if engine:
        out["engine"] = engine_acceptance(folder, seqs, K, max_tokens)
    out["eval_s"] = time.perf_counter() - t0
    cache.write_text(json.dumps({"key": key, "result": out}) + "\n")
    return out


def paired(a: dict[str, Any], b: dict[str, Any], keep: np.ndarray | None = None) -> dict[str, Any]:
    """Paired tau difference of rows ``a`` - ``b`` over the held-out sequences (those where ``keep`` is True)."""
    xa, xb = a["acceptance"]["per_sequence"], b["acceptance"]["per_sequence"]
    if keep is not None:
        xa, xb = [x for x, k in zip(xa, keep) if k], [x for x, k in zip(xb, keep) if k]
    return paired_tau_difference(xa, xb)


def language_note(rows: list[dict[str, Any]], lrs: list[float], langs: np.ndarray, ngram: dict[str, Any]) -> str:
    """Where the continued students lose most against the shipped one, and the comparisons without it."""
    trained = [r for r in rows if r["lr"] is not None]
    per = {lang: np.mean([r["vs_shipped_per_language"][lang]["diff"] for r in trained])
           for lang in trained[0]["vs_shipped_per_language"]}
    worst = min(per, key=per.get)
    keep = langs != worst
    shipped = rows[0]
    parts = []
    for lr in lrs:
        group = [r for r in trained if r["lr"] == lr]
        control = next(r for r in group if r["loss"] == "fkl")
        margins = ", ".join(f"{r['loss']} {_diff(paired(control, r, keep))}" for r in group if r is not control)
        parts.append(f"at lr {lr:g} the control vs shipped is {_diff(paired(control, shipped, keep))} and its margin "
                     f"over {margins}")
    look = ngram["per_language"][worst]["tau"]
    rest = np.mean([v["tau"] for lang, v in ngram["per_language"].items() if lang != worst])
    return (f"The continued students lose most against the shipped one on {worst} (tau - shipped "
            f"{per[worst]:+.2f} on average over the {len(trained)} runs, every divergence and lr alike). Without "
            f"{worst}: " + "; ".join(parts) + f". For scale, prompt lookup (n-gram, k = 3) reaches tau {look:.2f} "
            f"on {worst}, {rest:.2f} on average over the other languages.")


def noise_verdict(d: dict[str, Any]) -> str:
    """"no difference" when the 95% interval holds 0, else higher / lower."""
    lo, hi = d["ci95"]
    if lo <= 0.0 <= hi:
        return "no difference"
    return "higher" if d["diff"] > 0 else "lower"


def _diff(d: dict[str, Any] | None) -> str:
    return "-" if d is None else f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def verdict(rows: list[dict[str, Any]], lrs: list[float]) -> str:
    """Which divergence maximises acceptance at each learning rate, by how much, and whether that beats the
    noise: a winner must beat every other divergence at that lr by a paired 95% interval that excludes 0."""
    out, winners = [], []
    for lr in lrs:
        group = [r for r in rows if r["lr"] == lr]
        best = max(group, key=lambda r: r["acceptance"]["all"]["tau"])
        margins = {r["loss"]: paired_tau_difference(best["acceptance"]["per_sequence"],
                                                    r["acceptance"]["per_sequence"]) for r in group if r is not best}
        clear = all(noise_verdict(d) == "higher" for d in margins.values())
        winners.append(best["loss"] if clear else None)
        control = next(r for r in group if r["loss"] == "fkl")
        out.append(f"At lr {lr:g}, {best['loss']} has the highest tau ({best['acceptance']['all']['tau']:.3f}), "
                   + ("beyond the noise" if clear else "not beyond the noise") + " (its margin over "
                   + ", ".join(f"{k} {_diff(d)}" for k, d in margins.items()) + "); the forward-KL control vs the "
                   f"shipped student: {_diff(control['vs_shipped'])} ({noise_verdict(control['vs_shipped'])}).")
    if len(set(winners)) == 1 and winners[0] is not None:
        head = f"{winners[0]} maximises acceptance at every learning rate tried, beyond the noise."
    else:
        head = ("No single divergence wins beyond the noise at every learning rate tried (winner per lr: "
                + ", ".join(f"{lr:g}: {w or 'none beyond the noise'}" for lr, w in zip(lrs, winners)) + ").")
    better = [r["key"] for r in rows if r["lr"] is not None and noise_verdict(r["vs_shipped"]) == "higher"]
    tail = ("No continued student drafts better than the shipped one beyond the noise." if not better else
            "Beyond the noise better drafts than the shipped student: " + ", ".join(better) + ".")
    return " ".join([head, *out, tail]) + (" Noise: paired bootstrap over "
                                          f"{min(r['acceptance']['all']['steps'] for r in rows)}"
                                          "+ verify steps (the held-out sequences resampled) per draft.")


def write_report(res: dict[str, Any], prefix: Path) -> None:
    rows, cfg = res["rows"], res["config"]
    langs = list(rows[0]["acceptance"]["per_language"])
    steps = [r["acceptance"]["all"]["steps"] for r in rows]
    lang_steps = [v["steps"] for r in rows for v in r["acceptance"]["per_language"].values()]
    has_engine = all("engine" in r for r in rows)
    lines = [
        "# Which divergence makes the best draft model? (DistillSpec's question on cinq-tiny)",
        "",
        "Each row but the first continues the shipped draft `cinq-tiny-student` (forward KL, 2M tokens) for the same "
        f"extra **{cfg['tokens']:g} tokens** ({cfg['steps']} steps of 8 x 512 off-policy corpus windows, warmup "
        f"{cfg['warmup']} steps then cosine to 0.1x of the peak lr, seed {cfg['seed']}, 1 torch thread), changing only "
        "the divergence, at each peak learning rate of " + ", ".join(f"{x:g}" for x in cfg["lrs"])
        + " (the shipped run peaked at 3e-3 and ended at 3e-4). "
        f"Each student drafts for `cinq-tiny`, greedy, k = {cfg['k']}, float32, on the target's own greedy "
        f"continuations (at most {cfg['max_tokens']} tokens) of {res['held_out']['sequences']} held-out prompts "
        f"from the corpus test split ({res['held_out']['per_language']} per language: {', '.join(langs)}): "
        f"{min(steps)}-{max(steps)} verify steps per draft ({min(lang_steps)}-{max(lang_steps)} per language).",
        "",
        "| loss | peak lr | extra tokens | train time | held-out ppl | KL to teacher | tau k=3 | engine tau | "
        "accept@1 | accept@2 | accept@3 | worst / best language tau | tau - control [95% CI] | "
        "tau - shipped [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        a = r["acceptance"]
        per = {lang: v["tau"] for lang, v in a["per_language"].items()}
        worst, best = min(per, key=per.get), max(per, key=per.get)
        eng = f"{r['engine']['tau']:.3f}" if "engine" in r else "-"
        train = f"{r['train_s'] / 60:.1f} min" if r.get("train_s") else "-"
        lr = "-" if r["lr"] is None else f"{r['lr']:g}"
        lines.append(
            f"| {LABELS[r['loss']]} | {lr} | {r.get('tokens', 0):,} | {train} | {r['perplexity']['all']:.2f} | "
            f"{r['kl_to_teacher']:.3f} | **{a['all']['tau']:.3f}** | {eng} | "
            + " | ".join(f"{x:.3f}" for x in a["all"]["accept_rate"])
            + f" | {worst} {per[worst]:.2f} / {best} {per[best]:.2f} | {_diff(r.get('vs_control'))} | "
              f"{_diff(r.get('vs_shipped'))} |")
    lines += ["", "## Verdict", "", res["verdict"], "", res["language_note"], "",
              f"Per language tau (k = {cfg['k']}, offline; the last row is prompt lookup, n = 2..4, on the same "
              "sequences):", "",
              "| loss | peak lr | " + " | ".join(langs) + " |", "|---|---:|" + "---:|" * len(langs)]
    for r in [*rows, {"loss": "ngram", "lr": None, "acceptance": res["ngram"]}]:
        per = r["acceptance"]["per_language"]
        lr = "-" if r["lr"] is None else f"{r['lr']:g}"
        lines.append(f"| {r['loss']} | {lr} | " + " | ".join(f"{per[lang]['tau']:.2f}" for lang in langs) + " |")
    for field, title in (("vs_shipped_per_language", "tau - shipped"), ("vs_control_per_language",
                                                                        "tau - forward-KL control at the same lr")):
        lines += ["", f"Per language {title} (paired; * where the 95% interval excludes 0):", "",
                  "| loss | peak lr | " + " | ".join(langs) + " |", "|---|---:|" + "---:|" * len(langs)]
        for r in rows:
            if field in r:
                cells = [f"{d['diff']:+.3f}" + ("" if noise_verdict(d) == "no difference" else "*")
                         for d in (r[field][lang] for lang in langs)]
                lines.append(f"| {r['loss']} | {r['lr']:g} | " + " | ".join(cells) + " |")
    ppl_langs = list(rows[0]["perplexity"])
    lines += ["", "Held-out perplexity per language:", "",
              "| loss | peak lr | " + " | ".join(ppl_langs) + " |", "|---|---:|" + "---:|" * len(ppl_langs)]
    for r in rows:
        lr = "-" if r["lr"] is None else f"{r['lr']:g}"
        lines.append(f"| {r['loss']} | {lr} | " + " | ".join(f"{r['perplexity'][x]:.2f}" for x in ppl_langs) + " |")
    engine_note = "not measured in this run."
    if has_engine:
        same_steps = all(r["engine"]["verify_steps"] == r["acceptance"]["all"]["steps"] for r in rows)
        identical = all(r["engine"]["identical"] == r["engine"]["requests"] for r in rows)
        engine_note = (
            f"verify steps {'equal' if same_steps else 'differ from'} the offline walk's for every draft, and "
            f"{'every' if identical else 'not every'} served output is identical to the target's plain greedy one. "
            + ("The engine's tau is a little higher because"
               if all(r["engine"]["tau"] >= r["acceptance"]["all"]["tau"] for r in rows)
               else "Where the engine's tau is higher it is because")
            + " its counter (cinq/engine/scheduler.py: accepted = sampled - 1, taken before the stop check) also "
            "counts drafts accepted past an end-of-sequence token, which are never emitted (a draft predicts the bos "
            "that follows eos as well as the target does); offline tau counts only emitted tokens.")
    lines += [
        "", "## Definitions", "",
        "* tau = 1 + accepted drafts / verify steps, walking each continuation as served (cinq/eval/"
        "draft_acceptance.py over cinq/eval/spec_acceptance.py's walk, with the engine's rule that a step drafts at "
        "most max_tokens - emitted - 1 tokens); accept@j = over every continuation position, the fraction whose "
        "first j drafts all match the target.",
        "* engine tau: `llm.engine.get_stats().spec_decode_mean_acceptance_length` serving the same held-out prompts "
        "with the draft (`speculative_config` draft_model, float32, up to 16 at a time): " + engine_note,
        "* tau - control / shipped: paired bootstrap over the held-out sequences (2000 resamples) against the "
        "forward-KL run at the same lr / the shipped student; an interval containing 0 is no difference.",
        "* held-out ppl: corpus test split, 512-token windows (cinq/train/evaluate.py, bf16 autocast, as the "
        "model cards); KL to teacher: forward KL(teacher || student) per token on 32 test windows.",
        "* train time: the trainer's own clock on a CPU shared with other jobs (load average "
        f"{res['machine']['load_average'][1]:.1f} over the last 5 minutes at the end): not a cost comparison.",
        "", "## Reproduce", "", "```sh", *[" ".join(shlex.quote(c) for c in cmd) for cmd in res["commands"]],
        "python benchmarks/draft_divergence.py   # runs the above itself (resuming), then measures", "```", "",
        f"CPU: {res['machine']['cpu']}, torch {res['machine']['torch']}, {res['machine']['threads']} thread. "
        f"Training {sum(r.get('train_s') or 0 for r in rows) / 60:.1f} min in all, evaluation "
        f"{sum(r['eval_s'] for r in rows) / 60:.1f} min (both summed over the runs, cached evaluations included "
        "at their first cost).", ""]
    prefix.with_suffix(".md").write_text("\n".join(lines))
    prefix.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=float, default=1.5e5, help="extra tokens per continued student")
    ap.add_argument("--lrs", default="1e-3,3e-4", help="comma-separated peak learning rates (one set of runs each)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1, help="data order (the shipped student trained with seed 0)")
    ap.add_argument("--losses", default=",".join(LOSSES), help="comma-separated runs from " + ", ".join(LOSSES))
    ap.add_argument("--prompts", type=int, default=330, help="held-out prompts (balanced over the test languages)")
    ap.add_argument("--max-tokens", type=int, default=96, help="target tokens per held-out prompt")
    ap.add_argument("--no-engine", action="store_true", help="skip the serving-engine cross-check")
    ap.add_argument("--quick", action="store_true", help="tiny budget into runs/draft-div-quick, report there too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = ROOT / "runs" / ("draft-div-quick" if args.quick else "draft-div")
    tokens = 8192.0 if args.quick else args.tokens
    prompts, max_tokens = (20, 16) if args.quick else (args.prompts, args.max_tokens)
    ppl_tokens = 4096 if args.quick else None
    lrs = [float(x) for x in args.lrs.split(",") if x]
    names = [n for n in args.losses.split(",") if n]
    if names[0] != "fkl" or any(n not in LOSSES for n in names):
        ap.error(f"--losses: fkl (the control) first, then any of {', '.join(LOSSES)}")

    trained: list[dict[str, Any]] = []
    for lr in lrs:
        for name in names:
            out = runs / f"lr{lr:g}" / name
            cmd = distill_command(name, out, tokens, lr, args.warmup, args.seed)
            wall = run_distill(cmd)
            s = json.loads((out / "summary.json").read_text())
            print(f"{name} lr {lr:g}: trained {s['tokens_seen']:,} tokens in {s['elapsed_s']:.0f} s "
                  f"(this call {wall:.0f} s)", flush=True)
            trained.append({"key": f"{name}@{lr:g}", "loss": name, "lr": lr, "out": out, "command": cmd,
                            "tokens": s["tokens_seen"], "train_s": s["elapsed_s"], "final_train_loss": s["final_loss"],
                            "final_val": s["evals"]})

    target = load_teacher(TARGET)
    seqs = held_out(target, prompts, max_tokens, runs / "target")
    batches = sequence_batches(seqs)
    langs, lang_list = seqs.langs, sorted(set(seqs.langs.tolist()))
    ngram = measure_ngram(served_batches(batches, max_tokens), K)
    engine = not args.no_engine
    shipped = {"key": "shipped", "loss": "shipped", "lr": None,
               **evaluate(SHIPPED, target, batches, seqs, max_tokens, engine, ppl_tokens, runs / "shipped_eval.json")}
    rows = [shipped]
    for t in trained:
        out = t.pop("out")
        row = {**t, **evaluate(out / "model", target, batches, seqs, max_tokens, engine, ppl_tokens,
                               out / "draft_eval.json")}
        control = next(r for r in rows if r["loss"] == "fkl" and r["lr"] == row["lr"]) if row["loss"] != "fkl" \
            else row
        row["vs_control"], row["vs_shipped"] = paired(row, control), paired(row, shipped)
        row["vs_shipped_per_language"] = {lang: paired(row, shipped, langs == lang) for lang in lang_list}
        if row["loss"] != "fkl":
            row["vs_control_per_language"] = {lang: paired(row, control, langs == lang) for lang in lang_list}
        rows.append(row)
    for r in rows:
        print(f"{r['key']}: tau {r['acceptance']['all']['tau']:.3f}, ppl {r['perplexity']['all']:.2f}", flush=True)
    n_langs = len(set(seqs.langs.tolist()))
    res = {"config": {"tokens": tokens, "steps": int(tokens // (8 * 512)), "lrs": lrs, "warmup": args.warmup,
                      "seed": args.seed, "k": K, "max_tokens": max_tokens, "target": rel(TARGET),
                      "shipped_student": rel(SHIPPED)},
           "held_out": {"sequences": len(seqs), "per_language": len(seqs) // max(n_langs, 1),
                        "tokens": seqs.num_tokens, "generation": seqs.info},
           "ngram": ngram, "rows": rows, "verdict": verdict(rows, lrs),
           "language_note": language_note(rows, lrs, langs, ngram), "commands": [t["command"] for t in trained],
           "machine": {"cpu": cpu_label(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "load_average": os.getloadavg()}}
    print(res["verdict"])
    prefix = runs / "report" if args.quick else RESULTS / "draft_divergence"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_report(res, prefix)
    print("wrote", rel(prefix.with_suffix(".md")), rel(prefix.with_suffix(".json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
