"""Logprobs in the two OpenAI shapes: the legacy completions one (parallel lists ``tokens`` / ``token_logprobs``
/ ``top_logprobs`` / ``text_offset``, which lm-evaluation-harness reads) and the chat one (``content`` entries
with ``top_logprobs`` lists)."""

from __future__ import annotations

from cinq.model.tokenizer import Tokenizer
from cinq.outputs import PositionLogprobs

_FLOOR = -9999.0  # -inf is not valid JSON; clients get a very small finite number instead


def _lp(value: float) -> float:
    return max(value, _FLOOR) if value == value else _FLOOR


def _token_text(tokenizer: Tokenizer, token_id: int, entry: PositionLogprobs | None) -> str:
    if entry is not None and token_id in entry and entry[token_id].decoded_token is not None:
        return entry[token_id].decoded_token  # type: ignore[return-value]
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _name(text: str, token_id: int, as_ids: bool) -> str:
    """How a token is named in a response: its text, or vLLM's ``token_id:<id>`` (``return_tokens_as_token_ids``:
    for clients that must map every token back, including the ones whose text is not whole UTF-8)."""
    return f"token_id:{token_id}" if as_ids else text


class CompletionLogprobs:
    """Accumulates the completions-API logprobs object; ``text_offset`` continues across appends (streaming) and
    counts the text's characters (also when tokens are named by id)."""

    def __init__(self, tokenizer: Tokenizer, text_offset: int = 0, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.offset = text_offset
        self.as_ids = as_ids

    def build(self, token_ids: list[int], positions: list[PositionLogprobs | None], num_top: int | None) -> dict:
        """``positions[i]`` is the logprobs dict of ``token_ids[i]`` (None for the first prompt token)."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entry in zip(token_ids, positions):
            text = _token_text(self.tokenizer, token_id, entry)
            out["tokens"].append(_name(text, token_id, self.as_ids))
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_lp(entry[token_id].logprob) if token_id in entry else None)
            top: dict[str, float] = {}
            for tid, lp in sorted(entry.items(), key=lambda kv: kv[1].rank or 0):
                # The top-k by rank, plus the chosen token even when it ranks lower (as vLLM does).
                if num_top is not None and (lp.rank or 0) > num_top and tid != token_id:
                    continue
                alt = lp.decoded_token if lp.decoded_token is not None else _token_text(self.tokenizer, tid, None)
                top.setdefault(_name(alt, tid, self.as_ids), _lp(lp.logprob))
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(tokenizer: Tokenizer, token_ids: list[int], positions: list[PositionLogprobs],
                  num_top: int, as_ids: bool = False) -> dict:
    """The chat ``logprobs`` object: one ``content`` entry per generated token, each with its top alternatives
    (``bytes``: the token's text's, also when it is named by id)."""
    content = []
    for token_id, entry in zip(token_ids, positions):
        text = _token_text(tokenizer, token_id, entry)
        lp = entry[token_id].logprob if token_id in entry else _FLOOR
        top = []
        for tid, alt in sorted(entry.items(), key=lambda kv: kv[1].rank or 0):
            if alt.rank is not None and alt.rank <= num_top:
                alt_text = alt.decoded_token if alt.decoded_token is not None else _token_text(tokenizer, tid, None)
                top.append({"token": _name(alt_text, tid, as_ids), "logprob": _lp(alt.logprob),
                            "bytes": list(alt_text.encode())})
        content.append({"token": _name(text, token_id, as_ids), "logprob": _lp(lp), "bytes": list(text.encode()),
                        "top_logprobs": top})
    return {"content": content}


def prompt_logprobs(tokenizer: Tokenizer, token_ids: list[int], positions: list[PositionLogprobs | None],
                    num_top: int) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (None for the first, which nothing predicts) its top
    ``num_top`` and itself, token id (a string key) -> ``{"logprob", "rank", "decoded_token"}``."""
    out: list[dict | None] = []
    for token_id, entry in zip(token_ids, positions):
        if entry is None:
            out.append(None)
            continue
        out.append({str(tid): {"logprob": _lp(lp.logprob), "rank": lp.rank,
                               "decoded_token": _token_text(tokenizer, tid, entry)}
                    for tid, lp in sorted(entry.items(), key=lambda kv: kv[1].rank or 0)
                    if tid == token_id or (lp.rank or 0) <= num_top})
    return out
