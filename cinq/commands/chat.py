"""`cinq chat`: an interactive conversation, streamed token by token to the terminal.

The conversation outlives the context window. Before each turn the history is fitted to it (``ChatHistory.fit``):
the oldest turns are dropped, the system prompt kept, until the prompt leaves room for ``--max-tokens``; when
the latest message alone leaves less, the reply is clamped to what fits; a message that cannot fit at all is
not sent, and the session goes on. Each of these is told to the user on stderr.

Ctrl-C while a reply streams stops that reply (the request is aborted in the engine after the current step) and
keeps the session: the reply as far as it got stays in the history, so the next turn follows what the user saw
(a reply stopped before its first token is dropped with the message that asked for it). Ctrl-C at the prompt
only reminds how to quit; a second one in a row quits. The engine is the offline ``LLM``'s (``OfflineEngine``, its
core in its own process by default, engine/protocol.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cinq.engine.protocol import OfflineEngine

Message = dict[str, str]


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    from cinq.commands.sampling_args import add_sampling_args
    p = sub.add_parser("chat", help="interactive chat, streamed to the terminal",
                       description="Chat with a model using its chat template. /exit, an empty line or Ctrl-D "
                                   "quits; /reset clears the conversation; Ctrl-C stops the current reply (kept "
                                   "in the history as far as it got). When the history outgrows the context, "
                                   "the oldest turns are dropped (the system prompt stays).")
    add_engine_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(p, max_tokens=256)
    p.set_defaults(run=run)


@dataclass(slots=True)
class Fitted:
    """One turn's request: the prompt, the reply's token budget, and what fitting cost."""

    prompt_ids: list[int]
    max_tokens: int
    dropped_turns: int = 0
    clamped: bool = False  # the reply got less than asked
    too_long: bool = False  # the new message leaves no room at all: not sent (prompt_ids: it alone)


@dataclass(slots=True)
class ChatHistory:
    """The conversation: an optional system message, then user / assistant turns."""

    system: str | None = None
    turns: list[Message] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def reset(self) -> None:
        self.turns.clear()

    def fit(self, encode: Callable[[list[Message]], list[int]], capacity: int, max_tokens: int | None) -> Fitted:
        """Make the history (its last message the user's new one) fit ``capacity`` tokens with a reply of
        ``max_tokens`` (None: whatever room is left), dropping the oldest turns, then clamping the reply.
        When the new message (with the system prompt) leaves no room for even one token, the history is left
        untouched and the result says ``too_long``."""
        head = self.messages[:1] if self.system else []
        alone = encode(head + self.turns[-1:])
        if len(alone) >= capacity:
            return Fitted(alone, 0, too_long=True)
        want = max_tokens if max_tokens is not None else 1
        dropped = 0
        prompt = encode(self.messages)
        while capacity - len(prompt) < want and len(self.turns) > 1:
            # Drop one whole turn: the oldest user message and the replies up to the next user message (chat
            # templates expect a conversation to open with a user message).
            del self.turns[0]
            while len(self.turns) > 1 and self.turns[0]["role"] != "user":
                del self.turns[0]
            dropped += 1
            prompt = encode(self.messages)
        room = capacity - len(prompt)
        reply = room if max_tokens is None else min(max_tokens, room)
        return Fitted(prompt, reply, dropped, clamped=max_tokens is not None and reply < max_tokens)


HELP = "/exit or Ctrl-D quits (an empty line too), /reset clears the conversation, Ctrl-C stops the current reply"
QUIT_COMMANDS = ("/exit", "/quit")


def _notice(text: str) -> None:
    print(f"cinq chat: {text}", file=sys.stderr, flush=True)


def context_capacity(engine: OfflineEngine) -> int:
    """Tokens one request may hold in total: the context length, or the whole KV cache when that is smaller."""
    return min(engine.max_model_len, engine.num_blocks * engine.config.block_size)


def run(args: argparse.Namespace) -> int:
    from cinq.commands.engine_args import engine_config_from_args
    from cinq.engine.protocol import make_llm_engine

    engine = make_llm_engine(engine_config_from_args(args))
    try:
        return _chat(args, engine)
    finally:
        engine.shutdown()  # a core process, tensor-parallel workers


def _chat(args: argparse.Namespace, engine: OfflineEngine) -> int:
    from cinq.commands.interrupt import StepInterrupt
    from cinq.commands.sampling_args import sampling_params_from_args
    from cinq.errors import CinqError, InvalidParameterError
    from cinq.sampling_params import OutputKind

    params = sampling_params_from_args(args, n=1, output_kind=OutputKind.DELTA)
    tok = engine.tokenizer
    if not tok.chat_template:
        raise InvalidParameterError(f"{engine.config.model}: the tokenizer has no chat_template; use `cinq generate`",
                                    "model")
    capacity = context_capacity(engine)

    def encode(messages: list[Message]) -> list[int]:
        return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)

    history = ChatHistory(args.system)
    if args.system and len(encode(history.messages + [{"role": "user", "content": ""}])) >= capacity:
        raise InvalidParameterError(f"--system: the system prompt alone fills the {capacity}-token context",
                                    "system")
    interactive = sys.stdin.isatty()
    _notice(HELP)
    turn = 0
    interrupted_at_prompt = False
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:  # often a Ctrl-C meant for a reply that had just ended: the session stays
            print()
            if interrupted_at_prompt:
                return 130
            interrupted_at_prompt = True
            _notice("(/exit or Ctrl-D quits; Ctrl-C again quits too)")
            continue
        interrupted_at_prompt = False
        if not line or not line.strip() or line.strip() in QUIT_COMMANDS:
            return 0
        if line.strip() == "/reset":
            history.reset()
            _notice("conversation cleared")
            continue
        history.turns.append({"role": "user", "content": line.rstrip("\n")})
        try:
            fitted = history.fit(encode, capacity, params.max_tokens)
        except CinqError as e:  # e.g. the chat template rejects the conversation
            history.turns.pop()
            _notice(f"error: {e}; message not sent")
            continue
        if fitted.too_long:
            history.turns.pop()
            _notice(f"message not sent: it takes {len(fitted.prompt_ids)} tokens with the chat template"
                    f"{' and the system prompt' if args.system else ''}, and the context holds {capacity} "
                    f"(the reply needs at least 1); send a shorter one")
            continue
        if fitted.dropped_turns:
            _notice(f"context full ({capacity} tokens): dropped the {fitted.dropped_turns} oldest turn(s)"
                    f"{', kept the system prompt' if args.system else ''}")
        if fitted.clamped:
            _notice(f"reply limited to {fitted.max_tokens} tokens (--max-tokens {params.max_tokens}) to fit the "
                    f"{capacity}-token context")
        turn_params = params.clone(max_tokens=fitted.max_tokens, min_tokens=min(params.min_tokens, fitted.max_tokens))
        rid = f"chat-{turn}"
        turn += 1
        with StepInterrupt() as stop:  # from the add on: a Ctrl-C right after Enter stops this reply only
            try:
                engine.add_request(rid, fitted.prompt_ids, turn_params)
            except CinqError as e:  # anything the fitting could not foresee: this message only, not the session
                history.turns.pop()
                _notice(f"error: {e}; message not sent")
                continue
            print("assistant> ", end="", flush=True)
            reply = []
            try:
                while engine.has_unfinished_requests() and not stop.requested:
                    for out in engine.step():
                        for c in out.outputs:
                            print(c.text, end="", flush=True)
                            reply.append(c.text)
            except KeyboardInterrupt:  # a second Ctrl-C inside a step: the engine cannot be trusted to go on
                print()
                _notice("interrupted inside an engine step; quitting")
                return 130
        print()
        if stop.requested and engine.has_unfinished_requests():
            engine.abort_request(rid)  # frees its KV blocks before the next turn
            if not "".join(reply):
                history.turns.pop()
                _notice("reply stopped before it began; your message was dropped from the conversation")
                continue
            _notice("reply stopped; it stays in the conversation as far as it got (/reset clears it)")
        history.turns.append({"role": "assistant", "content": "".join(reply)})
