"""Publish a finished (or partly finished) `cinq eval --variants` study of a real model into
benchmarks/results/<name>.{md,json,png}, through the study's own report writer (cinq.eval.quality_report).

The study itself runs with `cinq eval ... --out STUDY` (resumable, rows cached in STUDY/rows); this script reads
STUDY/quality.json, removes machine-specific paths, adds the commands and notes that say how the numbers were
made, and a section computed from the rows that answers the study's question: where does perplexity stay flat
while the task accuracy falls? Nothing in that section is typed by hand.

    python benchmarks/quant_study_real.py /tmp/study --name quant_study_smollm2 \\
        --title "Quantization study: SmolLM2-135M-Instruct" --command "cinq eval ..." --note "..."
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.eval.findings import HIDDEN, classify, delta  # noqa: E402
from cinq.eval.quality_report import ModelQuality, QualityReport  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def load_report(study: Path) -> QualityReport:
    """The study's report as its last run wrote it (STUDY/quality.json)."""
    data = json.loads((study / "quality.json").read_text())
    rows = [ModelQuality.from_dict(r) for r in data["rows"]]
    skipped = [(s["variant"], s["reason"]) for s in data.get("skipped", [])]
    return QualityReport(rows, data.get("ppl_source", ""), data.get("task", ""), skipped,
                         data.get("flat_ppl_pct", 3.0), data.get("z", 2.0))


def answer(report: QualityReport) -> list[str]:
    """Markdown lines, computed from the rows: each variant's perplexity change, its accuracy (and, for tasks with
    worked steps, step accuracy) change in SEs of the paired difference, and the verdict at the report's z (and at
    1 SE, as a weaker hint)."""
    base = report.rows[0]
    steps = base.step_accuracy is not None
    entries = []
    for r in report.rows[1:]:
        d = delta(r, base)
        if d.ppl_pct is None or d.acc_pt is None:
            continue
        zs = [x / se for x, se in ((d.acc_pt, d.acc_se_pt), (d.step_pt, d.step_se_pt)) if x is not None and se]
        entries.append((r.label, d, min(zs, default=0.0), classify(d, report.flat_ppl_pct, report.z)))
    lines = ["## Where does perplexity stay flat while accuracy falls? (computed from the rows above)", "",
             f"Flat = |Δppl| <= {report.flat_ppl_pct:g}% against {base.label}; a fall counts beyond "
             f"{report.z:g} SE of the paired difference (same problems). Sorted by the larger fall in SEs.", "",
             "| variant | Δppl | Δacc ± SE |" + (" Δstep ± SE |" if steps else "") + " fall / SE | verdict |",
             "|---|---|---|" + ("---|" if steps else "") + "---|---|"]
    for label, d, z, kind in sorted(entries, key=lambda e: e[2]):
        flat = abs(d.ppl_pct) <= report.flat_ppl_pct
        verdict = ("**flat perplexity, accuracy falls**" if kind == HIDDEN else
                   ("perplexity flat, no significant fall" + (" (beyond 1 SE)" if z < -1 else "")) if flat else
                   f"perplexity moves ({kind})")
        step = f" {d.step_pt:+.1f} pt ± {d.step_se_pt or 0:.1f} |" if steps and d.step_pt is not None else (
            " - |" if steps else "")
        lines.append(f"| {label} | {d.ppl_pct:+.2f}% | {d.acc_pt:+.1f} pt ± {d.acc_se_pt or 0:.1f} |{step} "
                     f"{z:+.2f} | {verdict} |")
    flat_entries = [e for e in entries if abs(e[1].ppl_pct) <= report.flat_ppl_pct]
    hidden = [e[0] for e in flat_entries if e[3] == HIDDEN]
    weak = [e[0] for e in flat_entries if e[3] != HIDDEN and e[2] < -1]
    lines += ["", (f"Answer: perplexity stays flat while {report.task} accuracy falls beyond {report.z:g} SE for "
                   f"{', '.join(hidden)}." if hidden else
                   f"Answer: no variant keeps perplexity flat while {report.task} accuracy falls beyond "
                   f"{report.z:g} SE ({len(flat_entries)} flat-perplexity variants, "
                   f"{len(entries) - len(flat_entries)} with perplexity moved).")
              + (f" Falls between 1 and {report.z:g} SE with flat perplexity (suggestive only, not significant): "
                 f"{', '.join(weak)}." if weak else "")]
    return lines


def grid_check(dense: Path, variants: list[str]) -> list[str]:
    """Markdown lines: for each RTN variant, how much of the dense folder's weights its round trip leaves as they
    were, and the relative RMS change of the decoder linears. On a folder dequantized from a 4-bit file, this says
    whether a grid re-finds the file's own values (it would leave them all unchanged) or rounds them a second time."""
    import torch
    from safetensors import safe_open

    from cinq.eval.variants import parse_variants
    from cinq.model.loader import checkpoint_files
    from cinq.quant.rtn import rtn_quantize
    lines = ["## RTN round trip of the dense weights (computed)", "",
             "| variant | weights unchanged (bf16) | relative RMS change |", "|---|---|---|"]
    for text in variants:
        (spec,), _ = parse_variants(text)
        qc = spec.quant_config()
        same = total = 0
        err = ref = 0.0
        for file in checkpoint_files(dense):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if not (name.startswith("model.layers.") and name.endswith("proj.weight")):
                        continue
                    w = f.get_tensor(name).float()
                    d = rtn_quantize(w, qc.bits, qc.group_size, qc.sym, qc.min_zero).dequantize(torch.float32)
                    same += int((d.to(torch.bfloat16) == w.to(torch.bfloat16)).sum())
                    total += w.numel()
                    err += float((d - w).pow(2).sum())
                    ref += float(w.pow(2).sum())
        lines.append(f"| {spec.label} | {same / total:.1%} | {(err / ref) ** 0.5:.4f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="the --out folder of the cinq eval study")
    ap.add_argument("--name", required=True, help="results file stem, e.g. quant_study_smollm2")
    ap.add_argument("--title", default="")
    ap.add_argument("--command", action="append", default=[], help="a command that made the rows (repeatable)")
    ap.add_argument("--note", action="append", default=[], help="a note paragraph (repeatable)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--grid-check", default=None, help="dense folder: add the RTN round-trip table of its weights")
    ap.add_argument("--grid-variants", default="rtn:4/32+asym;rtn:4/32;rtn:4/128;rtn:8/channel",
                    help="with --grid-check: the RTN variants, ';'-separated")
    args = ap.parse_args()
    study = Path(args.study).resolve()
    report = load_report(study)
    report.title = args.title
    for row in report.rows:  # no machine-specific paths in the committed results
        p = Path(row.path)
        if p.is_relative_to(study):
            row.path = f"<study>/{p.relative_to(study)}"
        elif "site-packages" in p.parts:
            row.path = f"<site-packages>/{'/'.join(p.parts[p.parts.index('site-packages') + 1:])}"
        else:
            row.path = f"<{p.name}>"
    report.notes = (["## How these rows were made", ""] + [f"    {c}" for c in args.command] + [""]
                    + [f"{n}\n" for n in args.note]
                    + [f"Load average when this file was written: {os.getloadavg()[0]:.2f}.", ""] + answer(report))
    if args.grid_check:
        report.notes += [""] + grid_check(Path(args.grid_check), args.grid_variants.split(";"))
    for path in report.save(Path(args.out), args.name):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
