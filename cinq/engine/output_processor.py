"""OutputProcessor: turns each step's EngineCoreOutputs (new token ids, logprobs, finish reasons) into
RequestOutputs — detokenizing, finding stop strings, and gathering the ``n`` child sequences of a request under
its id. It never sees the scheduler's requests: what is new arrives as plain data."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cinq.engine.detokenizer import IncrementalDetokenizer
from cinq.engine.io import EngineCoreOutput, TokenLogprobs
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from cinq.sampling_params import OutputKind, SamplingParams


@dataclass(slots=True)
class _Completion:
    index: int
    detok: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_text: int = 0  # characters / tokens / logprobs already handed out (delta mode)
    sent_tokens: int = 0
    changed: bool = False


@dataclass(slots=True)
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    completions: list[_Completion]
    metrics: RequestMetrics
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    prompt_logprobs_sent: bool = False
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)


class OutputProcessor:
    """Per-request output state, keyed by child request id (``n`` children share one parent)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, _Parent] = {}
        self.children: dict[str, tuple[_Parent, _Completion]] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                    child_ids: list[str], arrival_time: float) -> None:
        completions = [_Completion(i, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params))
                       for i in range(len(child_ids))]
        parent = _Parent(request_id, prompt, prompt_token_ids, params, completions, RequestMetrics(arrival_time))
        if params.logprobs is not None:
            for c in completions:
                c.logprobs, c.cumulative_logprob = [], 0.0
        if params.prompt_logprobs is not None:
            parent.prompt_logprobs = [None] * len(prompt_token_ids)
        self.parents[request_id] = parent
        for cid, comp in zip(child_ids, completions):
            self.children[cid] = (parent, comp)

    def child_ids(self, request_id: str) -> list[str]:
        return [cid for cid, (p, _) in self.children.items() if p.request_id == request_id]

    def abort(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is not None:
            for cid in [cid for cid, (p, _) in self.children.items() if p is parent]:
                del self.children[cid]

    def process(self, core_outputs: list[EngineCoreOutput],
                first_scheduled_ids: list[str]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the outputs to hand out and the child ids that hit a stop string (for the scheduler to end).

        ``first_scheduled_ids``: children scheduled for the first time this step (their queueing time ends).
        """
        now = time.time()
        touched: dict[str, _Parent] = {}
        for rid in first_scheduled_ids:
            parent, _ = self.children[rid]
            if parent.metrics.first_scheduled_time is None:
                parent.metrics.first_scheduled_time = now
        stopped: list[str] = []
        for core in core_outputs:
            parent, comp = self.children[core.request_id]
            if core.new_prompt_logprobs and parent.prompt_logprobs is not None and not parent.prompt_logprobs_sent:
                for pos, tl in core.new_prompt_logprobs:
                    parent.prompt_logprobs[pos] = self._logprob_dict(tl)
            new = core.new_token_ids
            if not new and not core.finished:
                continue
            touched[parent.request_id] = parent
            comp.changed = True
            if parent.num_cached_tokens == 0:
                parent.num_cached_tokens = core.num_cached_tokens
            comp.token_ids.extend(new)
            for tl in core.new_logprobs:
                comp.logprobs.append(self._logprob_dict(tl))
                comp.cumulative_logprob += tl.logprob
            m = parent.metrics
            if new:
                m.first_token_time = m.first_token_time or now
                m.last_token_time = now
                m.num_generation_tokens += len(new)
            if comp.finish_reason is None and new:
                hit = comp.detok.update(new)
                if hit is not None:  # a stop string ends the request, even one that also ended on a token
                    comp.finish_reason, comp.stop_reason = "stop", hit
                    if not core.finished:
                        stopped.append(core.request_id)
            if comp.finish_reason is None and core.finished:
                comp.finish_reason, comp.stop_reason = core.finish_reason, core.stop_reason
        outputs = []
        for parent in touched.values():
            out = self._make_output(parent, now)
            if out is not None:
                outputs.append(out)
            if parent.finished:
                self.abort(parent.request_id)
        return outputs, stopped

    def _make_output(self, parent: _Parent, now: float) -> RequestOutput | None:
        kind = parent.params.output_kind
        finished = parent.finished
        if finished:
            parent.metrics.finished_time = now
        if kind == OutputKind.FINAL_ONLY and not finished:
            return None
        comps = []
        for c in parent.completions:
            if kind == OutputKind.DELTA:
                if not c.changed:
                    continue
                text = c.detok.visible_text(c.finish_reason is not None)
                comps.append(CompletionOutput(
                    c.index, text[c.sent_text:], c.token_ids[c.sent_tokens:], c.cumulative_logprob,
                    c.logprobs[c.sent_tokens:] if c.logprobs is not None else None, c.finish_reason, c.stop_reason))
                c.sent_text, c.sent_tokens = len(text), len(c.token_ids)
            else:
                comps.append(CompletionOutput(
                    c.index, c.detok.visible_text(c.finish_reason is not None), list(c.token_ids),
                    c.cumulative_logprob, list(c.logprobs) if c.logprobs is not None else None,
                    c.finish_reason, c.stop_reason))
            c.changed = False
        prompt_lp = None
        if parent.prompt_logprobs is not None and (kind != OutputKind.DELTA or not parent.prompt_logprobs_sent):
            prompt_lp = parent.prompt_logprobs
            parent.prompt_logprobs_sent = True
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, comps, finished,
                             prompt_lp, parent.metrics, parent.num_cached_tokens)

    def _logprob_dict(self, tl: TokenLogprobs) -> PositionLogprobs:
        decode = self.tokenizer.decode
        d = {tid: Logprob(lp, r + 1, decode([tid], skip_special_tokens=False))
             for r, (tid, lp) in enumerate(zip(tl.top_ids, tl.top_logprobs))}
        if tl.token_id not in d:
            d[tl.token_id] = Logprob(tl.logprob, tl.rank, decode([tl.token_id], skip_special_tokens=False))
        return d
