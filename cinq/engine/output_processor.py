"""OutputProcessor: turns each step's EngineCoreOutputs (new token ids, logprobs, finish reasons) into
RequestOutputs — detokenizing, finding stop strings, and gathering the ``n`` child sequences of a request under
its id. It never sees the scheduler's requests: what is new arrives as plain data."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cinq.engine.detokenizer import IncrementalDetokenizer
from cinq.engine.io import EngineCoreOutput
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestMetrics, RequestOutput
from cinq.sampling_params import OutputKind, SamplingParams
from cinq.step.runner_output import TokenLogprobs


@dataclass(slots=True)
class RequestFailure:
    """A request that failed alone this step: the scheduler ends ``child_ids`` (freeing their blocks) and
    ``output`` is its final RequestOutput, every unfinished completion with finish_reason "error"."""

    request_id: str
    child_ids: list[str]
    error: str  # "ExceptionType: message"
    output: RequestOutput | None


class _SchedulerError(Exception):
    """The scheduler already failed this request (``EngineCoreOutput.error``); carried to the failure path."""


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
    language: str | None = None  # the tag its speculative-decoding counters are labelled with

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.completions)


class OutputProcessor:
    """Per-request output state, keyed by child request id (``n`` children share one parent)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, _Parent] = {}
        self.children: dict[str, tuple[_Parent, _Completion]] = {}
        # Child id -> language tag of the tagged requests in the last process() call, read by the engine's
        # stats after it: a request that finished in that step has no state left by then. Replaced every step.
        self.step_languages: dict[str, str] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                    child_ids: list[str], arrival_time: float, language: str | None = None) -> None:
        completions = [_Completion(i, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params))
                       for i in range(len(child_ids))]
        parent = _Parent(request_id, prompt, prompt_token_ids, params, completions, RequestMetrics(arrival_time),
                         language=language)
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
                first_scheduled_ids: list[str]) -> tuple[list[RequestOutput], list[str], list[RequestFailure]]:
        """Returns the outputs to hand out, the child ids that hit a stop string (for the scheduler to end) and
        the requests that failed alone (their final "error" outputs are among the outputs).

        ``first_scheduled_ids``: children scheduled for the first time this step (their queueing time ends).
        """
        now = time.time()
        touched: dict[str, _Parent] = {}
        for rid in first_scheduled_ids:
            parent, _ = self.children[rid]
            if parent.metrics.first_scheduled_time is None:
                parent.metrics.first_scheduled_time = now
        stopped: list[str] = []
        failures: dict[str, RequestFailure] = {}
        self.step_languages = languages = {}
        for core in core_outputs:
            entry = self.children.get(core.request_id)
            if entry is not None and entry[0].language is not None:
                languages[core.request_id] = entry[0].language
            # One request's failure (a detokenizer bug, a fault injected by cinq.engine.faults, or an error the
            # scheduler passed on) fails that request alone; the others in the step go on.
            try:
                if core.error is not None:
                    raise _SchedulerError(core.error)
                if core.request_id in self.children:
                    self._process_core(core, now, touched, stopped)
                elif not any(core.request_id in f.child_ids for f in failures.values()):
                    raise KeyError(f"unknown request {core.request_id!r}")
            except Exception as e:
                self._fail(core.request_id, str(e) if isinstance(e, _SchedulerError) else f"{type(e).__name__}: {e}",
                           now, touched, failures)
        outputs = []
        for parent in list(touched.values()):
            try:
                out = self._make_output(parent, now)
            except Exception as e:
                self._fail_parent(parent, f"{type(e).__name__}: {e}", now, touched, failures)
                continue
            if out is not None:
                outputs.append(out)
            if parent.finished:
                self.abort(parent.request_id)
        outputs.extend(f.output for f in failures.values() if f.output is not None)
        return outputs, stopped, list(failures.values())

    def _process_core(self, core: EngineCoreOutput, now: float, touched: dict[str, _Parent],
                      stopped: list[str]) -> None:
        parent, comp = self.children[core.request_id]
        if core.new_prompt_logprobs and parent.prompt_logprobs is not None and not parent.prompt_logprobs_sent:
            for pos, tl in core.new_prompt_logprobs:
                parent.prompt_logprobs[pos] = self._logprob_dict(tl)
        new = core.new_token_ids
        if not new and not core.finished:
            return
        touched[parent.request_id] = parent
        comp.changed = True
        if parent.num_cached_tokens == 0:
            parent.num_cached_tokens = core.num_cached_tokens
        new_logprobs = core.new_logprobs
        if comp.finish_reason is None and new:
            # stopped by the core on a token (EOS or one of stop_token_ids): as vLLM, that token's text stays out
            # of the output unless include_stop_str_in_output (its id stays in token_ids)
            by_token = core.finished and core.finish_reason == "stop" and not comp.detok.include_stop
            before = len(comp.detok.tokens)
            hit = comp.detok.update(new[:-1] if by_token else new)
            if hit is not None:  # a stop string ends the request, even one that also ended on a token
                comp.finish_reason, comp.stop_reason = "stop", hit
                if not core.finished:
                    stopped.append(core.request_id)
                # Several tokens may arrive in one step (speculative decoding): those after the one that
                # completed the stop string are dropped, as if decoding had stopped there.
                used = len(comp.detok.tokens) - before
                new, new_logprobs = new[:used], new_logprobs[:used]
        comp.token_ids.extend(new)
        for tl in new_logprobs:
            comp.logprobs.append(self._logprob_dict(tl))
            comp.cumulative_logprob += tl.logprob
        m = parent.metrics
        m.num_draft_tokens += core.num_draft_tokens
        m.num_accepted_tokens += core.num_accepted_tokens
        m.num_drafts += 1 if core.num_draft_tokens else 0
        if new:
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            m.num_generation_tokens += len(new)
        if comp.finish_reason is None and core.finished:
            comp.finish_reason, comp.stop_reason = core.finish_reason, core.stop_reason

    def _fail(self, child_id: str, error: str, now: float, touched: dict[str, _Parent],
              failures: dict[str, RequestFailure]) -> None:
        """Fail the whole request ``child_id`` belongs to: every unfinished completion ends with "error", its
        final output carries the text so far, and its state is dropped."""
        entry = self.children.get(child_id)
        if entry is None:  # no output state: the scheduler must still end it
            failures.setdefault(child_id, RequestFailure(child_id, [child_id], error, None))
            return
        self._fail_parent(entry[0], error, now, touched, failures)

    def _fail_parent(self, parent: _Parent, error: str, now: float, touched: dict[str, _Parent],
                     failures: dict[str, RequestFailure]) -> None:
        touched.pop(parent.request_id, None)
        for c in parent.completions:
            if c.finish_reason is None:
                c.finish_reason, c.stop_reason = "error", None
        parent.metrics.finished_time = now
        comps = [CompletionOutput(c.index, c.detok.output_text, list(c.token_ids), c.cumulative_logprob,
                                  list(c.logprobs) if c.logprobs is not None else None, c.finish_reason,
                                  c.stop_reason) for c in parent.completions]
        out = RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, comps, True, None,
                            parent.metrics, parent.num_cached_tokens)
        failures[parent.request_id] = RequestFailure(parent.request_id, self.child_ids(parent.request_id), error, out)
        self.abort(parent.request_id)

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
