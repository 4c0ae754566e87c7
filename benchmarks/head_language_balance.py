"""What language-balanced training prompts buy a speculative head: the worst/best language tau ratio, before/after.

Two EAGLE heads for cinq-tiny trained with the same command except ``--prompt-mix`` (cinq distill --heads eagle):
``natural`` (training prompts in the corpus train split's document proportions) and ``balanced`` (the same number
per language; the shipped cinq/assets/cinq-tiny-eagle). Both are measured from their head folders, as shipped
(bf16 weights, run in float32), with the evaluation of the shipped card (cinq/eval/spec_acceptance.py ``measure``:
greedy k = 4 on the target's greedy continuations of the language-balanced test-split prompts, the same set for
both heads). The training commands are recorded in the report; this script only evaluates.

    python benchmarks/head_language_balance.py                                  # results/head_language_balance.*
    python benchmarks/head_language_balance.py --natural runs/head-eagle-natural/head --generated runs/spec-data
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

import torch  # noqa: E402

from cinq.eval.spec_acceptance import measure  # noqa: E402
from cinq.spec.eagle import load_eagle_head  # noqa: E402
from cinq.spec.head_folder import TargetFingerprint  # noqa: E402
from cinq.train.distill import load_teacher  # noqa: E402
from cinq.plan.cpu import cpu_label  # noqa: E402
from cinq.train.spec_head_data import target_sequences  # noqa: E402
from cinq.train.spec_heads import HeadJob, held_out_batches, held_out_settings  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
COMMON = ("--target cinq/assets/cinq-tiny --data data/corpus --train-prompts 2200 --eval-prompts 220 "
          "--sample-temperature 0 --batch-size 16 --warmup 20 --lr 3e-3 --eval-every 50 --threads 1 --no-progress")
COMMANDS = {
    "natural": "cinq distill --heads eagle --out runs/head-eagle-natural --tokens 9e5 " + COMMON
               + " --generated runs/spec-data-natural --prompt-mix natural",
    "balanced": "cinq distill --heads eagle --out runs/head-eagle --tokens 9e5 " + COMMON
                + " --generated runs/spec-data --export cinq/assets/cinq-tiny-eagle",
}


def evaluate_head(folder: Path, generated: Path) -> dict[str, Any]:
    """The held-out acceptance of the head folder ``folder`` and what its card records of its training."""
    training = json.loads((folder / "config.json").read_text())["cinq_spec"]["training"]
    job = HeadJob(out_dir=str(folder), **training["job"])  # a job recorded before --prompt-mix: balanced
    target = load_teacher(Path(job.target))
    fingerprint = TargetFingerprint.of(target, Path(job.target).name).fingerprint
    held = target_sequences(job.target, target, job.data_dir, held_out_settings(job), generated, fingerprint,
                            list(target.config.eos_token_ids))
    head = load_eagle_head(folder, target, torch.float32, "cpu", "sdpa").eval()
    t0 = time.perf_counter()
    acc = measure(head, target, held_out_batches(held), job.draft_k)
    return {"head": str(folder), "prompt_mix": job.prompt_mix, "train_data": training["train_data"],
            "training_s": training["elapsed_s"], "steps": training["step"], "final_loss": training["final_loss"],
            "held_out_sequences": len(held), "held_out_tokens": held.num_tokens,
            "held_out_digest": [int(held.tokens.sum()), int(held.offsets[-1])], "acceptance": acc,
            "acceptance_at_training_end": training["acceptance"], "eval_s": time.perf_counter() - t0}


def spread(acc: dict[str, Any]) -> dict[str, Any]:
    """Worst and best language by tau, and their ratio."""
    taus = {lang: r["tau"] for lang, r in acc["per_language"].items()}
    worst, best = min(taus, key=taus.get), max(taus, key=taus.get)
    return {"worst": worst, "worst_tau": taus[worst], "best": best, "best_tau": taus[best],
            "ratio": taus[worst] / taus[best]}


def _at_end(r: dict[str, Any]) -> str:
    s = spread(r["acceptance_at_training_end"])
    return f"tau {r['acceptance_at_training_end']['all']['tau']:.3f}; {s['worst']} / {s['best']} {s['ratio']:.3f}"


def _caveats(nat: dict[str, Any], bal: dict[str, Any]) -> list[str]:
    """What else differs between the two runs, and where the larger natural share did not help, in figures."""
    dn, db = nat["train_data"], bal["train_data"]
    lines = [f"The two training sets differ in more than the language mix: natural holds {dn['tokens']:,} tokens "
             f"({dn['generated_tokens']:,} generated) against balanced's {db['tokens']:,} "
             f"({db['generated_tokens']:,}), for the same {nat['steps']} steps of 16 whole sequences, so part of "
             "the overall tau difference may come from less training text rather than from the mix itself."]
    pn, pb = nat["acceptance"]["per_language"], bal["acceptance"]["per_language"]
    more = [lang for lang in pb if dn["per_language"].get(lang, 0) > db["per_language"].get(lang, 0) and lang in pn]
    if more:
        deltas = ", ".join(f"{lang} {pb[lang]['tau'] - pn[lang]['tau']:+.3f}" for lang in more)
        lines.append(f"Languages with more prompts in the natural mix (balanced - natural tau): {deltas}.")
    return lines


def render(res: dict[str, dict[str, Any]]) -> str:
    nat, bal = res["natural"], res["balanced"]
    sn, sb = spread(nat["acceptance"]), spread(bal["acceptance"])
    langs = sorted(set(nat["train_data"]["per_language"]) | set(bal["train_data"]["per_language"])
                   | set(bal["acceptance"]["per_language"]))
    rows = []
    for lang in langs:
        n, b = nat["acceptance"]["per_language"].get(lang), bal["acceptance"]["per_language"].get(lang)
        cells = [str(r["train_data"]["per_language"].get(lang, 0)) for r in (nat, bal)]
        if n and b:
            cells += [f"{n['tau']:.3f}", f"{b['tau']:.3f}", f"{b['tau'] - n['tau']:+.3f}", str(b["steps"])]
        else:
            cells += ["-", "-", "-", "not in the test split"]
        rows.append(f"| {lang} | " + " | ".join(cells) + " |")
    an, ab = nat["acceptance"]["all"], bal["acceptance"]["all"]
    rows.append(f"| **all** | {nat['train_data']['sequences']} | {bal['train_data']['sequences']} | {an['tau']:.3f} | "
                f"{ab['tau']:.3f} | {ab['tau'] - an['tau']:+.3f} | {ab['steps']} |")
    narrowed = sb["ratio"] > sn["ratio"]
    verdict = (f"Balancing narrows the gap: worst/best tau {sn['ratio']:.3f} -> {sb['ratio']:.3f}."
               if narrowed else
               f"Balancing does **not** narrow the gap: worst/best tau {sn['ratio']:.3f} (natural) vs "
               f"{sb['ratio']:.3f} (balanced).")
    same_set = nat["held_out_digest"] == bal["held_out_digest"]
    return "\n".join([
        "# What language-balanced training prompts buy an EAGLE head", "",
        "Two EAGLE heads for cinq-tiny, trained with the same command (9e5 tokens, lr 3e-3, batch 16, seed 0, 2200 "
        "requested training prompts, greedy target continuations) except `--prompt-mix`: **natural** draws the "
        "training prompts in the corpus train split's own document proportions, **balanced** (the shipped "
        "cinq/assets/cinq-tiny-eagle) the same number per language; natural draws as many prompts in total as "
        "balanced does. Both measured from their head folders with the shipped card's evaluation "
        "(cinq/eval/spec_acceptance.py: greedy drafts of k = 4 against the target's greedy continuations of "
        f"{bal['held_out_sequences']} language-balanced corpus test-split prompts, float32; the same sequences "
        f"for both heads: {'checked' if same_set else 'NOT the same: do not compare'}).", "",
        "| language | train prompts natural | train prompts balanced | tau natural | tau balanced | "
        "balanced - natural | steps (balanced) |",
        "|---|---|---|---|---|---|---|", *rows, "",
        "| mix | overall tau | worst language | best language | worst / best tau | the same at training end* |",
        "|---|---|---|---|---|---|",
        *(f"| {name} | {r['acceptance']['all']['tau']:.3f} | {s['worst']} {s['worst_tau']:.3f} | "
          f"{s['best']} {s['best_tau']:.3f} | **{s['ratio']:.3f}** | {_at_end(r)} |"
          for name, r, s in (("natural", nat, sn), ("balanced", bal, sb))), "",
        "\\* the figures the run measured when it finished, on its float32 master weights before they were "
        "stored in bf16 (the head cards' tables); the other columns measure the stored bf16 heads.", "",
        verdict, "", *(x for line in _caveats(nat, bal) for x in (line, "")),
        "No confidence interval is computed: one training seed per mix and one held-out set, per-language "
        "figures resting on the step counts shown (the set is the same for both heads, so the comparison is "
        "paired, but seed-to-seed variation of a head is not measured here).", "",
        "## Commands", "", "```sh", COMMANDS["natural"], COMMANDS["balanced"] + "  # the shipped head",
        "python benchmarks/head_language_balance.py", "```", "",
        "| mix | training sequences | tokens (generated) | training steps | training time | target's generation "
        "| final train loss |", "|---|---|---|---|---|---|---|",
        *(f"| {name} | {d['sequences']} | {d['tokens']:,} ({d['generated_tokens']:,}) | {r['steps']} x 16 | "
          f"{r['training_s'] / 60:.1f} min | {d['generation_s']:.0f} s | {r['final_loss']:.3f} |"
          for name, r in (("natural", nat), ("balanced", bal)) for d in [r["train_data"]]), "",
        f"Machine: {cpu_label()}, {torch.get_num_threads()} torch thread(s), shared with other jobs.", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--natural", default="runs/head-eagle-natural/head", help="head folder trained on the natural mix")
    ap.add_argument("--balanced", default="cinq/assets/cinq-tiny-eagle", help="head folder trained balanced")
    ap.add_argument("--generated", default="runs/spec-data", help="cache of the held-out target sequences")
    ap.add_argument("--out", default=str(RESULTS / "head_language_balance"), help="report prefix (.md, .json)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {name: evaluate_head(Path(getattr(args, name)), Path(args.generated)) for name in ("natural", "balanced")}
    res["spread"] = {name: spread(res[name]["acceptance"]) for name in ("natural", "balanced")}
    res["commands"] = COMMANDS
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(res))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
