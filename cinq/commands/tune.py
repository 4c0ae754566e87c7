"""`cinq tune [MODEL] --workload FILE --tpot-p99-ms X [--min-accuracy A | --max-kl Y]`: search quantization,
speculation, KV budget, token budget and max sequences for the cheapest configuration that meets the SLO
(pruned by `cinq plan`, decided by short measured runs); writes the table behind the choice and a config file
that `cinq serve --config` accepts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    from cinq.commands.flag_errors import parser_flags
    from cinq.commands.json_arg import json_object
    from cinq.tune.search import TuneOptions
    from cinq.tune.space import SearchSpace
    d, s = TuneOptions(), SearchSpace()
    p = sub.add_parser("tune", help="cheapest serving configuration that meets an SLO",
                       description="Search quantization, speculative decoding, KV budget, token budget and max "
                                   "sequences; prune with cinq plan, decide by short measured runs; write the "
                                   "table and a config file for cinq serve --config.")
    add_engine_args(p)
    g = p.add_argument_group("workload and SLO")
    g.add_argument("--workload", default=d.workload,
                   help="JSONL requests ({\"prompt\": ..., \"max_tokens\": N} a line) or mixed:N (default %(default)s)")
    g.add_argument("--request-rate", type=float, default=d.request_rate,
                   help="req/s (Poisson) the latency SLO is asked at (default %(default)s)")
    g.add_argument("--tpot-p99-ms", type=float, default=None, help="time per output token, p99 bound (ms)")
    g.add_argument("--ttft-p99-ms", type=float, default=None, help="time to first token, p99 bound (ms)")
    g.add_argument("--min-accuracy", type=float, default=None, help="arithmetic accuracy floor, 0..1")
    g.add_argument("--max-kl", type=float, default=None, help="mean KL to the bf16 dense model, upper bound")
    g.add_argument("--price-per-hour", type=float, default=d.price_per_hour, help="$/h (default %(default)s)")
    sp = p.add_argument_group("search space")
    sp.add_argument("--quant", default=";".join(s.quants),
                    help="weights: none or cinq eval --variants entries, ';'-separated (default %(default)s)")
    sp.add_argument("--spec-k", default=",".join(map(str, s.spec_ks)),
                    help="drafts per step, 0 = no speculation (default %(default)s)")
    sp.add_argument("--spec-method", default=d.speculative_method, help="speculative method (default %(default)s)")
    sp.add_argument("--spec-model", default=d.speculative_model,
                    help="its draft model or heads (default %(default)s; '' for none, e.g. ngram)")
    sp.add_argument("--spec-extra", type=json_object, default={},
                    help="further speculative_config fields as JSON, e.g. '{\"prompt_lookup_max\": 3}' for ngram")
    sp.add_argument("--max-num-seqs-values", default=",".join(map(str, s.max_num_seqs)),
                    help="max running sequences to try (default %(default)s)")
    sp.add_argument("--max-num-batched-tokens-values", default=",".join(map(str, s.max_num_batched_tokens)),
                    help="token budgets to try (default %(default)s)")
    sp.add_argument("--kv-tokens", default="auto", help="KV budgets in tokens, or auto (default %(default)s)")
    sp.add_argument("--plan-device", default=d.device, help="cinq plan device for pruning (default %(default)s)")
    sp.add_argument("--max-trials", type=int, default=d.max_trials,
                    help="candidates measured, cheapest roofline first (default %(default)s)")
    sp.add_argument("--num-problems", type=int, default=d.quality.n_problems,
                    help="arithmetic problems per weights + speculation pair (default %(default)s)")
    sp.add_argument("--ppl-tokens", type=int, default=d.quality.ppl_tokens,
                    help="held-out tokens for the KL (default %(default)s)")
    sp.add_argument("--variants-dir", default=None, help="where quantized folders go (default: the cinq cache)")
    p.add_argument("--out", default="cinq-tune", metavar="PREFIX",
                   help="write PREFIX.md, PREFIX.json and PREFIX.config.json (default %(default)s)")
    p.set_defaults(run=run, flags=parser_flags(p))


# TuneOptions' fields whose flag is not spelled as the field: for errors in the flags' words
_RENAMED = {"quants": "--quant", "variants": "--quant", "spec_ks": "--spec-k",
            "max_num_seqs": "--max-num-seqs-values", "max_num_batched_tokens": "--max-num-batched-tokens-values",
            "n_problems": "--num-problems", "speculative_method": "--spec-method",
            "speculative_model": "--spec-model", "speculative_extra": "--spec-extra", "device": "--plan-device"}


def run(args: argparse.Namespace) -> int:
    from cinq.bench.report import print_report, write_report
    from cinq.bench.served_quality import QualitySettings
    from cinq.commands.engine_args import engine_config_from_args
    from cinq.commands.flag_errors import naming_flags
    from cinq.tune.report import config_file_text, options_dict, tune_result
    from cinq.tune.search import SLO, TuneOptions, run_tune
    from cinq.tune.space import SearchSpace, parse_list
    space = SearchSpace(tuple(q.strip() for q in args.quant.split(";") if q.strip()),
                        parse_list(args.spec_k, "spec_k"), parse_list(args.max_num_seqs_values, "max_num_seqs_values"),
                        parse_list(args.max_num_batched_tokens_values, "max_num_batched_tokens_values"),
                        parse_list(args.kv_tokens, "kv_tokens", auto=True))
    seed = args.seed if args.seed is not None else 0
    opts = TuneOptions(space, SLO(args.tpot_p99_ms, args.ttft_p99_ms, args.min_accuracy, args.max_kl),
                       args.workload, args.request_rate, args.price_per_hour, args.plan_device, args.spec_method,
                       args.spec_model or None, args.spec_extra, args.max_trials,
                       QualitySettings(ppl_tokens=args.ppl_tokens, n_problems=args.num_problems, seed=seed),
                       args.variants_dir, seed)
    # the options' checks, before the engine starts: named by the flags typed, not by TuneOptions' fields
    # (cinq.quant.variants says "--variants", cinq eval's name for what `cinq tune` calls --quant)
    with naming_flags({**args.flags, **_RENAMED}):
        opts.validate()
    config = engine_config_from_args(args)
    data = run_tune(config, opts, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    result = tune_result(data, options_dict(opts), config.model)
    print_report(result)
    paths = write_report(result, args.out)
    if data["chosen"] is not None:
        where = Path(args.out).with_name(Path(args.out).name + ".config.json")
        where.write_text(config_file_text(data["chosen"]["engine_config"], where))
        paths.append(where)
        print(f"serve it: cinq serve --config {where}", flush=True)
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0 if data["chosen"] is not None else 1
