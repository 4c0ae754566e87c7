"""`cinq data build --out DIR`: the multilingual training corpus from Debian packages, plus synthetic
arithmetic reasoning data, a BPE tokenizer, token files and a manifest."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="build the training corpus and tokenizer",
                              description="Build cinq's corpus from Debian packages (fortunes*, sword-text-*, "
                                          "Python's standard library) and synthetic arithmetic problems.")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build corpus + tokenizer + token files into --out")
    b.add_argument("--out", required=True, help="output folder (e.g. data/corpus)")
    b.add_argument("--install", action="store_true", help="apt-get install missing Debian packages (root)")
    b.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary size (default 8192)")
    b.add_argument("--tokenizer", default=None, help="reuse this tokenizer folder instead of training one")
    b.add_argument("--arithmetic-train", type=int, default=10_000, help="synthetic training problems")
    b.add_argument("--arithmetic-easy-train", type=int, default=30_000,
                   help="synthetic easy-level training problems (the arithmetic-easy task's level)")
    b.add_argument("--arithmetic-eval", type=int, default=300, help="problems in validation and in test")
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(run=run)
    s = sub.add_parser("check", help="say which Debian packages are missing and how to install them")
    s.set_defaults(run=run)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cinq.train.sources import debian_sources, install_hint, install_packages, missing_packages

    sources = debian_sources()
    missing = missing_packages(sources)
    if args.data_command == "check" or (missing and not getattr(args, "install", False)):
        if missing:
            print(f"missing Debian packages: {' '.join(missing)}")
            print(f"install them with:  {install_hint(missing)}   (or rerun with --install)")
            return 1
        print("all corpus packages are installed")
        return 0
    if missing:
        print(f"installing {' '.join(missing)}")
        install_packages(missing)

    from cinq.train.build import build_dataset
    from cinq.train.corpus import CorpusSettings

    settings = CorpusSettings(arithmetic_train=args.arithmetic_train,
                              arithmetic_easy_train=args.arithmetic_easy_train, arithmetic_eval=args.arithmetic_eval,
                              seed=args.seed)
    manifest = build_dataset(sources, args.out, settings, args.vocab_size, args.tokenizer)
    print(f"{'language':10} {'train bytes':>12} {'train tokens':>13} {'test tokens':>12}")
    for lang, e in manifest["languages"].items():
        print(f"{lang:10} {e['bytes']['train']:>12,} {e['tokens']['train']:>13,} {e['tokens']['test']:>12,}")
    print(f"manifest: {Path(args.out) / 'manifest.json'}  sha256(train.jsonl)={manifest['sha256']['train'][:16]}")
    return 0
