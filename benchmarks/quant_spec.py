"""Interaction table: quantized target x speculation (benchmarks/quant_spec_study.py does the measuring).

Targets: the embedded cinq-tiny of this checkout (bf16) and its int8 RTN (per channel), int4 RTN / GPTQ / AWQ
(groups of 128) and W8A8 SmoothQuant (dynamic) copies, made here from the shipped calibration text
(cinq/quant/variant_folder.py, kept in --variants-dir). Heads: the shipped cinq-tiny-eagle (trained on the bf16
target) on every target, plus the heads given with --retrained VARIANT=HEAD_FOLDER: the one for ``bf16`` is the
reduced-budget control, measured on every target too; any other is measured on its own target. The retrained
heads come from `cinq distill --heads eagle --target <variant folder>` with one reduced budget, e.g.

    cinq distill --heads eagle --target <folder> --data data/corpus --out runs/head-X --tokens 2.5e5 \\
        --train-prompts 600 --eval-prompts 66 --sample-temperature 0 --batch-size 16 --warmup 20 --lr 3e-3 \\
        --eval-every 50 --threads 1 --no-progress

    python benchmarks/quant_spec.py --retrained bf16=runs/head-bf16/head \\
        --retrained gptq:4/128=runs/head-gptq/head --retrained smoothquant:dynamic=runs/head-w8a8/head
    python benchmarks/quant_spec.py --quick        # smoke run (two targets, few tokens), writes nothing

Writes benchmarks/results/interactions_quant_spec.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def head(folder: Path, name: str, trained_on: str) -> Any:
    """A head folder with its budget as its own config records it (tokens seen, training sequences)."""
    from benchmarks.quant_spec_study import Head
    training = json.loads((folder / "config.json").read_text()).get("cinq_spec", {}).get("training", {})
    seqs = training.get("train_data", {}).get("sequences")
    budget = f"{training.get('tokens_seen', 0) / 1e3:.0f}k tokens, {seqs} sequences" if training else "unknown"
    return Head(name, folder, trained_on, budget)


def teacher_identity(folder: Path) -> dict[str, str]:
    """What the table measured: the teacher's weight hash, its head fingerprint and the checkout's commit."""
    from cinq.cache import content_hash
    from cinq.spec.head_folder import TargetFingerprint
    from cinq.train.distill import load_teacher
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"teacher": f"{folder.name} of commit {commit}", "teacher_sha256": content_hash(folder)[:16],
            "teacher_head_fingerprint": TargetFingerprint.of(load_teacher(folder)).fingerprint}


def main() -> int:
    from cinq.process_env import set_omp_wait_policy
    set_omp_wait_policy()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants-dir", default=str(ROOT / ".cache" / "bench" / "variants"))
    ap.add_argument("--retrained", action="append", default=[], metavar="VARIANT=HEAD",
                    help="a head retrained on a target (VARIANT: bf16 or an entry such as gptq:4/128)")
    ap.add_argument("--batches", default="1", help="comma list of batch sizes")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--offline-prompts", type=int, default=32,
                    help="held-out tau offline on this many prompts (0: off)")
    ap.add_argument("--no-fixed-k", action="store_true", help="adaptive k only (no fixed-k tau runs)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reading", default=None, help="the reading paragraph to keep with the results")
    ap.add_argument("--rerender", default=None, metavar="JSON",
                    help="rebuild the report from an earlier run's JSON (with --reading: add it) instead of measuring")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "interactions_quant_spec"))
    args = ap.parse_args()
    from cinq.assets import resolve_model_path
    from benchmarks.quant_spec_study import DENSE, TARGETS, QuantSpecOptions, quant_spec_result, run_quant_spec
    from cinq.bench.report import print_report, write_report
    from cinq.errors import InvalidParameterError
    from cinq.quant.variants import one_variant
    from cinq.quant.variant_folder import variant_folder
    if args.rerender:  # the measurements as they were, the reading added or replaced
        data = {k: v for k, v in json.loads(Path(args.rerender).read_text()).items()
                if k not in ("kind", "title", "headline")}
        result = quant_spec_result({**data, "reading": args.reading or data.get("reading")})
        print_report(result)
        for path in write_report(result, args.out):
            print("wrote", path)
        return 0
    src = resolve_model_path("cinq-tiny")
    names = {entry or DENSE: label for label, entry in TARGETS}
    chosen = TARGETS[:2] if args.quick else TARGETS
    targets = {label: src if entry is None else variant_folder(src, one_variant(entry), args.variants_dir)
               for label, entry in chosen}
    retrained = {}
    for item in args.retrained:
        entry, sep, folder = item.partition("=")
        if not sep or entry not in names:
            raise InvalidParameterError(f"--retrained {item!r}: expected VARIANT=HEAD_FOLDER with VARIANT one of "
                                        f"{list(names)}", "retrained")
        if names[entry] in targets:
            name = "bf16 control" if entry == DENSE else "retrained on target"
            retrained[names[entry]] = head(Path(folder), name, names[entry])
    general = [head(resolve_model_path("cinq-tiny-eagle"), "shipped", DENSE)]
    control = None
    if DENSE in retrained:  # the reduced-budget control: trained on bf16, measured everywhere
        general.append(retrained.pop(DENSE))
        control = general[-1].name
    options = QuantSpecOptions(batch_sizes=tuple(int(b) for b in args.batches.split(",")),
                               num_prompts=2 if args.quick else args.num_prompts,
                               max_tokens=8 if args.quick else args.max_tokens, fixed_k=not args.no_fixed_k,
                               offline_prompts=4 if args.quick else args.offline_prompts,
                               num_threads=args.threads, extra=teacher_identity(src))
    result = run_quant_spec(targets, general, retrained, options, control)
    if args.reading:
        result = quant_spec_result({**result.data, "reading": args.reading})
    print_report(result)
    if not args.quick:
        for path in write_report(result, args.out):
            print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
