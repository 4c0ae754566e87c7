"""`cinq distill`: distil a teacher into a student (losses: ce, fkl, rkl, gjsd, skl, srkl, tv, hidden_mse,
hidden_cos and weighted sums; regimes: offpolicy, seqkd, onpolicy, cot), optionally train the CE-only baseline
with the same budget and write the comparison table."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("distill", help="knowledge distillation into a smaller model",
                              description="Distil --teacher into --student. Rerun the same command to resume.")
    p.add_argument("--teacher", required=True, help="teacher model folder (e.g. cinq/assets/cinq-tiny)")
    p.add_argument("--student", default="cinq-tiny-student",
                   help="student shape (preset or config.json) or a model folder to continue from")
    p.add_argument("--data", required=True, help="corpus folder from `cinq data build`")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--loss", default="fkl", help="weighted terms, e.g. fkl | gjsd | fkl=0.9,ce=0.1 | "
                                                  "skl=1,hidden_mse=0.5")
    p.add_argument("--regime", default="offpolicy", choices=["offpolicy", "seqkd", "onpolicy", "cot"])
    p.add_argument("--temperature", type=float, default=1.0, help="KD temperature T (KL terms are scaled by T^2)")
    p.add_argument("--beta", type=float, default=0.5, help="generalized JSD beta (0: forward KL, 1: reverse KL)")
    p.add_argument("--lam", type=float, default=0.1, help="skew KL lambda (DistiLLM)")
    p.add_argument("--hidden-layers", default="final", choices=["final", "all"], help="hidden-state matching")
    p.add_argument("--tokens", type=float, default=2e6, help="token budget")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--student-fraction", type=float, default=0.5, help="on-policy: GKD lambda")
    p.add_argument("--prompt-len", type=int, default=64, help="on-policy: prompt tokens")
    p.add_argument("--refresh-every", type=int, default=20, help="on-policy: steps per student snapshot")
    p.add_argument("--sample-temperature", type=float, default=1.0, help="seqkd / on-policy sampling temperature")
    p.add_argument("--seqkd-sequences", type=int, default=2000)
    p.add_argument("--seqkd-max-tokens", type=int, default=192)
    p.add_argument("--cot-problems", type=int, default=4000)
    p.add_argument("--cot-answer-weight", type=float, default=0.5)
    p.add_argument("--cot-rationales", default="teacher", choices=["teacher", "gold"])
    p.add_argument("--generator", default="engine", choices=["engine", "naive"],
                   help="engine: cinq's serving engine; naive: in-memory sampling without KV cache")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=float, default=300.0)
    p.add_argument("--max-run-time", type=float, default=None)
    add_threads_arg(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--name", default=None, help="this run's name in the report (default REGIME:LOSS)")
    p.add_argument("--baseline-ce", default=None, metavar="DIR",
                   help="also train the same student with cross-entropy only, same budget, into DIR")
    p.add_argument("--include", action="append", default=[], metavar="NAME=DIR",
                   help="add an already trained run to the report (repeatable)")
    p.add_argument("--report", default=None, metavar="PREFIX",
                   help="evaluate teacher and students, write PREFIX.md/.json/.png")
    p.add_argument("--arith-problems", type=int, default=300, help="held-out arithmetic problems in the report")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="when finished: copy the distilled model to DIR, evaluate it and write its model card")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json


    from cinq.train.distill import DistillJob, distill
    from cinq.train.eval_runs import report_runs

    apply_threads(args.threads)
    job = DistillJob(
        teacher=args.teacher, student=args.student, data_dir=args.data, out_dir=args.out, loss=args.loss,
        regime=args.regime, temperature=args.temperature, beta=args.beta, lam=args.lam,
        hidden_layers=args.hidden_layers, token_budget=int(args.tokens), batch_size=args.batch_size,
        seq_len=args.seq_len, lr=args.lr, warmup_steps=args.warmup, seed=args.seed,
        student_fraction=args.student_fraction, prompt_len=args.prompt_len, refresh_every=args.refresh_every,
        sample_temperature=args.sample_temperature, seqkd_sequences=args.seqkd_sequences,
        seqkd_max_tokens=args.seqkd_max_tokens, cot_problems=args.cot_problems,
        cot_answer_weight=args.cot_answer_weight, cot_rationales=args.cot_rationales, generator=args.generator,
        eval_every=args.eval_every, ckpt_every_s=args.ckpt_every, max_run_s=args.max_run_time,
        progress=not args.no_progress)
    summary = distill(job)
    print(json.dumps({k: v for k, v in summary.items() if k != "job"}, indent=2))
    if not summary["finished"]:
        return 3
    if args.export:
        from pathlib import Path

        from cinq.train.distill import load_teacher
        from cinq.train.model_card import DESCRIPTIONS, command_line, data_command, ship_run
        name = Path(args.export).name
        commands = [data_command(args.data)]
        teacher_info = Path(args.teacher) / "training.json"
        if teacher_info.is_file():  # how the teacher itself was made, when it is a shipped cinq model
            commands += json.loads(teacher_info.read_text()).get("commands", [])[1:]
        ship_run(args.out, args.export, args.data, name, DESCRIPTIONS.get(name, f"{name}, distilled by cinq."),
                 commands + [command_line()], teacher=load_teacher(args.teacher), n_arith=args.arith_problems)
    runs = {args.name or f"{args.regime}:{args.loss}": args.out}
    if args.baseline_ce:
        base = dataclasses.replace(job, out_dir=args.baseline_ce, loss="ce", regime="offpolicy")
        base_summary = distill(base)
        if not base_summary["finished"]:
            return 3
        runs["CE only"] = args.baseline_ce
    for item in args.include:
        name, _, path = item.rpartition("=")  # names may hold "=" (e.g. "b=0.5"), paths rarely do
        runs[name] = path
    if args.report:
        paths = report_runs(args.teacher, runs, args.data, args.report, n_arith=args.arith_problems)
        print("report:", " ".join(str(p) for p in paths))
    return 0
