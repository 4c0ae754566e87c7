"""Draft-model speculation inside the continuous-batching engine: greedy output identical to speculation off
(fp32), the target as its own draft accepting everything, rejections, preemption, chunked prefill, prefix hits,
probabilistic drafts reproducible under a seed, incompatible drafts refused, all KV blocks free after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError, ModelLoadError
from tests.model_factory import build_tiny_model

PROMPTS = ["abcabcabc", "hello hello hello", "xyz", "the cat and the cat and", "0101010101", "q"]


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A different random model with the same tokenizer: its drafts are mostly rejected."""
    return build_tiny_model(tmp_path_factory.mktemp("draft-qwen3"), "qwen3", seed=7)


def spec(model: Path, k: int = 3, **kw) -> dict:
    return {"model": str(model), "num_speculative_tokens": k, **kw}


def generate(target: Path, speculative_config: dict | None, params: list[SamplingParams], prompts=PROMPTS,
             **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(target), dtype="float32", speculative_config=speculative_config, **engine_args)
    outs = llm.generate(prompts[:len(params)], params)
    return [o.outputs[0].token_ids for o in outs], llm


def greedy(n: int = 30) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_self_draft_accepts_everything_and_output_is_unchanged(tiny_llama: Path) -> None:
    params = [greedy() for _ in PROMPTS]
    plain, _ = generate(tiny_llama, None, params)
    drafted, llm = generate(tiny_llama, spec(tiny_llama, k=3), params)
    assert drafted == plain
    st = llm.engine.get_stats()
    assert st.spec_decode_num_drafts > 0
    # tau = k + 1 up to the last steps of each request, which draft fewer (max_tokens)
    assert st.spec_decode_num_accepted_tokens == st.spec_decode_num_draft_tokens
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_prompt_lookup_first_leaves_the_drafts_kv_where_it_was(tiny_llama: Path) -> None:
    # the target as its own draft guesses every token right, so every draft it makes is the plain continuation:
    # after a step verified prompt-lookup drafts (no draft-model forward), its KV must still end where it did
    params = [greedy() for _ in PROMPTS]
    plain, _ = generate(tiny_llama, None, params)
    llm = LLM(str(tiny_llama), dtype="float32",
              speculative_config=spec(tiny_llama, k=3, prompt_lookup_max=3, prompt_lookup_min=1))
    proposer, seen = llm.engine.executor.proposer, []
    real = proposer.propose

    def propose(seqs, history, sampling):  # noqa: ANN001, ANN202
        out = real(seqs, history, sampling)
        seen.extend((list(history[s.request_id]), out.token_ids[s.request_id]) for s in seqs if s.num_draft_slots)
        return out

    proposer.propose = propose
    outs = llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == plain
    full = {tuple(o.prompt_token_ids): o.prompt_token_ids + list(o.outputs[0].token_ids) for o in outs}
    checked = 0
    for history, drafts in seen:
        text = next(t for p, t in full.items() if history[:len(p)] == list(p) and t[:len(history)] == history)
        assert drafts == text[len(history):len(history) + len(drafts)]
        checked += 1
    st = llm.engine.get_stats()
    assert checked > 10 and st.spec_decode_num_drafts > len(seen)  # some steps drafted by lookup alone
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_a_poor_draft_is_rejected_but_output_is_unchanged(tiny_llama: Path, other_draft: Path) -> None:
    params = [greedy() for _ in PROMPTS]
    plain, _ = generate(tiny_llama, None, params)
    drafted, llm = generate(tiny_llama, spec(other_draft, k=4), params)
    assert drafted == plain
    st = llm.engine.get_stats()
    assert st.spec_decode_num_accepted_tokens < st.spec_decode_num_draft_tokens
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_unchanged_under_preemption_chunked_prefill_and_prefix_hits(tiny_llama: Path) -> None:
    prompts = PROMPTS[:4] * 2  # the repeats hit the prefix cache
    params = [greedy(50) for _ in prompts]
    tight = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=8)  # preempts, chunks every prompt
    plain, _ = generate(tiny_llama, None, params, prompts, **tight)
    drafted, llm = generate(tiny_llama, spec(tiny_llama, k=3), params, prompts, **tight)
    assert drafted == plain
    st = llm.engine.get_stats()
    assert st.num_preemptions > 0 and st.prefix_cache_hits > 0
    # the draft's KV followed the target's through preemption and chunks: a self-draft still accepts it all
    assert st.spec_decode_num_accepted_tokens == st.spec_decode_num_draft_tokens > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_probabilistic_drafts_are_reproducible_with_a_seed(tiny_llama: Path, other_draft: Path) -> None:
    params = [SamplingParams(temperature=0.9, top_p=0.9, max_tokens=24, seed=100 + i, ignore_eos=True)
              for i in range(4)]
    cfg = spec(other_draft, k=3, draft_sample_method="probabilistic")
    first, llm = generate(tiny_llama, cfg, params)
    again, _ = generate(tiny_llama, cfg, params[:2])  # other batch mates: a seeded request keeps its tokens
    assert first[:2] == again
    assert all(len(t) == 24 for t in first)
    assert llm.engine.get_stats().spec_decode_num_drafts > 0


def test_stop_tokens_and_max_tokens_mid_draft(tiny_llama: Path) -> None:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 2, 5, 7)]
    plain, _ = generate(tiny_llama, None, params)
    drafted, llm = generate(tiny_llama, spec(tiny_llama, k=4), params)
    assert drafted == plain and [len(t) for t in drafted] == [1, 2, 5, 7]
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-draft"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_size"] += 8
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidParameterError, match="vocab_size") as e:
        LLM(str(tiny_llama), dtype="float32", speculative_config=spec(bad))
    assert e.value.param == "model"


def test_an_unknown_draft_folder_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="^speculative_config.model: .* is neither a model folder") as e:
        LLM(str(tiny_llama), dtype="float32", speculative_config=spec(tmp_path / "nothing"))
    assert e.value.param == "speculative_config.model"


def test_an_embedded_draft_model_is_found_by_name(tiny_llama: Path) -> None:
    from cinq.assets import shipped_model_path
    from cinq.spec.proposer_loader import resolve_spec_model
    if shipped_model_path("cinq-tiny-student") is None:
        pytest.skip("cinq-tiny-student is not shipped in this checkout")
    assert resolve_spec_model("cinq-tiny-student") == shipped_model_path("cinq-tiny-student")
