"""`cinq plan MODEL --device H100-80GB`: memory, fit, roofline speed and $/1M tokens for serving a model on a
device, from arithmetic alone (no weights are read); `--calibrate` sets the roofline against cinq's measured
benchmark rows on this machine."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from cinq.errors import InvalidParameterError

if TYPE_CHECKING:
    from cinq.plan.devices import Device
    from cinq.plan.planner import Plan

# a field named in an error -> the flag that sets it
_FLAGS = {"max_model_len": "--max-model-len", "context_len": "--context-len", "concurrency": "--concurrency",
          "tensor_parallel_size": "--tensor-parallel-size", "gpu_memory_utilization": "--gpu-memory-utilization",
          "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
          "memory_gib": "--memory-gib", "bandwidth_gbs": "--bandwidth-gbs", "tflops": "--tflops",
          "price_per_hour": "--price-per-hour", "group_size": "--group-size", "dtype": "--dtype",
          "device": "--device", "model": "MODEL", "results_dir": "--results-dir", "measure": "--measure"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.plan.memory import PRECISIONS
    p = sub.add_parser("plan", help="memory, fit, roofline tokens/s and $/1M tokens of a model on a device",
                       description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="a known shape (Llama-3-8B, Llama-3-70B, Qwen2.5-7B, Mistral-7B, ...), a config.json, a "
                        "model folder or an embedded model (cinq-tiny)")
    p.add_argument("--device", default=None,
                   help="a device of the table (H100-80GB, H200, A100-80GB, A100-40GB, L4, A10G, RTX-4090, "
                        "EPYC-2vCPU, CPU; default H100-80GB), or none and all of --memory-gib/--bandwidth-gbs/--tflops")
    p.add_argument("--memory-gib", type=float, default=None, help="memory per card, GiB (overrides the table)")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="memory bandwidth per card, GB/s")
    p.add_argument("--tflops", type=float, default=None, help="dense bf16 TFLOP/s per card")
    p.add_argument("--price-per-hour", type=float, default=None,
                   help="$ per card-hour (the table's prices are illustrative defaults)")
    p.add_argument("--dtype", default=None, choices=list(PRECISIONS),
                   help="weight precision (default: the model's quantization_config, else bfloat16)")
    p.add_argument("--group-size", type=int, default=None,
                   help="int8/int4 input rows per scale (default: 128 for int4, -1 = per channel for int8)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length per sequence (default: the model's max_position_embeddings)")
    p.add_argument("--context-len", type=int, default=None,
                   help="context while decoding, and the prompt length of the prefill estimate (default: "
                        "--max-model-len, the worst case)")
    p.add_argument("--concurrency", type=int, default=64, help="sequences decoding at once (default %(default)s)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="cards to split the model over (default: the fewest that fit)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of each card's memory to use (vLLM's, default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens per step, sizes the activation estimate (default %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="cap on running sequences (default %(default)s)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    out.add_argument("--markdown", action="store_true", help="markdown tables")
    p.add_argument("--measure", action="store_true",
                   help="measure this machine's read bandwidth and bf16 FLOP/s and use them (CPU devices)")
    p.add_argument("--calibrate", action="store_true",
                   help="also show predicted vs measured tokens/s for cinq's benchmark rows on this machine")
    p.add_argument("--results-dir", default="benchmarks/results",
                   help="where the measured benchmark results are (default %(default)s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except InvalidParameterError as e:
        # say it with the flag the user typed: "--device: unknown device ...", not "device: ..."
        flag, message = _FLAGS.get(e.param or ""), str(e)
        if flag is None or message.startswith(flag):
            raise
        raise InvalidParameterError(f"{flag}: {message.removeprefix(f'{e.param}: ')}", e.param) from None


def _device(args: argparse.Namespace) -> Device:
    from cinq.plan.devices import custom_device, get_device
    figures = (args.memory_gib, args.bandwidth_gbs, args.tflops)
    base = get_device(args.device) if args.device is not None else (
        None if any(f is not None for f in figures) else get_device("H100-80GB"))
    device = custom_device(base, *figures, price_per_hour=args.price_per_hour)
    if args.measure:
        if not device.is_cpu and base is not None:
            raise InvalidParameterError(f"measures this machine's CPU; {device.name} is not a CPU device "
                                        f"(use --device EPYC-2vCPU or CPU)", "measure")
        from dataclasses import replace

        from cinq.plan.probe import measure
        m = measure()
        print(f"measured on this machine ({m.threads} threads): read bandwidth {m.bandwidth_gbs:.1f} GB/s, "
              f"bf16 matmul {m.tflops:.3f} TFLOP/s", file=sys.stderr)
        device = replace(device, bandwidth_gbs=m.bandwidth_gbs, tflops=m.tflops, is_cpu=True)
    return device


def _build_plan(args: argparse.Namespace, device: Device) -> Plan:
    from cinq.plan.memory import Precision
    from cinq.plan.planner import PlanSettings, build_plan
    from cinq.plan.shapes import resolve_shape
    shape = resolve_shape(args.model)
    cfg = shape.config
    if args.dtype is None and cfg.quantization_config:
        precision = Precision.from_quantization_config(cfg.quantization_config)
    else:
        precision = Precision.from_name(args.dtype or "bfloat16", args.group_size)
    max_model_len = cfg.max_position_embeddings if args.max_model_len is None else args.max_model_len
    settings = PlanSettings(max_model_len, args.concurrency, args.tensor_parallel_size, args.gpu_memory_utilization,
                            args.max_num_batched_tokens, args.max_num_seqs, args.context_len)
    return build_plan(shape, device, precision, settings)


def _calibration(args: argparse.Namespace, device: Device, plan: Plan | None) -> tuple[dict[str, Any], str]:
    """The calibration as JSON and as text; on a CPU device, the plan's own speeds through the fitted model."""
    from cinq.plan.calibration import calibrate, calibrated_tokens_per_s, calibration_dict, calibration_sections
    from cinq.plan.devices import get_device
    from cinq.plan.report import render_sections
    from cinq.plan.shapes import ModelShape
    cal = calibrate(device if device.is_cpu else get_device("EPYC-2vCPU"), args.results_dir)
    out = calibration_dict(cal)
    title, sections, notes = calibration_sections(cal)
    if plan is not None and device.is_cpu and plan.batch1 is not None and plan.at_concurrency is not None:
        shape = ModelShape(plan.model, plan.config)
        ctx = plan.settings.decode_context
        rows, speeds = [], {}
        for t in {t.batch: t for t in (plan.batch1, plan.at_concurrency)}.values():
            speeds[str(t.batch)] = calibrated_tokens_per_s(cal, shape, plan.precision, t.batch, ctx)
            rows.append([str(t.batch), f"{t.tokens_per_s:,.1f}", f"{speeds[str(t.batch)]:,.1f}"])
        out["plan_tokens_per_s"] = speeds
        sections.append((f"this plan, calibrated ({plan.model} at context {ctx})",
                         ["batch", "roofline tok/s", "calibrated tok/s"], rows))
    return out, render_sections(title, sections, notes, markdown=args.markdown)


def _run(args: argparse.Namespace) -> int:
    from cinq.plan.report import plan_dict, render_plan
    if args.model is None and not args.calibrate:
        raise InvalidParameterError("give a model (a known shape, a config.json or a folder) or --calibrate",
                                    "model")
    device = _device(args)
    plan = _build_plan(args, device) if args.model is not None else None
    result: dict[str, Any] = plan_dict(plan) if plan is not None else {}
    text = [render_plan(plan, markdown=args.markdown)] if plan is not None else []
    if args.calibrate:
        result["calibration"], table = _calibration(args, device, plan)
        text.append(table)
    if args.json:
        import json
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(text), end="")
    return 0
