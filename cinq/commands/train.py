"""`cinq train`: train a Llama-architecture model from scratch on a corpus built by `cinq data build`."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a model from scratch (cross-entropy)",
                              description="Plain PyTorch training: AdamW, warmup + cosine, grad clipping, bf16 "
                                          "autocast, resumable checkpoints (rerun the same command to resume).")
    p.add_argument("--data", default=None, help="corpus folder from `cinq data build` (required to train)")
    p.add_argument("--out", default=None, help="run folder (checkpoint, history, loss curve, model/)")
    p.add_argument("--measure", default=None, metavar="CONFIGS",
                   help="instead of training: measure tokens/s of these comma-separated shapes (bf16 vs fp32) "
                        "with --batch-size/--seq-len and write the table to --out PREFIX (.md/.json)")
    p.add_argument("--config", default="cinq-tiny",
                   help="preset (cinq-tiny, cinq-tiny-student, micro) or a config.json with the shape")
    p.add_argument("--init-from", default=None, metavar="MODEL",
                   help="continue training this model folder (or embedded name) instead of a new --config model: "
                        "an anneal; the tokenizer must be the model's")
    p.add_argument("--task", default=None, help="generated task mixed into the rows (arithmetic-easy, arithmetic)")
    p.add_argument("--task-fraction", type=float, default=0.0,
                   help="fraction of the rows drawn from --task (new problems, not the corpus's)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: DATA/tokenizer)")
    p.add_argument("--tokens", type=float, default=10e6, help="token budget (default 10M)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="warmup steps")
    p.add_argument("--decay-frac", type=float, default=1.0,
                   help="cosine decay over this last fraction of the steps, constant lr before (1: warmup + "
                        "cosine). With < 1 the --tokens budget may be changed on resume until the decay starts")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=200, help="validation loss every N steps")
    p.add_argument("--ckpt-every", type=float, default=300.0, help="checkpoint every N seconds")
    p.add_argument("--max-run-time", type=float, default=None,
                   help="stop with a checkpoint after N seconds (resume later with the same command)")
    add_threads_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="when finished: copy the model to DIR, evaluate it and write its model card")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    from cinq.train.pretrain import PretrainJob, pretrain

    apply_threads(args.threads)
    if args.measure:
        from cinq.train.sizing import sizing_table
        rows = sizing_table(args.measure.split(","), 8192, args.batch_size, args.seq_len, args.tokens, args.out)
        print(json.dumps(rows, indent=2))
        return 0
    if not args.data or not args.out:
        from cinq.errors import InvalidParameterError
        raise InvalidParameterError("--data and --out are required to train", "data")
    job = PretrainJob(
        data_dir=args.data, out_dir=args.out, config=args.config, tokenizer_dir=args.tokenizer,
        token_budget=int(args.tokens), batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        warmup_steps=args.warmup, decay_frac=args.decay_frac, weight_decay=args.weight_decay, seed=args.seed,
        eval_every=args.eval_every, init_from=args.init_from, task=args.task, task_fraction=args.task_fraction,
        ckpt_every_s=args.ckpt_every, max_run_s=args.max_run_time, progress=not args.no_progress)
    summary = pretrain(job)
    print(json.dumps(summary, indent=2))
    if not summary["finished"]:
        return 3
    if args.export:
        from pathlib import Path

        from cinq.train.model_card import DESCRIPTIONS, command_line, data_command, ship_run
        name = Path(args.export).name
        commands, continued_from = [data_command(args.data)], None
        if args.init_from:  # an anneal: the card keeps how the starting model was made
            from cinq.assets import resolve_model_path
            start = resolve_model_path(args.init_from, "init_from") / "training.json"
            if start.is_file():
                continued_from = json.loads(start.read_text())
                commands = [c for c in continued_from["commands"]]
        result = ship_run(args.out, args.export, args.data, name, DESCRIPTIONS.get(name, f"{name}, trained by cinq."),
                          [*commands, command_line()], continued_from=continued_from)
        print(json.dumps({"perplexity": result["perplexity"], "arithmetic": result["arithmetic"]["accuracy"]}))
    return 0
