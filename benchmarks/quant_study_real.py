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


def _pair(a: ModelQuality, b: ModelQuality) -> str:
    """One comparison of row ``a`` against row ``b`` (same problems: a paired SE), computed."""
    d = delta(a, b)
    parts = []
    if d.ppl_pct is not None:
        parts.append(f"perplexity {a.perplexity:.2f} vs {b.perplexity:.2f} ({d.ppl_pct:+.2f}%)")
    if d.acc_pt is not None:
        parts.append(f"accuracy {d.acc_pt:+.1f} pt ± {d.acc_se_pt or 0:.1f} (paired SE)")
    if a.kl_vs_base is not None and b.kl_vs_base is not None:
        parts.append(f"KL to the baseline {a.kl_vs_base:.4f} vs {b.kl_vs_base:.4f} nats")
    if a.linear_bytes and b.linear_bytes:
        parts.append(f"decoder-linear bytes {a.linear_bytes / 2**20:.1f} vs {b.linear_bytes / 2**20:.1f} MiB")
    if a.decode_tokens_per_s and b.decode_tokens_per_s:
        parts.append(f"batch-1 decode {a.decode_tokens_per_s:.1f} vs {b.decode_tokens_per_s:.1f} tok/s "
                     f"({a.decode_tokens_per_s / b.decode_tokens_per_s:.2f}x)")
    return f"- **{a.label} vs {b.label}**: " + "; ".join(parts) + "."


def float_codes_answer(report: QualityReport) -> list[str]:
    """Markdown lines answering issue 31's two questions from the rows present: does NF4 beat int4 RTN at (about)
    equal bytes, and where does FP8 sit against int8 weight-only and W8A8 (SmoothQuant)?"""
    rows = {r.label: r for r in report.rows}
    base = report.rows[0]
    nf4 = [r for r in report.rows if r.label.startswith("nf4-")]
    fp8 = [r for r in report.rows if r.label.startswith("fp8-")]
    int4 = [r for r in report.rows if r.label.startswith("rtn-w4")]
    int8 = [rows[k] for k in ("rtn-w8-ch",) if k in rows]
    w8a8 = [r for r in report.rows if r.label.startswith("smoothquant-w8a8")]
    lines = ["## NF4 and FP8 against int4 / int8 / W8A8 (computed from the rows above)", ""]
    for a in nf4:
        lines += [_pair(a, b) for b in int4]
    for a in fp8:
        lines += [_pair(a, b) for b in int8 + w8a8]
    for a in nf4 + fp8 + int4 + int8 + w8a8:
        lines.append(_pair(a, base))
    return lines + [""]


def grid_check(dense: Path, variants: list[str]) -> list[str]:
    """Markdown lines: for each RTN variant, how much of the dense folder's weights its round trip leaves as they
    were, and the relative RMS change of the decoder linears. On a folder dequantized from a 4-bit file, this says
    whether a grid re-finds the file's own values (it would leave them all unchanged) or rounds them a second time."""
    import torch
    from safetensors import safe_open

    from cinq.quant.variants import parse_variants
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
    ap.add_argument("--float-codes", action="store_true", help="add the NF4 / FP8 comparison section (issue 31)")
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
    if args.float_codes:
        report.notes += [""] + float_codes_answer(report)
    if args.grid_check:
        report.notes += [""] + grid_check(Path(args.grid_check), args.grid_variants.split(";"))
    for path in report.save(Path(args.out), args.name):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
