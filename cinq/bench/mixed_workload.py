"""The mixed workload of ``cinq bench stack`` and ``cinq tune``: multilingual chat, code and arithmetic requests,
each kind behind its own shared prefix (a chat system message, a code-assistant instruction, a worked arithmetic
example), so that prefix caching has something to find, as it would in a served product.

Chat and code requests are records of the shipped held-out text (``cinq.assets.text``: fortunes and bible verses
in ten languages, Python standard-library source), told apart by a simple look at the record; arithmetic requests
are word problems of cinq's arithmetic task (validation split: the quality column scores the test split).
Everything is seeded: the same options give the same token ids for every configuration of one run."""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field
from typing import Any

from cinq.bench.report import model_label
from cinq.bench.workload import BenchRequest
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds

KINDS = ("chat", "code", "arithmetic")
_CODE = re.compile(r"^\s*(def |class |import |from \w+ import|return\b|raise\b|@\w)|^\s*\w+ = |__\w+__", re.M)
CHAT_SYSTEM = ("You are a friendly assistant who answers in the language of the question. Keep answers short, "
               "quote sources when you can, and say so when you do not know.")
CODE_PREFIX = ("# You are a careful Python reviewer. Continue the following standard-library code in the same "
               "style, keeping names and indentation.\n")


@dataclass(slots=True)
class MixedOptions:
    """How many requests, their mix (shares of chat / code / arithmetic) and their output lengths."""

    num_requests: int = bounded(48, ge=1)
    shares: tuple[float, float, float] = (0.5, 0.25, 0.25)
    output_len: tuple[int, int] = (16, 48)  # uniform, inclusive
    max_record_tokens: int = bounded(96, ge=1)  # a chat / code record is cut to this many tokens
    # a prompt is cut to this many (a model's context: the prefix is kept)
    max_prompt_tokens: int | None = bounded(None, ge=1)
    seed: int = 0

    def validate(self) -> None:
        check_bounds(self)
        if len(self.shares) != len(KINDS) or min(self.shares) < 0 or sum(self.shares) <= 0:
            raise InvalidParameterError(f"shares must be {len(KINDS)} non-negative numbers with a positive sum, "
                                        f"got {list(self.shares)}", "shares")
        lo, hi = self.output_len
        if not 1 <= lo <= hi:
            raise InvalidParameterError(f"output_len must satisfy 1 <= low <= high, got [{lo}, {hi}]", "output_len")

    def to_dict(self) -> dict[str, Any]:
        return {"num_requests": self.num_requests, "shares": list(self.shares), "output_len": list(self.output_len),
                "max_record_tokens": self.max_record_tokens, "seed": self.seed}


@dataclass(slots=True)
class MixedWorkload:
    """The requests (in arrival order) and the kind of each."""

    requests: list[BenchRequest]
    kinds: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: self.kinds.count(k) for k in KINDS}

    def summary(self) -> dict[str, Any]:
        """What the workload holds, for a result's JSON: requests by kind, prompt and output tokens."""
        return {"counts": self.counts(), "prompt_tokens": sum(len(r.prompt) for r in self.requests),
                "output_tokens": sum(r.output_len for r in self.requests)}

    def prefix_tokens_shared(self) -> int:
        """Prompt tokens that an earlier request of the same kind already had at the same positions (what an
        ideal prefix cache could skip)."""
        shared = 0
        seen: dict[str, list[int]] = {}
        for req, kind in zip(self.requests, self.kinds):
            if kind in seen:
                first = seen[kind]
                n = 0
                while n < min(len(first), len(req.prompt)) and first[n] == req.prompt[n]:
                    n += 1
                shared += n
            else:
                seen[kind] = req.prompt
        return shared


def run_head(config: Any, options: Any, work: MixedWorkload) -> dict[str, Any]:
    """The head of the JSON every benchmark over a mixed workload writes: the engine config, the options (the
    workload through its ``to_dict``, the variants folder without this machine's path) and the workload."""
    return {"config": {"model": model_label(config.model), "dtype": config.dtype, "device": config.device},
            "options": {**dataclasses.asdict(options), "workload": options.workload.to_dict(),
                        "variants_dir": "<variants>" if options.variants_dir else "<cinq cache>/variants"},
            "workload": work.summary()}


def classify(record: str) -> str:
    """"arithmetic", "code" or "chat" for one record of the shipped text."""
    if "Question:" in record:
        return "arithmetic"
    return "code" if _CODE.search(record) else "chat"


def mixed_workload(tokenizer: Any, options: MixedOptions) -> MixedWorkload:
    """The workload of ``options`` tokenized with ``tokenizer`` (the served model's)."""
    from cinq.assets.text import resolve_text_path
    from cinq.tasks import arithmetic_problems
    options.validate()
    rng = random.Random(options.seed)
    records = [r.strip("\n") for r in resolve_text_path("held-out").read_text(encoding="utf-8").split("\n\n")]
    pools = {kind: [r for r in records if r.strip() and classify(r) == kind] for kind in ("chat", "code")}
    for pool in pools.values():
        rng.shuffle(pool)
    kinds = rng.choices(KINDS, weights=options.shares, k=options.num_requests)
    problems = arithmetic_problems(max(1, kinds.count("arithmetic")) + 1, seed=options.seed, split="validation")
    example = problems[-1]  # the worked example every arithmetic prompt starts with
    used = {"chat": 0, "code": 0, "arithmetic": 0}
    requests = []
    for kind in kinds:
        i = used[kind]
        used[kind] += 1
        if kind == "arithmetic":
            text = example.prompt() + example.target() + "\n\n" + problems[i].prompt()
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            pool = pools[kind]
            body = _cut(tokenizer, pool[i % len(pool)], options.max_record_tokens)
            if kind == "chat":
                text = _chat(tokenizer, body)
            else:
                text = CODE_PREFIX + body
            ids = tokenizer.encode(text, add_special_tokens=False)
        if options.max_prompt_tokens is not None:
            ids = ids[:options.max_prompt_tokens]
        requests.append(BenchRequest(ids, rng.randint(*options.output_len)))
    return MixedWorkload(requests, kinds)


def _cut(tokenizer: Any, text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def _chat(tokenizer: Any, user: str) -> str:
    messages = [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, True)
    return f"System: {CHAT_SYSTEM}\nUser: {user}\nAssistant:"
