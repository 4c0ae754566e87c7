"""Two EAGLE-3 heads for SmolLM2 on one held-out set: per-language greedy acceptance (tau, k = 4) before and after a
training change, the same measure as the heads' cards (cinq/eval/spec_acceptance.py ``measure``), in float32.

Default: the shipped head (cinq/assets/smollm2-135m-instruct-eagle3, its figures from its training.json) against
runs/eagle3-smollm2-v5, on the held-out sequences the second run generated (108 chat turns on test topics, greedy).
Either side is a run folder or a shipped head folder. This script only evaluates; the training commands are in
each head's card.

    python benchmarks/head_before_after.py --before runs/eagle3-smollm2-v4-shipped --after runs/eagle3-smollm2-v5 \
        --out benchmarks/results/eagle3_smollm2_head_more_topics    # 3x the train topics, 4,500 prompts
    python benchmarks/head_before_after.py --before runs/eagle3-smollm2-v5 --after runs/eagle3-smollm2-v6 \
        --held-out runs/eagle3-smollm2-v5/target-test-*.npz \
        --out benchmarks/results/eagle3_smollm2_head_longer         # v5's data, 2.2x the steps (v6 reads v5's
                                                                    # sequences: --generated)

    python benchmarks/head_before_after.py --before runs/eagle3-smollm2-english --after runs/eagle3-smollm2-balanced \
        --held-out runs/spec-lang-smollm2/target-test-*.npz \
        --out benchmarks/results/eagle3_smollm2_head_language_balance  # English-only vs balanced prompts, as many
                                                                         # (cinq distill --prompt-mix english)
    python benchmarks/head_before_after.py --before runs/eagle3-smollm2-balanced --after runs/eagle3-smollm2-q4_0 \
        --target <the q4_0 file> --out benchmarks/results/eagle3_smollm2_head_q4_0_target
        # the head trained on the Q4_1 file against one trained on the q4_0 file's own outputs, drafting for q4_0
        # (the file: `cinq bench latency`'s int4 variant, in the cache's bench-latency folder)

(runs/eagle3-smollm2-v4-shipped: the v4 head's folder as shipped before v5 replaced it, from git: `git show
0c3dec3:cinq/assets/smollm2-135m-instruct-eagle3/<file>` for config.json and model.safetensors, and
training.json from 8499556.)
    python benchmarks/head_before_after.py --before runs/eagle3-smollm2-v3 --after runs/eagle3-smollm2-v4 \
        --out benchmarks/results/eagle3_smollm2_head_more_data    # twice the data (2,700 prompts, 187k tokens)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

import torch  # noqa: E402

from cinq.eval.spec_acceptance import measure  # noqa: E402
from cinq.real_models import REAL_MODELS  # noqa: E402
from cinq.spec.draft_vocab import coverage  # noqa: E402
from cinq.spec.eagle import load_eagle_head  # noqa: E402
from cinq.train.distill import load_teacher  # noqa: E402
from cinq.train.spec_head_card import TRAINING_FILE, training_record  # noqa: E402
from cinq.train.spec_head_data import TargetSequences  # noqa: E402
from cinq.train.spec_heads import generated_tokens, held_out_batches  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def head_and_training(path: Path) -> tuple[Path, dict]:
    """(head folder, training figures) of a run folder (``head/`` and ``summary.json``) or of a shipped head folder
    (its ``training.json``)."""
    if (path / "summary.json").is_file():
        return path / "head", training_record(json.loads((path / "summary.json").read_text()))
    return path, json.loads((path / TRAINING_FILE).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="cinq/assets/smollm2-135m-instruct-eagle3",
                    help="run folder or shipped head folder (with training.json) of the earlier head")
    ap.add_argument("--after", default="runs/eagle3-smollm2-v5",
                    help="run folder or shipped head folder of the later head")
    ap.add_argument("--held-out", default=None, help="held-out target sequences (.npz; default: --after's)")
    ap.add_argument("--target", default=None,
                    help="the target both heads draft for (default: SmolLM2's Q4_1 file; a quantized copy to ask "
                         "what a head trained on that copy's own outputs wins back)")
    ap.add_argument("--out", default=str(RESULTS / "eagle3_smollm2_head_before_after"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    held = Path(args.held_out) if args.held_out else next((ROOT / args.after).glob("target-test-*.npz"))
    seqs = TargetSequences.load(held)
    batches = held_out_batches(seqs)
    written = generated_tokens(seqs)
    target_path = Path(args.target) if args.target else REAL_MODELS["smollm2-135m-instruct"].path()
    target = load_teacher(target_path)
    res = {}
    for label, run in (("before", args.before), ("after", args.after)):
        head_dir, info = head_and_training(ROOT / run)
        head = load_eagle_head(head_dir, target, torch.float32, "cpu", "sdpa")
        acc = measure(head, target, batches, 4)
        draft_ids = getattr(head, "draft_ids", None)  # an EAGLE-3 head's reduced vocabulary
        res[label] = {"run": run, "train_prompts": info["train_prompts"],
                      "prompt_mix": info.get("prompt_mix", "balanced"), "train_tokens": info["train_tokens"],
                      "steps": info["steps"], "tau": acc["all"]["tau"],
                      "draft_vocab_coverage": (None if draft_ids is None else
                                               coverage(draft_ids.cpu(), written, target.config.vocab_size)),
                      "per_language": {k: v["tau"] for k, v in acc["per_language"].items()}}
    langs = sorted(res["after"]["per_language"])
    spread = {k: min(r["per_language"].values()) / max(r["per_language"].values()) for k, r in res.items()}
    ends = {k: (min(r["per_language"], key=r["per_language"].get), max(r["per_language"], key=r["per_language"].get))
            for k, r in res.items()}
    headline = (f"tau (k = 4) {res['before']['tau']:.3f} -> {res['after']['tau']:.3f}; worst/best language "
                f"{spread['before']:.2f} ({'/'.join(ends['before'])}) -> {spread['after']:.2f} "
                f"({'/'.join(ends['after'])}); every language up: "
                f"{all(res['after']['per_language'][x] > res['before']['per_language'][x] for x in langs)}")
    lines = ["# EAGLE-3 heads for SmolLM2: per-language acceptance before / after", "",
             f"`python benchmarks/head_before_after.py`: {len(seqs)} held-out sequences ({held.name}), greedy drafts "
             f"of k = 4 in float32 for the target {target_path.name}, tau = tokens per target forward "
             "(cinq/eval/spec_acceptance.py).", "",
             "| head | training prompts | prompt mix | training tokens | steps | draft vocabulary coverage* | tau | "
             + " | ".join(langs) + " | worst/best |",
             "|---|---:|---|---:|---:|---:|---:|" + "---:|" * len(langs) + "---:|"]
    for label, r in res.items():
        cov = "-" if r["draft_vocab_coverage"] is None else f"{r['draft_vocab_coverage']:.1%}"
        lines.append(f"| {label} ({r['run']}) | {r['train_prompts']} | {r['prompt_mix']} | {r['train_tokens']:,} | "
                     f"{r['steps']} | {cov} | "
                     f"{r['tau']:.3f} | " + " | ".join(f"{r['per_language'][x]:.3f}" for x in langs)
                     + f" | {spread[label]:.2f} |")
    lines += ["", "\\* the share of the tokens the target wrote in the held-out set that the head's draft vocabulary "
              "holds (an EAGLE-3 head drafts only those)", "", f"**{headline}**", ""]
    Path(args.out + ".md").write_text("\n".join(lines))
    Path(args.out + ".json").write_text(json.dumps({"kind": "head_before_after", "headline": headline,
                                                    "target": target_path.name, "held_out": held.name,
                                                    "sequences": len(seqs), "heads": res},
                                                   indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
