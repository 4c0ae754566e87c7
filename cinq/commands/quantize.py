"""`cinq quantize MODEL --method M --bits B --group-size G --calib FILE --out DIR`: make a quantized model
folder (GPTQ / AWQ / cinq-W8A8 / bitsandbytes NF4 / FP8 e4m3 files) on the CPU, one decoder block at a time, then print the quality report
(perplexity and arithmetic accuracy, float vs quantized)."""

from __future__ import annotations

import argparse

from cinq.commands.threads_arg import add_threads_arg, apply_threads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("quantize", help="quantize a model (RTN, GPTQ, AWQ, SmoothQuant, NF4, FP8) on the CPU",
                              description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="dense model folder or embedded model, e.g. cinq-tiny (default: the embedded model)")
    p.add_argument("--method", choices=["rtn", "gptq", "awq", "smoothquant", "nf4", "fp8"], default="gptq")
    p.add_argument("--bits", type=int, choices=[2, 3, 4, 8], default=None,
                   help="2, 3, 4 or 8 (SmoothQuant: 8; AWQ: 4; 2 and 3 bits are served dequantized to bf16)")
    p.add_argument("--group-size", type=int, default=None,
                   help="input channels per group; -1 = per channel (default 128; NF4: its block size, 64)")
    p.add_argument("--format", choices=["gptq", "gptq_v2", "awq", "w8a8", "bnb_nf4", "fp8", "compressed_tensors"],
                   default=None, help="file format (default: gptq for rtn/gptq, awq for awq, w8a8 for smoothquant, "
                   "bnb_nf4 for nf4; fp8: vLLM's fp8 for per-tensor scales with quantized activations, else "
                   "compressed_tensors)")
    p.add_argument("--double-quant", action="store_true", help="NF4: store the block absmax in 8 bits "
                   "(bnb_4bit_use_double_quant)")
    p.add_argument("--weight-strategy", choices=["tensor", "channel"], default="tensor",
                   help="FP8 weight scales: one per tensor or per output channel")
    p.add_argument("--asym", action="store_true", help="asymmetric grid (zero points); AWQ default")
    p.add_argument("--sym", action="store_true", help="symmetric grid (GPTQ/RTN default)")
    p.add_argument("--desc-act", action="store_true", help="GPTQ act-order")
    p.add_argument("--static-groups", action="store_true", help="GPTQ: groups fixed before act-order")
    p.add_argument("--damp-percent", type=float, default=0.01)
    # Off by default: the head is quantized round-to-nearest, and on a real model with a tied embedding
    # (SmolLM2-135M, 49152 x 576) that more than doubles GPTQ g128's perplexity loss (+130% vs +56% without).
    # --no-lm-head, the default now, stays accepted for the scripts that passed it.
    p.add_argument("--lm-head", action=argparse.BooleanOptionalAction, default=False,
                   help="also quantize the LM head (round-to-nearest, GPTQ formats; config flag lm_head: true): "
                        "faster int4 decode (a bf16 head is the largest tensor a step streams) at a real quality "
                        "cost (SmolLM2-135M GPTQ g128: perplexity +130%% with it, +56%% without). Default: off")
    p.add_argument("--no-true-sequential", action="store_true")
    p.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant migration strength")
    p.add_argument("--act-scheme", choices=["dynamic", "static", "none"], default="dynamic",
                   help="W8A8 / FP8 activation scales (FP8 'none': weight-only)")
    p.add_argument("--calib", default=None, help="local text file for calibration (required except for rtn), or "
                   "'calibration' for the text shipped with cinq")
    p.add_argument("--calib-samples", type=int, default=128, help="calibration windows")
    p.add_argument("--calib-seq-len", type=int, default=256, help="tokens per calibration window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--ppl", default=None, help="held-out text for the report's perplexity "
                   "(default: the last 10%% of --calib, which calibration then does not use)")
    p.add_argument("--n-problems", type=int, default=50, help="arithmetic problems in the report (0: none)")
    p.add_argument("--no-eval", action="store_true", help="skip the quality report")
    p.add_argument("--eval-dtype", default="bfloat16")
    p.add_argument("--calib-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="dtype of the calibration forwards (statistics and quantization are float32)")
    add_threads_arg(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cinq.config import resolve_model
    args.model = resolve_model(args.model, "model")  # an embedded model's name is its folder; else one line

    from cinq.errors import InvalidParameterError
    from cinq.quant.calibration import calibration_windows
    from cinq.quant.config import QuantConfig

    import torch

    apply_threads(args.threads)
    needs_calib = args.method not in ("rtn", "nf4") and not (args.method == "fp8" and args.act_scheme != "static")
    if needs_calib and args.calib is None:
        raise InvalidParameterError(f"--calib FILE is required for {args.method}: calibration text must come from "
                                    f"a local file (cinq never downloads one)", "calib")
    sym = not args.asym if (args.asym or args.sym) else args.method != "awq"
    bits = args.bits or (8 if args.method == "smoothquant" else 4)
    bits = {"nf4": 4, "fp8": 8}.get(args.method, bits) if args.bits is None else bits
    group = args.group_size if args.group_size is not None else (64 if args.method == "nf4" else 128)
    cfg = QuantConfig(method=args.method, bits=bits, group_size=group, sym=sym, format=args.format,
                      desc_act=args.desc_act, static_groups=args.static_groups, damp_percent=args.damp_percent,
                      true_sequential=not args.no_true_sequential, smooth_alpha=args.alpha,
                      act_scheme=args.act_scheme, lm_head=args.lm_head, double_quant=args.double_quant,
                      weight_strategy=args.weight_strategy)
    calib_ids, heldout_text = None, None
    text = None
    if args.calib is not None:
        from cinq.assets.text import resolve_text_path
        path = resolve_text_path(args.calib)
        if not path.is_file():
            raise InvalidParameterError(f"--calib: {path} is not a readable file", "calib")
        text = path.read_text(encoding="utf-8", errors="replace")
        if args.ppl is None and not args.no_eval:
            cut = int(len(text) * 0.9)
            text, heldout_text = text[:cut], text[cut:]
    if text is not None and needs_calib:
        from cinq.model.tokenizer import Tokenizer
        tok = Tokenizer.from_pretrained(args.model)
        calib_ids = calibration_windows(tok.encode(text, add_special_tokens=False), args.calib_samples,
                                        args.calib_seq_len, args.seed)

    from cinq.quant.pipeline import quantize_model
    res = quantize_model(args.model, args.out, cfg, calib_ids, progress=not args.no_progress,
                         calib_dtype=getattr(torch, args.calib_dtype))
    head = ", LM head quantized" if cfg.lm_head else ""
    print(f"wrote {res.out_dir} ({cfg.method}, {cfg.format}, {cfg.bits}-bit, group {cfg.group_size}{head}): "
          f"{res.weight_bytes / 2**20:.1f} MiB of tensors, {res.seconds:.1f} s, peak RSS {res.peak_rss_mib:.0f} MiB, "
          f"{res.calib_tokens} calibration tokens")
    if args.no_eval:
        return 0
    from cinq.eval.quant_quality import quality_report
    ppl_text, source = "", ""
    if args.ppl is not None:
        ppl_text, source = Path(args.ppl).read_text(encoding="utf-8", errors="replace"), str(args.ppl)
    elif heldout_text:
        ppl_text, source = heldout_text, f"the last 10% of {args.calib} (held out of calibration)"
    report = quality_report({"float": args.model, cfg.method: args.out}, ppl_text, source,
                            n_problems=args.n_problems, dtype=args.eval_dtype)
    print(report.to_markdown())
    return 0
