"""`cinq chat`: an interactive conversation, streamed token by token to the terminal."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    from cinq.commands.sampling_args import add_sampling_args
    p = sub.add_parser("chat", help="interactive chat, streamed to the terminal",
                       description="Chat with a model using its chat template. Empty line or Ctrl-D quits; "
                                   "'/reset' clears the conversation.")
    add_engine_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(p, max_tokens=256)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from cinq.commands.engine_args import engine_config_from_args
    from cinq.commands.sampling_args import sampling_params_from_args
    from cinq.engine.engine import LLMEngine
    from cinq.sampling_params import OutputKind

    engine = LLMEngine(engine_config_from_args(args))
    params = sampling_params_from_args(args, n=1, output_kind=OutputKind.DELTA)
    history: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    turn = 0
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or not line.strip():
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        prompt = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(history), add_special_tokens=False)
        rid = f"chat-{turn}"
        turn += 1
        engine.add_request(rid, prompt, params)
        print("assistant> ", end="", flush=True)
        reply = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                for c in out.outputs:
                    print(c.text, end="", flush=True)
                    reply.append(c.text)
        print()
        history.append({"role": "assistant", "content": "".join(reply)})
