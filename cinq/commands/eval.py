"""`cinq eval MODEL [MODEL ...] --ppl FILE --tasks arithmetic`: perplexity and reasoning accuracy (with standard
errors), KL / top-1 agreement to the first model, checkpoint bytes and batch-1 decode speed, one row per model
(deltas against the first), with findings: where perplexity stays flat while accuracy falls.

With --variants, the first MODEL is also quantized into every listed variant and each is evaluated: the
quantization study of arXiv 2505.11574 in one command, resumable (finished rows are cached in --out):

    cinq eval cinq-tiny --variants "rtn:8,4,3,2;gptq:8,4,3,2;awq:4;smoothquant:static,dynamic" \\
        --group-sizes channel,128,64,32 --calib data/corpus/train.jsonl --ppl data/corpus/test.jsonl \\
        --tasks arithmetic-easy --n-problems 300 --out runs/quant-study

Variant grammar: METHOD:ENTRY,...;METHOD:... where rtn/gptq/awq entries are bit widths (2, 3, 4, 8; "4/128"
pins a group size; "+act" GPTQ act-order, "+asym"/"+sym" the grid) and smoothquant entries are static /
dynamic. What a method cannot do (AWQ 8-bit, SmoothQuant 4-bit, ...) is listed as skipped in the report."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="perplexity + reasoning accuracy of models and their quantized variants",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="model folders or embedded model names (first = baseline and the "
                   "source of --variants; default: the embedded model); LABEL=MODEL names a row")
    p.add_argument("--variants", default=None,
                   help='quantized variants of the first model, e.g. "rtn:8,4,3,2;gptq:4;awq:4;smoothquant:static"')
    p.add_argument("--group-sizes", default="channel,128,64,32",
                   help="group sizes of the weight-only variants: channel and/or integers (default %(default)s)")
    p.add_argument("--calib", default=None, help="calibration text (.txt, or .jsonl text fields) for gptq / awq / "
                   "smoothquant variants")
    p.add_argument("--calib-chars", type=int, default=500_000, help="use at most this much of --calib")
    p.add_argument("--calib-samples", type=int, default=128, help="calibration windows")
    p.add_argument("--calib-seq-len", type=int, default=256, help="tokens per calibration window")
    p.add_argument("--calib-dtype", default="bfloat16", help="dtype of the calibration forwards (default "
                   "%(default)s; float32 is several times faster on CPUs without bf16 matrix units)")
    p.add_argument("--ppl", default=None, help="text file for perplexity and KL (.txt, or .jsonl text fields)")
    p.add_argument("--ppl-chars", type=int, default=60_000,
                   help="use at most this much of the --ppl text (0: all; the perplexity cost knob)")
    p.add_argument("--kl-tokens", type=int, default=4096, help="tokens of the --ppl text scored for KL / top-1")
    p.add_argument("--tasks", default="arithmetic",
                   help="task: arithmetic (word problems, the corpus level), arithmetic-easy, addsub-1digit "
                        "(few-shot single-digit sums and differences), capitals (few-shot country -> capital), "
                        "or none")
    p.add_argument("--n-problems", type=int, default=100, help="problems per row (the accuracy cost knob)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--context-len", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--decode-tokens", type=int, default=64, help="batch-1 decode timing: new tokens (0: skip)")
    p.add_argument("--decode-repeats", type=int, default=3, help="batch-1 decode timing: runs (median)")
    p.add_argument("--flat-ppl", type=float, default=3.0,
                   help="findings: |Δ perplexity| percent that counts as flat (default %(default)s)")
    p.add_argument("--z", type=float, default=2.0,
                   help="findings: an accuracy fall counts when beyond this many SEs of the paired difference")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dequantize-kernels", action="store_true",
                   help="dequantize weight-only quantized layers once at load (same function, dense speed: the CPU "
                        "int4/int8 kernels are slow on many rows with float32 activations); the batch-1 speed "
                        "column is then the dense one")
    add_threads_arg(p)
    p.add_argument("--out", default=None, help="folder for quality.md / quality.json / quality.png, the cached rows "
                   "and the quantized variants (required with --variants)")
    p.add_argument("--keep-variants", action="store_true", help="keep the quantized folders in OUT/variants")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)


def _models(items: list[str]) -> dict[str, str]:
    from pathlib import Path

    from cinq.assets import resolve_model_path
    models: dict[str, str] = {}
    for item in items:
        label, _, name = item.partition("=") if "=" in item and not Path(item).exists() else ("", "", item)
        path = resolve_model_path(name, field="model")
        models[label or Path(name).name] = str(path)
    return models


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from cinq.errors import InvalidParameterError
    from cinq.eval.quant_quality import EvalSettings
    from cinq.eval.task_set import ALL_TASKS
    from cinq.eval.texts import read_text

    apply_threads(args.threads)
    tasks = [t for t in args.tasks.split(",") if t and t != "none"]
    unknown = sorted(set(tasks) - set(ALL_TASKS))
    if unknown:
        raise InvalidParameterError(f"--tasks: unknown task(s) {unknown}; available: {', '.join(ALL_TASKS)}",
                                    "tasks")
    if len(tasks) > 1:
        raise InvalidParameterError(f"--tasks: one task per report, got {len(tasks)} ({args.tasks})", "tasks")
    for name in ("n_problems", "ppl_chars", "kl_tokens", "decode_tokens", "calib_chars"):
        if getattr(args, name) < 0:
            raise InvalidParameterError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}", name)
    models = _models(args.models or [])
    if not models:
        from cinq.assets import default_model_path
        models = {"default": str(default_model_path())}
    ppl_text, ppl_source = "", ""
    if args.ppl is not None:
        ppl_text = read_text(args.ppl, args.ppl_chars or None, "ppl")
        how = "documents sampled across the file" if Path(args.ppl).suffix == ".jsonl" else "its first characters"
        ppl_source = f"{args.ppl} ({len(ppl_text):,} characters: {how})" if args.ppl_chars else str(args.ppl)
    settings = EvalSettings(tasks[0] if tasks else "arithmetic", args.n_problems if tasks else 0, args.seed,
                            args.split, args.dtype, args.context_len, args.max_new_tokens, args.kl_tokens,
                            args.decode_tokens, args.decode_repeats, args.dequantize_kernels)
    if args.variants is None and args.out is None:
        from cinq.eval.quant_quality import quality_report
        report = quality_report(models, ppl_text, ppl_source, n_problems=settings.n_problems, seed=args.seed,
                                split=args.split, dtype=args.dtype, context_len=args.context_len,
                                max_new_tokens=args.max_new_tokens, task=settings.task,
                                decode_tokens=args.decode_tokens)
        report.flat_ppl_pct, report.z = args.flat_ppl, args.z
        print(report.to_markdown())
        return 0
    if args.out is None:
        raise InvalidParameterError("--variants needs --out DIR (the quantized variants and cached rows go there)",
                                    "out")
    from cinq.eval.quant_study import StudyConfig, run_study
    from cinq.quant.variants import parse_group_sizes, parse_variants
    specs, skipped = parse_variants(args.variants, parse_group_sizes(args.group_sizes)) if args.variants else ([], [])
    (base_label, base), *rest = models.items()
    cfg = StudyConfig(Path(base), Path(args.out), specs, {k: Path(v) for k, v in rest}, settings, ppl_text,
                      ppl_source, read_text(args.calib, args.calib_chars or None, "calib") if args.calib else None,
                      args.calib_samples, args.calib_seq_len, args.seed, args.calib_dtype, skipped,
                      args.keep_variants, base_label=base_label,
                      title=f"Quantization quality: {base_label} ({Path(base)}), {settings.task}",
                      flat_ppl_pct=args.flat_ppl, z=args.z)
    report = run_study(cfg, progress=None if args.no_progress else sys.stderr)
    print(report.to_markdown())
    for suffix in ("md", "json", "png"):
        if (Path(args.out) / f"quality.{suffix}").is_file():
            print(f"wrote {Path(args.out) / f'quality.{suffix}'}")
    return 0
