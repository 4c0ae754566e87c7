"""`cinq generate`: complete prompts offline with the batched engine."""

from __future__ import annotations

import argparse
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    from cinq.commands.sampling_args import add_sampling_args
    p = sub.add_parser("generate", help="complete prompts (batched, offline)",
                       description="Complete one or more prompts with the batched engine and print the results.")
    add_engine_args(p)
    p.add_argument("-p", "--prompt", action="append", default=None,
                   help="prompt text (repeatable; default: read prompts from stdin, one per line, or a demo prompt)")
    p.add_argument("--prompt-file", default=None, help="file with one prompt per line")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    add_sampling_args(p, max_tokens=64)
    p.set_defaults(run=run)


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt:
        return args.prompt
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    if not sys.stdin.isatty():
        lines = [line.rstrip("\n") for line in sys.stdin if line.strip()]
        if lines:
            return lines
    return ["Once upon a time"]


def run(args: argparse.Namespace) -> int:
    import json

    from cinq.commands.engine_args import engine_config_from_args
    from cinq.commands.sampling_args import sampling_params_from_args
    from cinq.engine.llm import LLM

    config = engine_config_from_args(args)
    params = sampling_params_from_args(args)
    prompts = _prompts(args)
    llm = LLM(config.model, **{k: getattr(config, k) for k in config.field_names() if k != "model"})
    t0 = time.perf_counter()
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    else:
        outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    ntok = 0
    for prompt, out in zip(prompts, outs):
        for c in out.outputs:
            ntok += len(c.token_ids)
            if args.json:
                print(json.dumps({"prompt": prompt, "index": c.index, "text": c.text,
                                  "num_tokens": len(c.token_ids), "finish_reason": c.finish_reason},
                                 ensure_ascii=False))
            else:
                print(f"--- prompt: {prompt!r}" + (f" [{c.index}]" if len(out.outputs) > 1 else ""))
                print(prompt + c.text if not args.chat else c.text)
                print(f"--- ({len(c.token_ids)} tokens, finish_reason={c.finish_reason})")
    print(f"{len(prompts)} prompt(s), {ntok} tokens in {elapsed:.2f}s ({ntok / max(elapsed, 1e-9):.1f} tok/s) "
          f"on {config.model}", file=sys.stderr)
    return 0
