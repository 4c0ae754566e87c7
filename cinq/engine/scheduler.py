"""Token-budget scheduler with continuous batching, chunked prefill and preemption by recompute.

Each step spends one budget of ``max_num_batched_tokens``: first on running requests that decode (one token each),
then on running requests still in (chunked) prefill, then on waiting requests, whose prompts may be split across
steps. When the KV pool runs dry, the newest running request not yet scheduled this step is preempted: its blocks
are freed and it goes back to the front of the queue to be recomputed later (prefix caching usually makes that
cheap). A step may therefore mix prefill chunks and decodes, and a long prompt never blocks decodes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cinq.engine.io import EngineCoreOutput
from cinq.engine.kv_cache import KVCacheManager
from cinq.spec.drafter import Drafter
from cinq.step.request import Request, RequestStatus
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import NewRequestData, ScheduledSeq, SchedulerOutput


@dataclass(slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int


class Scheduler:
    """Owns the waiting queue, the running list and the KV cache manager."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, drafter: Drafter | None = None) -> None:
        self.config = config
        self.kv = kv
        self.drafter = drafter  # proposes draft tokens for decoding requests (speculative decoding)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._seen: set[str] = set()  # requests the runner already knows
        self._finished_ids: list[str] = []

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """Finish (abort, or stop on a stop string) requests wherever they are; frees their blocks."""
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._finish(req, status)
            done.append(req)
        return done

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.config.max_num_batched_tokens
        scheduled: set[str] = set()
        # Running requests: decodes first, then unfinished prefills, each in arrival order.
        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        if self.drafter is not None and decodes:
            self.drafter.propose(decodes, self.config.max_model_len)
        for req in decodes + prefills:
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            # a decoding request verifies its drafts too: k + 1 slots and budget (fewer drafts when short)
            n = min(req.num_tokens - req.num_computed_tokens + len(req.spec_token_ids) + req.num_draft_slots, budget)
            while not self.kv.allocate_slots(req, n):
                victim = self._pick_victim(scheduled, req)
                self._preempt(victim)
                out.preempted_request_ids.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue
            self._add_seq(out, req, n)
            scheduled.add(req.request_id)
            budget -= n
        # Waiting requests, unless this step had to preempt (then the pool is short already).
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs \
                and not out.preempted_request_ids:
            req = self.waiting[0]
            hits, num_hit = ([], 0)
            if req.sampling_params.prompt_logprobs is None:  # prompt logprobs need every prompt position computed
                hits, num_hit = self.kv.get_computed_blocks(req)
            n = min(req.num_tokens - num_hit, budget)
            if not self.kv.allocate_slots(req, n, hits, num_hit):
                break
            self.kv.record_lookup(req.num_tokens, num_hit)
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._add_seq(out, req, n)
            budget -= n
        out.num_batched_tokens = self.config.max_num_batched_tokens - budget
        return out

    def update(self, out: SchedulerOutput, run: RunnerOutput) -> list[EngineCoreOutput]:
        """Advance computed counts, append sampled tokens and apply token-level stops.

        Returns one EngineCoreOutput per request that got tokens, prompt logprobs or a finish this step; tokens
        past a stop (several may arrive in one step) are dropped along with their logprobs.
        """
        outputs = []
        drafted, accepted = [], []
        for seq in out.seqs:
            # One request's failure (a bug, or a fault injected by cinq.engine.faults) must not take the batch
            # down: that request alone finishes with "error" and its blocks are freed. try costs nothing when
            # nothing raises.
            try:
                core = self._update_seq(seq, run)
            except Exception as e:
                core = self._fail_request(seq.request_id, e)
            if core is not None:
                outputs.append(core)
                if seq.num_logit_rows:
                    drafted.append(core.num_draft_tokens)
                    accepted.append(core.num_accepted_tokens)
        if self.drafter is not None and out.num_prompt_tokens == 0 and drafted:
            # A decode-only step: its cost is its arm's unless the proposer caught up over positions committed
            # while a request did not draft. Such a step costs more than its catch-up's own time (the head's and
            # the step's weights evicted by the stretch off: EAGLE-3's re-tries of k = 1 at batch 4 read 1.3-1.5x
            # its steady cost after the catch-up's share was taken out), and priced by it, an arm that wins lost
            # its re-tries; only its acceptance counts.
            self.drafter.observe(None if run.catch_up_s else run.elapsed_s, drafted, accepted)
        return outputs

    def _update_seq(self, seq: ScheduledSeq, run: RunnerOutput) -> EngineCoreOutput | None:
        req = self.requests[seq.request_id]
        tokens = run.sampled.get(seq.request_id)
        # A verify step emits its accepted drafts + 1: only the accepted drafts' K/V stays valid (the
        # rejected ones' slots are rewritten later; the emitted token is computed next step).
        num_drafts = seq.num_logit_rows - 1 if seq.num_logit_rows > 1 else 0
        num_accepted = len(tokens) - 1 if tokens and num_drafts else 0
        req.num_computed_tokens += len(seq.token_ids) + seq.num_draft_slots - (num_drafts - num_accepted)
        req.spec_token_ids = []
        req.num_draft_slots = 0
        prompt_lp = run.prompt_logprobs.get(seq.request_id, [])
        if not tokens:
            if prompt_lp:
                return EngineCoreOutput(req.request_id, new_prompt_logprobs=prompt_lp,
                                        num_cached_tokens=max(req.num_cached_tokens, 0))
            return None
        core = EngineCoreOutput(req.request_id, new_prompt_logprobs=prompt_lp,
                                num_cached_tokens=max(req.num_cached_tokens, 0), num_draft_tokens=num_drafts,
                                num_accepted_tokens=num_accepted)
        if req.max_tokens == 0:  # prompt-only request (e.g. echo + prompt logprobs): nothing to append
            self.running.remove(req)
            self._finish(req, RequestStatus.FINISHED_LENGTH)
        else:
            for tok in tokens:
                req.append_output_token(tok)
                core.new_token_ids.append(tok)
                status = self._check_stop(req, tok)
                if status is not None:
                    self.running.remove(req)
                    self._finish(req, status)
                    break
            core.new_logprobs = run.logprobs.get(req.request_id, [])[:len(core.new_token_ids)]
            # drafts accepted past a stop are never emitted: they do not count as accepted either
            core.num_accepted_tokens = min(num_accepted, len(core.new_token_ids))
            if num_drafts > num_accepted and not req.is_finished:
                self.kv.trim(req.request_id, req.num_tokens)  # the rejected drafts' blocks go back
        core.finish_reason, core.stop_reason = req.finish_reason, req.stop_reason
        return core

    def _fail_request(self, request_id: str, error: Exception) -> EngineCoreOutput:
        """End a request whose update raised: finished with "error", blocks freed, the error passed on."""
        req = self.requests.get(request_id)
        if req is not None and not req.is_finished:
            if req in self.running:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
            self._finish(req, RequestStatus.FINISHED_ERROR)
        return EngineCoreOutput(request_id, finish_reason=RequestStatus.FINISHED_ERROR.value,
                                error=f"{type(error).__name__}: {error}")

    def _check_stop(self, req: Request, token: int) -> RequestStatus | None:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in params.eos_token_ids:
                req.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _add_seq(self, out: SchedulerOutput, req: Request, n: int) -> None:
        start = req.num_computed_tokens
        known = min(n, req.num_tokens - start)
        drafts = req.spec_token_ids[:n - known]
        slots = min(req.num_draft_slots, n - known - len(drafts))
        out.num_prompt_tokens += max(0, min(start + known, req.num_prompt_tokens) - start)
        if req.request_id not in self._seen:
            self._seen.add(req.request_id)
            out.new_requests.append(NewRequestData(req.request_id, req.prompt_token_ids, req.sampling_params))
        reaches_end = start + known == req.num_tokens
        # KV cache groups (engine/kv_cache_groups.py: HybridKVCacheManager) give one table per group
        group_ids = getattr(self.kv, "group_block_ids", None)
        out.seqs.append(ScheduledSeq(req.request_id, req.all_token_ids[start:start + known] + drafts, start,
                                     self.kv.block_ids(req.request_id),
                                     1 + len(drafts) + slots if reaches_end else 0, req.num_output_tokens, slots,
                                     group_ids(req.request_id) if group_ids is not None else None))

    def _pick_victim(self, scheduled: set[str], current: Request) -> Request:
        # Newest first; a request already given work this step is never preempted (its blocks may have been
        # registered in the prefix cache for K/V this step will write).
        for cand in reversed(self.running):
            if cand.request_id not in scheduled:
                return cand
        return current

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_draft_slots = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        self.kv.free(req.request_id)
        del self.requests[req.request_id]
        if req.request_id in self._seen:
            self._seen.discard(req.request_id)
            self._finished_ids.append(req.request_id)
