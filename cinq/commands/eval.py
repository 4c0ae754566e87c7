"""`cinq eval MODEL [MODEL ...] --ppl FILE --tasks arithmetic`: perplexity and reasoning accuracy of model
folders in one table (deltas against the first), optionally saved as markdown/JSON/plot."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="perplexity + reasoning accuracy of model folders", description=__doc__)
    p.add_argument("models", nargs="*", help="model folders (first = baseline; default: the embedded model); "
                   "LABEL=FOLDER names a row")
    p.add_argument("--ppl", default=None, help="text file for perplexity")
    p.add_argument("--tasks", default="arithmetic",
                   help="reasoning task: arithmetic (the corpus level), arithmetic-easy, or none")
    p.add_argument("--n-problems", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--context-len", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bfloat16")
    add_threads_arg(p)
    p.add_argument("--out", default=None, help="folder for quality.md / quality.json / quality.png")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cinq.errors import InvalidParameterError
    from cinq.eval.quant_quality import quality_report

    apply_threads(args.threads)
    from cinq.eval.tasks import TASKS
    tasks = [t for t in args.tasks.split(",") if t and t != "none"]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise InvalidParameterError(f"--tasks: unknown task(s) {unknown}; available: {', '.join(TASKS)}", "tasks")
    if len(tasks) > 1:
        raise InvalidParameterError(f"--tasks: one task per report, got {len(tasks)} ({args.tasks})", "tasks")
    models: dict[str, str] = {}
    for item in args.models or []:
        label, _, folder = item.rpartition("=") if "=" in item else (Path(item).name, "", item)
        models[label or Path(folder).name] = folder
    if not models:
        from cinq.assets import default_model_path
        models = {"default": str(default_model_path())}
    ppl_text = ""
    if args.ppl is not None:
        if not Path(args.ppl).is_file():
            raise InvalidParameterError(f"--ppl: {args.ppl} is not a readable file", "ppl")
        ppl_text = Path(args.ppl).read_text(encoding="utf-8", errors="replace")
    report = quality_report(models, ppl_text, args.ppl or "", n_problems=args.n_problems if tasks else 0,
                            seed=args.seed, split=args.split, dtype=args.dtype, context_len=args.context_len,
                            max_new_tokens=args.max_new_tokens, task=tasks[0] if tasks else "arithmetic")
    print(report.to_markdown())
    if args.out:
        for path in report.save(args.out):
            print(f"wrote {path}")
    return 0
