"""`cinq distill`: distil a teacher into a student (losses: ce, fkl, rkl, gjsd, skl, srkl, tv, hidden_mse,
hidden_cos and weighted sums; regimes: offpolicy, seqkd, onpolicy, cot), optionally train the CE-only baseline
with the same budget and write the comparison table.

`cinq distill --heads eagle|eagle3|medusa --target T`: train speculative-decoding heads for the frozen target T
on sequences T writes itself (cinq/train/spec_heads.py); the head folder lands in ``<out>/head``, ``--export``
copies it with a model card."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("distill", help="knowledge distillation into a smaller model or speculative heads",
                              description="Distil --teacher into --student, or (--heads) train speculative-decoding "
                                          "heads for --target. Rerun the same command to resume.")
    p.add_argument("--teacher", default=None, help="teacher model folder or embedded model (e.g. cinq-tiny)")
    p.add_argument("--student", default="cinq-tiny-student",
                   help="student shape (preset or config.json) or a model folder to continue from")
    p.add_argument("--data", required=True, help="corpus folder from `cinq data build`; with --heads also 'chat': "
                                                 "language-balanced chat turns in the target's chat template")
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
                   help="when finished: copy the distilled model (or head folder) to DIR, evaluate it and write its "
                        "model card")
    h = p.add_argument_group("speculative heads (--heads)")
    h.add_argument("--heads", default=None, choices=["eagle", "eagle3", "medusa"],
                   help="train this kind of draft head for --target instead of distilling a student")
    h.add_argument("--target", default=None,
                   help="the served target the heads draft for (a model folder or embedded model, e.g. cinq-tiny)")
    h.add_argument("--train-prompts", type=int, default=1100,
                   help="corpus prompts the target continues for training data (see --prompt-mix)")
    h.add_argument("--prompt-mix", default="balanced", choices=["balanced", "natural", "english"],
                   help="training prompts: the same number per language (balanced), or as many in total in the "
                        "corpus train split's natural document proportions (natural; not for --data chat), or "
                        "all in English (english); held-out ones stay balanced")
    h.add_argument("--eval-prompts", type=int, default=110, help="held-out (test split) prompts for acceptance")
    h.add_argument("--max-prompt", type=int, default=24, help="prompt tokens at most")
    h.add_argument("--max-tokens", type=int, default=128, help="tokens the target writes per training prompt")
    h.add_argument("--eval-max-tokens", type=int, default=96, help="tokens the target writes per held-out prompt")
    h.add_argument("--generated", default=None, metavar="DIR",
                   help="folder caching the target's sequences (default: --out); runs sharing it generate once")
    h.add_argument("--unroll", type=int, default=3, help="eagle3: training-time-test steps")
    h.add_argument("--num-heads", type=int, default=4, help="medusa: heads (= draft tokens)")
    h.add_argument("--medusa-lm-head", default="own", choices=["own", "target"],
                   help="medusa: a trainable LM head per head (Medusa-1), or the target's, shared and frozen "
                        "(vLLM's original_lm_head: a far smaller folder)")
    h.add_argument("--feature-layers", default=None,
                   help="eagle3: comma-separated target states to fuse (default: low, middle, high)")
    h.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="eagle3: vLLM's EAGLE-3 layout with an LM head over the N tokens the target writes most "
                        "(0: cinq's earlier layout, drafting through the target's LM head)")
    h.add_argument("--feature-noise", type=float, default=0.1, help="eagle: uniform noise on input features")
    h.add_argument("--draft-k", type=int, default=4, help="draft length of the acceptance measurement")
    p.set_defaults(run=run)


def run_heads(args: argparse.Namespace) -> int:
    import json

    from cinq.train.spec_heads import HeadJob, train_heads

    if not args.target:
        from cinq.errors import InvalidParameterError
        raise InvalidParameterError("--heads needs --target (the model folder the heads draft for)", "target")
    layers = tuple(int(i) for i in args.feature_layers.split(",")) if args.feature_layers else None
    # the flags shared with student distillation (--tokens, --batch-size, --lr, --warmup, --seed,
    # --sample-temperature, --generator, --eval-every ...) keep their meaning and defaults
    job = HeadJob(
        method=args.heads, target=args.target, data_dir=args.data, out_dir=args.out, token_budget=int(args.tokens),
        batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup, seed=args.seed,
        train_prompts=args.train_prompts, prompt_mix=args.prompt_mix, eval_prompts=args.eval_prompts,
        max_prompt=args.max_prompt, max_tokens=args.max_tokens, eval_max_tokens=args.eval_max_tokens,
        sample_temperature=args.sample_temperature, generator=args.generator, generated_dir=args.generated,
        unroll_steps=args.unroll, draft_vocab_size=args.draft_vocab, num_heads=args.num_heads,
        medusa_lm_head=args.medusa_lm_head, feature_layers=layers,
        feature_noise=args.feature_noise, draft_k=args.draft_k, eval_every=args.eval_every,
        ckpt_every_s=args.ckpt_every, max_run_s=args.max_run_time, progress=not args.no_progress)
    summary = train_heads(job)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("job", "evals")}, indent=2))
    if not summary["finished"]:
        return 3
    if args.export:
        from cinq.train.model_card import command_line
        from cinq.train.spec_head_card import ship_head
        ship_head(args.out, args.export, head_data_commands(args.data, args.target) + [command_line()])
    return 0


def head_data_commands(data: str, target: str) -> list[str]:
    """The commands before ``cinq distill --heads`` that a head's card gives to reproduce its data: the corpus
    build (with how the target itself was made, when it is a shipped cinq model), or for the chat prompts the
    setup that installs the target (their text is in cinq/train/spec_head_prompts.py)."""
    import json
    from pathlib import Path

    from cinq.train.spec_head_prompts import is_chat_source
    if is_chat_source(data):
        return ["bash scripts/setup.sh"]
    from cinq.train.model_card import data_command
    commands = [data_command(data)]
    info = Path(target) / "training.json"
    if info.is_file():
        commands += json.loads(info.read_text()).get("commands", [])[1:]
    return commands


def model_folder(value: str | None, flag: str) -> str | None:
    """A model flag's value as a folder: an embedded model's name ("cinq-tiny") becomes its folder, a folder is
    kept as spelled (run folders record it to recognise a resumed job); anything else is one line naming
    ``flag``."""
    from cinq.config import resolve_model
    return None if value is None else resolve_model(value, flag)


def check_student(value: str) -> None:
    """--student is a shape (a preset, a config.json) or a model folder to continue from; refuse anything else
    before the teacher loads. (An embedded model's name is the preset of that shape, not its weights.)"""
    from pathlib import Path

    from cinq.errors import InvalidParameterError
    from cinq.train.presets import PRESETS
    if value not in PRESETS and not Path(value).is_file() and not (Path(value) / "config.json").is_file():
        raise InvalidParameterError(f"--student: {value!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor "
                                    f"a config.json nor a model folder", "student")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    if args.heads:
        args.target = model_folder(args.target, "--target")
    else:
        args.teacher = model_folder(args.teacher, "--teacher")
        check_student(args.student)

    from cinq.train.distill import DistillJob, distill
    from cinq.train.eval_runs import report_runs

    apply_threads(args.threads)
    if args.heads:
        return run_heads(args)
    if not args.teacher:
        from cinq.errors import InvalidParameterError
        raise InvalidParameterError("distill needs --teacher (or --heads with --target)", "teacher")
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
