"""EAGLE / EAGLE-3 / Medusa proposers in the engine: greedy output identical to speculation off (fp32) through
preemption and chunked prefill, and every draft equal to the same head run naively (training-mode forward over
the whole history, no KV cache), which checks the head's paged KV, its one-step-late features and positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError
from cinq.model.loader import load_model
from cinq.spec.eagle import load_eagle_head, new_eagle_head, save_eagle_head
from cinq.spec.medusa import load_medusa_heads, new_medusa_heads, save_medusa_heads

PROMPTS = ["abcabcabc", "hello hello hello", "the cat and the cat and", "0101010101"]


@pytest.fixture(scope="module")
def heads(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    target = load_model(tiny_llama, torch.float32)
    torch.manual_seed(0)  # the heads below do not depend on which tests ran first
    out = {}
    for method in ("eagle", "eagle3"):
        head = new_eagle_head(target, method, seed=1)
        with torch.no_grad():  # larger weights than the default init: distinct, confident guesses
            for p in head.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.3)
        out[method] = save_eagle_head(head, tmp_path_factory.mktemp(method))
    medusa = new_medusa_heads(target, num_heads=4)
    with torch.no_grad():
        for p in medusa.parameters():
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * 0.1)
    out["medusa"] = save_medusa_heads(medusa, tmp_path_factory.mktemp("medusa"))
    return out


def record_drafts(llm: LLM) -> list[tuple[list[int], list[int]]]:
    """Wrap the engine's proposer: (history, drafts) of every proposal."""
    proposer = llm.engine.executor.proposer
    seen: list[tuple[list[int], list[int]]] = []
    real = proposer.propose

    def propose(seqs, history, sampling):
        out = real(seqs, history, sampling)
        for s in seqs:
            if s.num_draft_slots:
                seen.append((list(history[s.request_id]), list(out.token_ids[s.request_id])))
        return out

    proposer.propose = propose
    return seen


def naive_eagle_drafts(target, head, history: list[int], k: int) -> list[int]:
    """The head's drafts recomputed from scratch: target features over the history, then k chained steps, each
    a training-mode forward over every position so far."""
    ids = torch.tensor([history])
    _, states = target.forward_with_hidden_states(ids)
    feats = head.fuse([states[i] for i in head.feature_layers])[0, :-1]  # f_0 .. f_{p0-1}
    tokens = history[1:]  # x_1 .. x_{p0}
    drafts = []
    for _ in range(k):
        n = len(tokens)
        feat_out, normed = head(torch.tensor([tokens]), feats[None], torch.arange(n)[None], None)
        d = int(target.compute_logits(normed[0, -1]).argmax())
        drafts.append(d)
        tokens = tokens + [d]
        feats = torch.cat([feats, feat_out[0, -1:]])
    return drafts


def assert_naive_drafts(tiny_llama: Path, folder: Path, method: str, seen: list[tuple[list[int], list[int]]]) -> None:
    """Every recorded proposal equals the head's drafts computed naively from its history."""
    target = load_model(tiny_llama, torch.float32)
    with torch.inference_mode():
        if method == "medusa":
            m = load_medusa_heads(folder, target, torch.float32, "cpu")
            for history, drafts in seen:
                hidden = target(torch.tensor([history[:-1]]))[0, -1]  # the last committed position's state
                assert drafts == [int(m.head_logits(hidden, i).argmax()) for i in range(len(drafts))]
        else:
            head = load_eagle_head(folder, target, torch.float32, "cpu", "sdpa")
            for history, drafts in seen:
                assert drafts == naive_eagle_drafts(target, head, history, len(drafts))


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_greedy_output_is_unchanged_and_drafts_match_the_naive_head(tiny_llama: Path, heads, method: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32").generate(PROMPTS, params)]
    k = 3
    llm = LLM(str(tiny_llama), dtype="float32",
              speculative_config={"method": method, "model": str(heads[method]), "num_speculative_tokens": k})
    seen = record_drafts(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
    assert llm.engine.get_stats().spec_decode_num_drafts > 0 and len(seen) > 10
    assert_naive_drafts(tiny_llama, heads[method], method, seen)


@pytest.mark.parametrize("method", ["eagle3", "medusa"])
def test_prompt_lookup_first_keeps_output_and_the_heads_drafts(tiny_llama: Path, heads, method: str) -> None:
    # requests whose text repeats draft by lookup; the head drafts for the others, and after a stretch of lookup
    # steps it catches up over their positions: its drafts must still be what the naive head computes
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = PROMPTS + ["xyz", "q"]
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32").generate(prompts, params)]
    llm = LLM(str(tiny_llama), dtype="float32",
              speculative_config={"method": method, "model": str(heads[method]), "num_speculative_tokens": 3,
                                  "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    seen = record_drafts(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
    assert len(seen) > 10 and llm.engine.get_stats().spec_decode_num_drafts > len(seen)  # both kinds of steps
    assert_naive_drafts(tiny_llama, heads[method], method, seen)
    if method != "medusa":  # the gaps lookup steps leave are the arm's own cost (PagedKVProposer.charge_gaps)
        assert llm.engine.executor.proposer.charge_gaps is True


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_unchanged_under_preemption_and_chunked_prefill(tiny_llama: Path, heads, method: str) -> None:
    prompts = PROMPTS * 2
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    tight = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=8, enable_prefix_caching=False)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32", **tight).generate(prompts, params)]
    llm = LLM(str(tiny_llama), dtype="float32", **tight,
              speculative_config={"method": method, "model": str(heads[method]), "num_speculative_tokens": 3})
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    st = llm.engine.get_stats()
    assert st.num_preemptions > 0 and st.spec_decode_num_drafts > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_sampled_requests_with_probabilistic_drafts_are_seeded(tiny_llama: Path, heads) -> None:
    cfg = {"method": "eagle", "model": str(heads["eagle"]), "num_speculative_tokens": 3,
           "draft_sample_method": "probabilistic"}
    params = [SamplingParams(temperature=0.8, max_tokens=20, seed=5 + i, ignore_eos=True) for i in range(3)]
    runs = [[o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32", speculative_config=cfg)
             .generate(PROMPTS[:len(ps)], ps)] for ps in (params, params[:1])]
    assert runs[0][0] == runs[1][0] and len(runs[0][2]) == 20


def test_a_head_of_the_other_method_or_too_few_heads_is_refused(tiny_llama: Path, heads) -> None:
    with pytest.raises(InvalidParameterError) as e:
        LLM(str(tiny_llama), dtype="float32",
            speculative_config={"method": "eagle", "model": str(heads["eagle3"]), "num_speculative_tokens": 2})
    assert e.value.param == "method"
    with pytest.raises(InvalidParameterError) as e:
        LLM(str(tiny_llama), dtype="float32",
            speculative_config={"method": "medusa", "model": str(heads["medusa"]), "num_speculative_tokens": 5})
    assert e.value.param == "num_speculative_tokens"


TREE = [[0], [1], [2], [3], [0, 0], [1, 0], [2, 0], [0, 0, 0]]


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_tree_verification_keeps_greedy_output_and_moves_side_branches(tiny_llama: Path, heads,
                                                                       method: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tight = dict(num_kv_blocks=30, block_size=4, max_num_batched_tokens=32)  # preemption and chunks too
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32", **tight).generate(PROMPTS, params)]
    llm = LLM(str(tiny_llama), dtype="float32", **tight, speculative_config={
        "method": method, "model": str(heads[method]), "num_speculative_tokens": len(TREE),
        "speculative_token_tree": TREE})
    verifier = llm.engine.executor.runner.verifier
    moved = []
    real = verifier.move_accepted_kv

    def spy(batch, kept, kv_caches):
        moved.extend(rows for rows in kept.values() if rows != list(range(len(rows))))
        return real(batch, kept, kv_caches)

    verifier.move_accepted_kv = spy
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain
    assert moved, "no side branch was ever accepted: the K/V move went untested"
    st = llm.engine.get_stats()
    assert st.spec_decode_num_accepted_tokens > 0 and st.num_preemptions > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_sampled_tree_requests_stay_seeded(tiny_llama: Path, heads) -> None:
    cfg = {"method": "medusa", "model": str(heads["medusa"]), "num_speculative_tokens": len(TREE),
           "speculative_token_tree": TREE}
    params = [SamplingParams(temperature=0.7, max_tokens=20, seed=3 + i, ignore_eos=True) for i in range(3)]
    runs = [[o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32", speculative_config=cfg)
             .generate(PROMPTS[:len(ps)], ps)] for ps in (params, params[:1])]
    assert runs[0][0] == runs[1][0]


def test_tree_config_errors_name_the_field(tiny_llama: Path, heads) -> None:
    base = {"method": "medusa", "model": str(heads["medusa"]), "speculative_token_tree": TREE}
    with pytest.raises(InvalidParameterError) as e:
        LLM(str(tiny_llama), dtype="float32", speculative_config={**base, "num_speculative_tokens": 3})
    assert e.value.param == "num_speculative_tokens"
    with pytest.raises(InvalidParameterError) as e:
        LLM(str(tiny_llama), dtype="float32", speculative_config={
            **base, "num_speculative_tokens": 5, "speculative_token_tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0],
                                                                            [0, 0, 0, 0, 0]]})
    assert e.value.param == "speculative_token_tree"  # deeper than the 4 heads
    with pytest.raises(InvalidParameterError) as e:
        LLM(str(tiny_llama), dtype="float32", speculative_config={
            "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
            "speculative_token_tree": [[0], [1]]})
    assert e.value.param == "speculative_token_tree"


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_dynamic_trees_keep_greedy_output(tiny_llama: Path, heads, method: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tight = dict(num_kv_blocks=40, block_size=4, max_num_batched_tokens=24)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32", **tight).generate(PROMPTS, params)]
    llm = LLM(str(tiny_llama), dtype="float32", **tight, speculative_config={
        "method": method, "model": str(heads[method]), "num_speculative_tokens": 6, "tree_topk": 2,
        "tree_depth": 3})
    proposer = llm.engine.executor.proposer
    shapes = []
    real = proposer.propose

    def spy(seqs, history, sampling):
        out = real(seqs, history, sampling)
        shapes.extend(tuple(p) for p in out.parents.values())
        return out

    proposer.propose = spy
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain
    assert len(set(shapes)) > 1, "every request's tree had the same shape: the per-request masks went untested"
    assert all(len(p) == 7 and all(0 <= q < i for i, q in enumerate(p) if i) for p in shapes)
    assert llm.engine.get_stats().spec_decode_num_drafts > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


@pytest.mark.parametrize("extra", [{"method": "eagle", "num_speculative_tokens": 3},
                                   {"method": "eagle3", "num_speculative_tokens": 5, "tree_topk": 2, "tree_depth": 3},
                                   {"method": "medusa", "num_speculative_tokens": len(TREE),
                                    "speculative_token_tree": TREE}])
def test_kv_accounting_after_many_sampled_requests_with_rejections_and_preemptions(tiny_llama: Path, heads,
                                                                                   extra: dict) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=32, block_size=4, max_num_batched_tokens=48,
              speculative_config={**extra, "model": str(heads[extra["method"]])})
    n = 160
    prompts = [PROMPTS[i % len(PROMPTS)] + str(i % 7) for i in range(n)]
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=4 + i % 13, ignore_eos=True) for i in range(n)]
    outs = llm.generate(prompts, params)
    st = llm.engine.get_stats()
    assert all(len(o.outputs[0].token_ids) == 4 + i % 13 for i, o in enumerate(outs))
    assert st.num_preemptions > 0 and st.spec_decode_num_draft_tokens > st.spec_decode_num_accepted_tokens
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
    llm.generate(["x"], SamplingParams(max_tokens=2))  # finished requests' state goes with the next steps
    assert len(llm.engine.executor.proposer.__dict__.get("pending", {})) <= 1
    assert len(llm.engine.executor.runner.states) <= 1


def test_logprobs_n_and_stop_strings_match_plain_decoding(tiny_llama: Path, heads) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2, n=2, stop=["cat"])
    plain = LLM(str(tiny_llama), dtype="float32").generate(PROMPTS, params)
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config={
        "method": "eagle", "model": str(heads["eagle"]), "num_speculative_tokens": 3})
    spec = llm.generate(PROMPTS, params)
    for a, b in zip(plain, spec):
        for ca, cb in zip(a.outputs, b.outputs):
            assert ca.token_ids == cb.token_ids and ca.text == cb.text and ca.finish_reason == cb.finish_reason
            for la, lb in zip(ca.logprobs, cb.logprobs):
                assert la.keys() == lb.keys()
                assert all(abs(la[t].logprob - lb[t].logprob) < 1e-4 for t in la)
    assert llm.engine.get_stats().spec_decode_num_drafts > 0


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "draft_model"])
def test_speculation_off_runs_no_proposer_layer(tiny_llama: Path, heads, method: str) -> None:
    """k = 0 (what adaptive k picks where drafts do not pay) is plain decoding: the same output and not one call
    of a head's or draft's layer (EAGLE-3 fuses its features at the catch-up, never while off). A proposer that
    kept its state up to date while off would fail the count."""
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32").generate(PROMPTS, params)]
    model = str(tiny_llama) if method == "draft_model" else str(heads[method])
    llm = LLM(str(tiny_llama), dtype="float32",
              speculative_config={"method": method, "model": model, "num_speculative_tokens": 3,
                                  "num_speculative_tokens_per_batch_size": [[1, 1024, 0]]})
    proposer = llm.engine.executor.proposer
    module = {"medusa": "heads", "draft_model": "model"}.get(method, "head")
    calls = []
    for sub in getattr(proposer, module).modules():
        sub.register_forward_pre_hook(lambda mod, args: calls.append(type(mod).__name__))
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain
    assert calls == [] and llm.engine.get_stats().spec_decode_num_drafts == 0


def test_pending_features_append_restart_and_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks join only when read; a restart inside them keeps what came before it; past the cap whole chunks
    leave from the front (positions stay aligned with rows)."""
    from cinq.spec import eagle_proposer
    monkeypatch.setattr(eagle_proposer, "MAX_PENDING", 4)
    rows = lambda a, b: torch.arange(a, b, dtype=torch.float32)[:, None]  # noqa: E731 - row i holds position i
    p = eagle_proposer.PendingFeatures(10, [rows(10, 12)], 2)
    p.append_at(12, rows(12, 13))
    assert (p.first, p.end, p.rows().flatten().tolist()) == (10, 13, [10, 11, 12])
    p.append_at(11, rows(11, 12))  # preempted, recomputed from position 11
    assert (p.first, p.end, p.rows().flatten().tolist()) == (10, 12, [10, 11])
    for pos in range(12, 16):
        p.append_at(pos, rows(pos, pos + 1))
    assert p.rows().flatten().tolist() == list(range(p.first, p.end)) and p.end == 16 and p.length <= 5


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_the_catch_up_over_undrafted_steps_is_reported_apart(tiny_llama: Path, heads, method: str) -> None:
    """After decode steps at k = 0, the first step with drafts catches the proposer up over the prompt and those
    steps: the share of its time spent past k + 1 positions a request is reported (Proposals.catch_up_s, which
    adaptive k leaves out of the arm's cost); a step right after one that drafted catches up over at most k + 1
    positions and reports none."""
    k = 3
    model = str(tiny_llama) if method == "draft_model" else str(heads[method])
    llm = LLM(str(tiny_llama), dtype="float32",
              speculative_config={"method": method, "model": model, "num_speculative_tokens": k})
    drafter, proposer = llm.engine.scheduler.drafter, llm.engine.executor.proposer
    choices: list[int] = []
    drafter.choose_k = lambda batch_size: choices.append(batch_size) or (0 if len(choices) <= 6 else k)
    reported: list[float] = []
    real = proposer.propose

    def propose(seqs, history, sampling):
        out = real(seqs, history, sampling)
        if any(s.num_draft_slots for s in seqs):
            reported.append(out.catch_up_s)
        return out

    proposer.propose = propose
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert len(reported) > 4 and reported[0] > 0 and reported[1:4] == [0.0] * 3
