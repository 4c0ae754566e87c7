"""The workload ``cinq tune`` measures with: a JSONL file, one request a line (``{"prompt": "text"}`` or
``{"prompt_token_ids": [...]}``, with ``"max_tokens"``), or ``mixed:N`` for N requests of the built-in mixed
chat / code / arithmetic workload (``cinq.bench.mixed_workload``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cinq.bench.workload import BenchRequest
from cinq.errors import InvalidParameterError

DEFAULT_MAX_TOKENS = 32


def read_workload(spec: str, tokenizer: Any, seed: int = 0) -> list[BenchRequest]:
    """The requests of ``spec`` (see the module docstring), tokenized with ``tokenizer``."""
    if spec.startswith("mixed:"):
        from cinq.bench.mixed_workload import MixedOptions, mixed_workload
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise InvalidParameterError(f"--workload mixed:N needs an integer N, got {spec!r}", "workload") from None
        return mixed_workload(tokenizer, MixedOptions(num_requests=n, seed=seed)).requests
    path = Path(spec)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InvalidParameterError(f"--workload: cannot read {path}: {e.strerror}", "workload") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidParameterError(f"--workload {path}:{no}: not valid JSON: {e.msg}", "workload") from None
        if not isinstance(rec, dict) or ("prompt" in rec) == ("prompt_token_ids" in rec):
            raise InvalidParameterError(f"--workload {path}:{no}: give one of 'prompt' or 'prompt_token_ids'",
                                        "workload")
        ids = rec.get("prompt_token_ids") or tokenizer.encode(rec["prompt"], add_special_tokens=False)
        max_tokens = rec.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or max_tokens < 1 or not ids:
            raise InvalidParameterError(f"--workload {path}:{no}: needs a non-empty prompt and max_tokens >= 1",
                                        "workload")
        out.append(BenchRequest(list(ids), max_tokens))
    if not out:
        raise InvalidParameterError(f"--workload {path} holds no requests", "workload")
    return out
