"""The prefix-caching workloads (issue 17), cut from a shipped text with the model's tokenizer:

* shared prefix: one long system prompt / few-shot block shared by every request, each request adding its own
  short question (all queued at once);
* chat replay: recorded multi-turn conversations replayed turn by turn; turn t of every conversation is sent once
  turn t-1 has finished, its prompt the whole history so far (user messages and the recorded assistant replies,
  so that caching on and off see the same prompts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cinq.bench.workload import BenchRequest, TokenWindows
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds


@dataclass(slots=True)
class PrefixWorkloadOptions:
    """Sizes of the two workloads (tokens of the model's tokenizer)."""

    prefix_len: int = bounded(1024, ge=1)
    num_requests: int = bounded(64, ge=1)
    suffix_len: int = bounded(32, ge=1)
    num_conversations: int = bounded(8, ge=1)
    num_turns: int = bounded(4, ge=1)
    turn_len: int = bounded(64, ge=1)
    reply_len: int = bounded(32, ge=1)
    output_len: int = bounded(32, ge=1)

    def validate(self, max_model_len: int) -> None:
        """Every size >= 1, and both workloads' longest prompt plus its output within ``max_model_len``."""
        check_bounds(self)
        shared = self.prefix_len + self.suffix_len + self.output_len
        if shared > max_model_len:
            raise InvalidParameterError(f"prefix_len + suffix_len + output_len = {shared} exceeds max_model_len "
                                        f"{max_model_len}", "prefix_len")
        chat = self.num_turns * self.turn_len + (self.num_turns - 1) * self.reply_len + self.output_len
        if chat > max_model_len:
            raise InvalidParameterError(f"the last chat turn needs {chat} tokens (num_turns x turn_len + replies + "
                                        f"output_len), more than max_model_len {max_model_len}", "num_turns")


@dataclass(slots=True)
class PrefixWorkload:
    """The shared-prefix requests (sent together) and the chat replay's rounds (sent one round at a time)."""

    shared: list[BenchRequest] = field(default_factory=list)
    chat_rounds: list[list[BenchRequest]] = field(default_factory=list)
    warmup: list[BenchRequest] = field(default_factory=list)  # other text, sent before measuring

    def rounds(self, name: str) -> list[list[BenchRequest]]:
        """The workload ``name`` ("shared_prefix" or "chat_replay") as rounds of requests sent together."""
        return [self.shared] if name == "shared_prefix" else self.chat_rounds


WORKLOADS = ("shared_prefix", "chat_replay")


def build_prefix_workload(tokens: list[int], opts: PrefixWorkloadOptions, seed: int = 0) -> PrefixWorkload:
    """Both workloads from consecutive pieces of ``tokens`` (``seed`` picks where in the text they start)."""
    text = TokenWindows(tokens, start=seed * 7919)
    work = PrefixWorkload()
    prefix = text.take(opts.prefix_len)
    work.shared = [BenchRequest(prefix + text.take(opts.suffix_len), opts.output_len)
                   for _ in range(opts.num_requests)]
    histories: list[list[int]] = [[] for _ in range(opts.num_conversations)]
    for _ in range(opts.num_turns):
        turn = []
        for history in histories:
            history += text.take(opts.turn_len)
            turn.append(BenchRequest(list(history), opts.output_len))
            history += text.take(opts.reply_len)  # the recorded reply, the next turn's context
        work.chat_rounds.append(turn)
    work.warmup = [BenchRequest(text.take(opts.suffix_len + opts.turn_len), 4) for _ in range(2)]
    return work


def footprint_blocks(rounds: list[list[BenchRequest]], block_size: int) -> int:
    """KV blocks that hold every distinct full block of the workload's tokens at once (shared blocks counted
    once) plus each request's partial tail: the cache size past which nothing needs evicting."""
    seen: set[tuple[int, ...]] = set()
    tails = 0
    for round_ in rounds:
        for r in round_:
            tokens = r.prompt + [-1] * r.output_len  # generated tokens: one's own, never shared
            full = len(tokens) // block_size
            for i in range(1, full + 1):
                key = tuple(tokens[:i * block_size]) if i * block_size <= len(r.prompt) else (id(r), i)
                seen.add(key)  # type: ignore[arg-type]
            tails += 1 if len(tokens) % block_size else 0
    return len(seen) + tails


def min_blocks(rounds: list[list[BenchRequest]], block_size: int) -> int:
    """The fewest KV blocks that run the workload at all: its longest request alone."""
    return max(-(-(len(r.prompt) + r.output_len) // block_size) for round_ in rounds for r in round_)
