"""`cinq bench KIND [MODEL] [engine flags] [benchmark flags]`: every benchmark of the repository (as vLLM's
``vllm bench throughput | latency | serve``), with exactly the engine's flags. Each kind measures its baseline in
the same run, prints a table with the baseline row and the ratio, and writes ``--out PREFIX``.json / .md / .png;
progress goes to stderr. The implementations live in ``cinq/bench/``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cinq.errors import InvalidParameterError

if TYPE_CHECKING:
    from cinq.bench.report import BenchResult
    from cinq.config import EngineConfig

KINDS: dict[str, str] = {
    "throughput": "offline throughput vs HF transformers generate (same requests)",
    "latency": "batch-1 time to first token and per-token latency vs HF transformers generate (and llama.cpp)",
    "serve": "OpenAI server under Poisson load (TTFT, TPOT, ITL) vs the offline engine",
    "prefix": "prefix caching on vs off: shared-prefix and chat-replay workloads, eviction sweep (it runs caching "
              "both ways whatever --no-prefix-caching says, and the sweep sets --num-kv-blocks)",
    "spec": "speculative decoding (--speculative-config, required) vs plain decoding",
    "stack": "every technique stacked, one row each (HF -> paged + continuous batching -> prefix caching -> flash "
             "attention -> int4 GPTQ -> EAGLE -> distilled student) on a mixed workload: speed, memory, quality, cost",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.flag_errors import parser_flags
    p = sub.add_parser("bench", help="benchmarks: " + " | ".join(KINDS),
                       description="Run a benchmark with the engine's own flags; each measures its baseline in the "
                                   "same run and writes --out PREFIX.json/.md/.png.")
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND")
    for kind, help_text in KINDS.items():
        q = kinds.add_parser(kind, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        _add_common(q)
        _FLAGS[kind](q)
        q.set_defaults(flags={**parser_flags(q), **_RENAMED.get(kind, {})})
    p.set_defaults(run=run, bench_kind=None)


# Each benchmark's option fields whose flag is not spelled as the field (the others' are): the options name their
# fields in errors ("num_requests must be an integer >= 1"), the user typed the flag.
_RENAMED: dict[str, dict[str, str]] = {
    "throughput": {"num_requests": "--num-prompts", "input_lens": "--input-len", "output_lens": "--output-len"},
    "prefix": {"num_requests": "--num-prompts"},
    "spec": {"prompt_len": "--input-len", "max_tokens": "--output-len"},
    "stack": {"num_requests": "--num-prompts", "n_problems": "--num-problems",
              "speculative_config": "--stack-speculative-config"},
}


def _add_common(q: argparse.ArgumentParser) -> None:
    from cinq.commands.engine_args import add_engine_args
    add_engine_args(q)
    b = q.add_argument_group("benchmark")
    b.add_argument("--out", default=None, metavar="PREFIX",
                   help="write PREFIX.json, PREFIX.md and PREFIX.png (default: cinq-bench-KIND in the current folder)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def _add_throughput(q: argparse.ArgumentParser) -> None:
    b = q.add_argument_group("throughput")
    b.add_argument("--num-prompts", type=int, default=128, help="requests, all queued at once (default %(default)s)")
    b.add_argument("--input-len", default="32-512", help="prompt tokens: N or LO-HI, uniform (default %(default)s)")
    b.add_argument("--output-len", default="32-256", help="output tokens: N or LO-HI, uniform (default %(default)s)")
    b.add_argument("--hf-batch-sizes", default="8,16,32,64",
                   help="batch sizes transformers is probed at; its best runs the whole workload (default %(default)s)")
    b.add_argument("--hf-probe-requests", type=int, default=32, help="requests per probe (default %(default)s)")
    b.add_argument("--decode-tokens", type=int, default=256,
                   help="batch-1 decode length for the roofline comparison (default %(default)s)")
    b.add_argument("--variants", default="",
                   help="cinq precisions, comma-separated, each a run of the same requests: file (a GGUF model's "
                        "own file), bf16, int8, int4 (as cinq bench latency); default: the engine as configured")
    b.add_argument("--no-baseline", action="store_true", help="skip the transformers baseline")


def _add_latency(q: argparse.ArgumentParser) -> None:
    b = q.add_argument_group("latency")
    b.add_argument("--input-lens", default="128,1024", help="prompt lengths to measure (default %(default)s)")
    b.add_argument("--output-len", type=int, default=128, help="new tokens per request (default %(default)s)")
    b.add_argument("--num-iters", type=int, default=3,
                   help="requests per prompt length, engine and round (default %(default)s)")
    b.add_argument("--rounds", type=int, default=1,
                   help="interleaved rounds after a warm-up round, engine order rotated each (default %(default)s)")
    b.add_argument("--baselines", default="hf",
                   help="comma-separated: hf (transformers generate), llama.cpp (the same weights as GGUF, needs "
                        "llama-cpp-python; paired with --variants) (default %(default)s)")
    b.add_argument("--variants", default="",
                   help="cinq precisions, comma-separated: bf16,int8,int4 (RTN int8 / GPTQ int4 copies, cached); "
                        "default: the engine as configured (bf16 with the llama.cpp baseline)")
    b.add_argument("--threads-list", default="",
                   help="torch and llama.cpp threads to sweep, comma-separated (default: as configured)")
    b.add_argument("--no-baseline", action="store_true", help="no baseline at all (same as --baselines '')")


def _add_serve(q: argparse.ArgumentParser) -> None:
    b = q.add_argument_group("serve")
    b.add_argument("--request-rates", default="2,8,32,inf",
                   help="request rates (req/s), comma-separated; inf = all at once (default %(default)s)")
    b.add_argument("--num-prompts", type=int, default=64, help="requests per rate (default %(default)s)")
    b.add_argument("--input-len", type=int, default=128,
                   help="mean prompt tokens, uniform in [N/2, 3N/2] (default %(default)s)")
    b.add_argument("--output-len", type=int, default=64,
                   help="mean output tokens, uniform in [N/2, 3N/2] (default %(default)s)")
    b.add_argument("--base-url", default=None, help="measure this running server instead of starting cinq serve")
    b.add_argument("--served-model-name", default=None, help="'model' field of the requests (with --base-url)")
    b.add_argument("--tag", default="default-model", help="name of the run in the report (default %(default)s)")
    b.add_argument("--no-baseline", action="store_true", help="skip the offline-engine baseline")
    b.add_argument("--engine-core", default="process", choices=("process", "inproc"),
                   help="the server's engine core: its own process (cinq serve's default) or the server's "
                        "(default %(default)s)")
    b.add_argument("--no-hop", action="store_true",
                   help="skip measuring the process hop's latency (one request of one token, core in process vs "
                        "in-process; two more engine starts)")


# `cinq bench prefix`'s sizes: flag -> (PrefixWorkloadOptions field, help); each default is the field's.
_PREFIX_SIZES = {
    "--prefix-len": ("prefix_len", "shared prefix tokens"),
    "--num-prompts": ("num_requests", "requests sharing the prefix"),
    "--suffix-len": ("suffix_len", "each request's own tokens after the prefix"),
    "--num-conversations": ("num_conversations", "chat replay: conversations"),
    "--num-turns": ("num_turns", "chat replay: turns each"),
    "--turn-len": ("turn_len", "chat replay: user message tokens per turn"),
    "--reply-len": ("reply_len", "chat replay: recorded reply tokens per turn"),
    "--output-len": ("output_len", "tokens every request generates"),
}


def _add_prefix(q: argparse.ArgumentParser) -> None:
    from cinq.bench.prefix_workload import PrefixWorkloadOptions
    d = PrefixWorkloadOptions()
    b = q.add_argument_group("prefix")
    for flag, (name, help_text) in _PREFIX_SIZES.items():
        b.add_argument(flag, type=int, default=getattr(d, name), help=f"{help_text} (default %(default)s)")
    b.add_argument("--kv-fractions", default="1,0.5,0.25,0.125",
                   help="eviction sweep: num_kv_blocks as fractions of each workload's footprint (default "
                        "%(default)s)")
    b.add_argument("--text", default="held-out",
                   help="text the prompts are cut from: held-out, calibration or a file (default %(default)s)")


def _add_spec(q: argparse.ArgumentParser) -> None:
    b = q.add_argument_group("spec")
    b.add_argument("--batch-sizes", default="1,4,16", help="requests decoding together (default %(default)s)")
    b.add_argument("--num-prompts", type=int, default=16, help="prompts (default %(default)s)")
    b.add_argument("--input-len", type=int, default=64, help="prompt tokens (default %(default)s)")
    b.add_argument("--output-len", type=int, default=64, help="new tokens per request (default %(default)s)")
    b.add_argument("--text", default="held-out",
                   help="text the prompts are cut from: held-out, calibration or a file (default %(default)s)")


def _add_stack(q: argparse.ArgumentParser) -> None:
    from cinq.bench.mixed_workload import MixedOptions
    from cinq.bench.served_quality import QualitySettings
    from cinq.bench.stack import StackOptions
    from cinq.commands.json_arg import json_object_or_null
    d, w, qs = StackOptions(), MixedOptions(), QualitySettings()
    b = q.add_argument_group("stack")
    b.add_argument("--num-prompts", type=int, default=w.num_requests,
                   help="requests of the mixed chat / code / arithmetic workload (default %(default)s)")
    b.add_argument("--output-len", default=f"{w.output_len[0]}-{w.output_len[1]}",
                   help="output tokens: N or LO-HI, uniform (default %(default)s)")
    b.add_argument("--request-rate", type=float, default=d.request_rate,
                   help="the fixed request rate (req/s, Poisson) measured besides rate = inf (default %(default)s)")
    b.add_argument("--price-per-hour", type=float, default=d.price_per_hour,
                   help="machine price in $/h for the cost column (default %(default)s)")
    b.add_argument("--quant", default=d.quant, help="the quantized weights row, as cinq eval --variants names one "
                                                    "(default %(default)s)")
    b.add_argument("--student", default=d.student, help="the distilled student (default %(default)s; '' skips)")
    b.add_argument("--stack-speculative-config", type=json_object_or_null, default=d.speculative_config,
                   help="the speculation row's config (default %(default)s; 'null' skips the row)")
    b.add_argument("--flash-backend", default=None, help="attention backend of the flash row (default: triton on "
                                                         "CUDA, flash-torch elsewhere)")
    b.add_argument("--hf-batch-size", type=int, default=d.hf_batch_size,
                   help="transformers' static batch size (default %(default)s)")
    b.add_argument("--ppl-tokens", type=int, default=qs.ppl_tokens,
                   help="held-out tokens scored for perplexity and KL (default %(default)s)")
    b.add_argument("--num-problems", type=int, default=qs.n_problems,
                   help="arithmetic test problems per row (default %(default)s; 0: none)")
    b.add_argument("--variants-dir", default=None, help="where quantized folders are kept (default: the cinq cache)")
    b.add_argument("--no-baseline", action="store_true", help="skip the transformers row")


_FLAGS = {"throughput": _add_throughput, "latency": _add_latency, "serve": _add_serve, "prefix": _add_prefix,
          "spec": _add_spec, "stack": _add_stack}


def run(args: argparse.Namespace) -> int:
    from cinq.bench.report import print_report, write_report
    kind = args.bench_kind
    if kind is None:
        raise InvalidParameterError(f"give a benchmark: cinq bench {{{','.join(KINDS)}}} (--help for each)", "kind")
    from cinq.commands.engine_args import engine_config_from_args
    from cinq.commands.flag_errors import naming_flags
    config = engine_config_from_args(args)
    with naming_flags(args.flags):  # the options' checks run inside each benchmark
        result = _RUNNERS[kind](config, args, not args.no_progress)
    print_report(result)
    paths = write_report(result, args.out or f"cinq-bench-{kind}")
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0


def _seed(args: argparse.Namespace) -> int:
    return args.seed if args.seed is not None else 0  # the workload's seed: --seed, else a fixed one


def _run_throughput(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.throughput import ThroughputOptions, run_throughput
    opts = ThroughputOptions(num_requests=args.num_prompts, input_lens=_range(args.input_len, "input_len"),
                             output_lens=_range(args.output_len, "output_len"), seed=_seed(args),
                             baseline=not args.no_baseline,
                             hf_batch_sizes=tuple(_ints(args.hf_batch_sizes, "hf_batch_sizes")),
                             hf_probe_requests=args.hf_probe_requests, decode_tokens=args.decode_tokens,
                             variants=_names(args.variants))
    return run_throughput(config, opts, progress)


def _run_latency(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.latency import LatencyOptions, run_latency
    opts = LatencyOptions(input_lens=tuple(_ints(args.input_lens, "input_lens")), output_len=args.output_len,
                          num_iters=args.num_iters, seed=_seed(args), rounds=args.rounds,
                          baselines=() if args.no_baseline else _names(args.baselines),
                          variants=_names(args.variants),
                          threads_list=tuple(_ints(args.threads_list, "threads_list")) if args.threads_list else ())
    return run_latency(config, opts, progress)


def _run_serve(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.serve import ServeOptions, run_serve
    opts = ServeOptions(request_rates=tuple(_floats(args.request_rates, "request_rates")),
                        num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                        seed=_seed(args), baseline=not args.no_baseline, base_url=args.base_url,
                        served_model_name=args.served_model_name, tag=args.tag, engine_core=args.engine_core,
                        hop=not args.no_hop,
                        command="cinq " + " ".join(sys.argv[1:]))
    return run_serve(config, opts, progress)


def _run_prefix(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.prefix import PrefixOptions, run_prefix
    from cinq.bench.prefix_workload import PrefixWorkloadOptions
    work = PrefixWorkloadOptions(**{name: getattr(args, flag[2:].replace("-", "_"))
                                    for flag, (name, _) in _PREFIX_SIZES.items()})
    opts = PrefixOptions(work, text=args.text, kv_fractions=tuple(_floats(args.kv_fractions, "kv_fractions")),
                         seed=_seed(args))
    return run_prefix(config, opts, progress)


def _run_spec(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.spec import SpecOptions, run_spec
    opts = SpecOptions(batch_sizes=tuple(_ints(args.batch_sizes, "batch_sizes")), num_prompts=args.num_prompts,
                       prompt_len=args.input_len, max_tokens=args.output_len, text=args.text, seed=_seed(args))
    return run_spec(config, opts, progress)


def _run_stack(config: EngineConfig, args: argparse.Namespace, progress: bool) -> BenchResult:
    from cinq.bench.mixed_workload import MixedOptions
    from cinq.bench.served_quality import QualitySettings
    from cinq.bench.stack import StackOptions, run_stack
    opts = StackOptions(MixedOptions(num_requests=args.num_prompts, output_len=_range(args.output_len, "output_len"),
                                     seed=_seed(args)),
                        request_rate=args.request_rate,
                        quality=QualitySettings(ppl_tokens=args.ppl_tokens, n_problems=args.num_problems,
                                                seed=_seed(args)),
                        price_per_hour=args.price_per_hour, hf_batch_size=args.hf_batch_size,
                        flash_backend=args.flash_backend, quant=args.quant,
                        speculative_config=args.stack_speculative_config, student=args.student,
                        variants_dir=args.variants_dir, baseline=not args.no_baseline)
    return run_stack(config, opts, progress)


_RUNNERS = {"throughput": _run_throughput, "latency": _run_latency, "serve": _run_serve, "prefix": _run_prefix,
            "spec": _run_spec, "stack": _run_stack}


def _numbers(text: str, name: str, cast: type, what: str) -> list:
    """A comma-separated list parsed by ``cast``, or one line naming the flag."""
    try:
        return [cast(v) for v in text.split(",")]
    except ValueError:
        raise InvalidParameterError(f"--{name.replace('_', '-')} must be comma-separated {what}, got {text!r}",
                                    name) from None


def _ints(text: str, name: str) -> list[int]:
    return _numbers(text, name, int, "integers")


def _floats(text: str, name: str) -> list[float]:
    """``inf`` allowed (a request rate)."""
    return _numbers(text, name, float, "numbers")


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (blank: none)."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _range(text: str, name: str) -> tuple[int, int]:
    """``N`` or ``LO-HI`` as an inclusive (lo, hi)."""
    parts = text.split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not 1 <= lo <= hi:
        raise InvalidParameterError(f"--{name.replace('_', '-')} must be N or LO-HI with 1 <= LO <= HI, got "
                                    f"{text!r}", name)
    return lo, hi
