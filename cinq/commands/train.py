"""`cinq train`: train a Llama-architecture model from scratch on a corpus built by `cinq data build`."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a model from scratch (cross-entropy)",
                              description="Plain PyTorch training: AdamW, warmup + cosine, grad clipping, bf16 "
                                          "autocast, resumable checkpoints (rerun the same command to resume).")
    p.add_argument("--data", required=True, help="corpus folder from `cinq data build`")
    p.add_argument("--out", required=True, help="run folder (checkpoint, history, loss curve, model/)")
    p.add_argument("--config", default="cinq-tiny",
                   help="preset (cinq-tiny, cinq-tiny-student, micro) or a config.json with the shape")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: DATA/tokenizer)")
    p.add_argument("--tokens", type=float, default=10e6, help="token budget (default 10M)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=200, help="validation loss every N steps")
    p.add_argument("--ckpt-every", type=float, default=300.0, help="checkpoint every N seconds")
    p.add_argument("--max-run-time", type=float, default=None,
                   help="stop with a checkpoint after N seconds (resume later with the same command)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from cinq.train.pretrain import PretrainJob, pretrain

    if args.threads:
        torch.set_num_threads(args.threads)
    job = PretrainJob(
        data_dir=args.data, out_dir=args.out, config=args.config, tokenizer_dir=args.tokenizer,
        token_budget=int(args.tokens), batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        warmup_steps=args.warmup, weight_decay=args.weight_decay, seed=args.seed, eval_every=args.eval_every,
        ckpt_every_s=args.ckpt_every, max_run_s=args.max_run_time, progress=not args.no_progress)
    summary = pretrain(job)
    print(json.dumps(summary, indent=2))
    return 0 if summary["finished"] else 3
