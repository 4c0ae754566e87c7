"""ModelRunner's decode hot path: the fast paths (native fused norm and rope, the greedy shortcut that skips the
sampler, the range-built inputs) give the same tokens and logprobs as the plain PyTorch paths they replace."""

from __future__ import annotations

import pytest
import torch

from cinq.config import EngineConfig
from cinq.engine import runner as runner_mod
from cinq.engine.engine import LLMEngine
from cinq.layers import norm as norm_mod
from cinq.layers import rotary as rotary_mod
from cinq.sampling_params import OutputKind, SamplingParams

PROMPTS = ([3, 17, 29, 41, 5, 8, 60, 2, 33, 12, 90, 7, 7, 14, 22, 31, 48, 9], [11, 4, 70])
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, output_kind=OutputKind.FINAL_ONLY)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
WITH_AND_WITHOUT_NGRAM = pytest.mark.parametrize("spec", [None, NGRAM], ids=["plain", "ngram"])


def _generate(model: str, requests: dict[str, tuple[list[int], SamplingParams]]
              ) -> dict[str, tuple[list[int], list[float] | None]]:
    """Each request's tokens and (when asked for) the logprobs of its tokens, all run in one batch."""
    engine = LLMEngine(EngineConfig(model=model, dtype="bfloat16", kv_cache_memory=0.05, seed=0))
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            lps = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)] if c.logprobs else None
            results[out.request_id] = (list(c.token_ids), lps)
    return results


def _both_ways(model: str, requests: dict[str, tuple[list[int], SamplingParams]], monkeypatch: pytest.MonkeyPatch):
    fast = _generate(model, requests)
    with monkeypatch.context() as m:
        m.setattr(norm_mod, "rms_norm_native", lambda *a: None)
        m.setattr(rotary_mod, "rotary_native", lambda *a: False)
        m.setattr(runner_mod, "_plain_greedy", lambda *a: False)
        slow = _generate(model, requests)
    assert fast.keys() == slow.keys() == requests.keys()
    return fast, slow


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fast_paths_match_the_pytorch_paths(arch, tiny_models, monkeypatch):
    model = str(tiny_models(arch))
    # greedy through the shortcut beside greedy through the sampler (logprobs wanted), batch 2
    fast, slow = _both_ways(model, {"plain": (PROMPTS[0], GREEDY), "scored": (PROMPTS[1], GREEDY.clone(logprobs=2))},
                            monkeypatch)
    for rid in fast:
        assert fast[rid][0] == slow[rid][0], rid
        assert len(fast[rid][0]) == 24
    f_lp, s_lp = fast["scored"][1], slow["scored"][1]
    assert f_lp is not None and s_lp is not None
    assert max(abs(a - b) for a, b in zip(f_lp, s_lp)) < 0.05  # bf16 model: norms may round 1 ulp apart
    # alone at batch 1, the greedy token banned for the first 3 (min_tokens with it as a stop token): the
    # shortcut must leave those steps to the sampler
    first = fast["plain"][0][0]
    fast, slow = _both_ways(model, {"min": (PROMPTS[0], GREEDY.clone(min_tokens=3, stop_token_ids=[first]))},
                            monkeypatch)
    assert fast["min"][0] == slow["min"][0] and fast["min"][0][0] != first


@WITH_AND_WITHOUT_NGRAM
def test_logit_bias_and_allowed_token_ids_steer_every_step(tiny_llama, spec):
    engine = _fp32_engine(tiny_llama, spec)
    prompt = PROMPTS[0]
    cases = {
        "plain": GREEDY,
        "forced": GREEDY.clone(logit_bias={42: 100.0}),  # +100 outweighs any logit of this model
        "allowed": GREEDY.clone(allowed_token_ids=[5, 9, 60]),
        "sampled": GREEDY.clone(temperature=1.0, seed=3, allowed_token_ids=[5, 9, 60], logit_bias={9: -100.0}),
        "banned": GREEDY.clone(logit_bias={t: -100.0 for t in range(0, engine.model_config.vocab_size, 2)}),
    }
    tokens = {}
    for batch in (["plain", "forced", "allowed", "banned"], ["sampled"]):  # all greedy (the argmax shortcut), then not
        for rid in batch:
            engine.add_request(rid, prompt, cases[rid])
        tokens.update(_drain(engine))
    assert tokens["forced"] == [42] * 24 != tokens["plain"]
    assert set(tokens["allowed"]) <= {5, 9, 60}
    assert set(tokens["sampled"]) <= {5, 60} and len(set(tokens["sampled"])) == 2  # 9 all but banned; sampled
    assert all(t % 2 for t in tokens["banned"])


@WITH_AND_WITHOUT_NGRAM
def test_bad_words_never_appear_in_the_output(tiny_llama, spec):
    engine = _fp32_engine(tiny_llama, spec)
    prompt = PROMPTS[0]
    greedy = GREEDY.clone(max_tokens=32)
    engine.add_request("plain", prompt, greedy)
    plain = _drain(engine)["plain"]
    # a two-token word the plain greedy output spells at 10..11, given as token ids (the tokenization is tested
    # apart): its second token must give way right there, drafted or not
    pair = plain[10:12]
    params = greedy.clone(bad_words=["w"], bad_words_token_ids=[pair])
    engine.add_request("clean", prompt, params)
    engine.add_request("sampled", prompt, params.clone(temperature=0.8, seed=5))
    outs = _drain(engine)
    for rid in ("clean", "sampled"):
        out = outs[rid]
        assert not any(out[i:i + 2] == pair for i in range(len(out) - 1)), (rid, pair, out)
    assert outs["clean"][:11] == plain[:11] and outs["clean"][11] != plain[11]


def test_bad_words_are_tokenized_at_the_start_and_after_a_space(tiny_llama):
    from cinq.engine.input_processor import bad_words_token_ids
    from cinq.model.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_llama)
    for seq in bad_words_token_ids(tok, ["hello", " world"]):
        assert tok.decode(seq).strip() in ("hello", "world")
    spellings = {tuple(s) for s in bad_words_token_ids(tok, ["hello"])}
    assert tuple(tok.encode("hello", add_special_tokens=False)) in spellings


def _fp32_engine(model, spec: dict | None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), dtype="float32", kv_cache_memory=0.05, seed=0,
                                  speculative_config=spec))


def _drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
    return tokens


def test_a_verify_row_bans_a_bad_word_after_the_drafts_before_it(tiny_llama):
    # row j of a verify step scores the token after the output plus the first j drafts: a word [a, b] bans b in the
    # row after a drafted a, not in the row before it (the verifier passes each row's drafts to the metadata)
    engine = _fp32_engine(tiny_llama, NGRAM)
    runner = engine.core.executor.runner
    a, b = 11, 12
    st = runner_mod._RequestState(GREEDY.clone(bad_words=["w"], bad_words_token_ids=[[a, b]]), [1, 2],
                                  output_ids=[7])
    logits = torch.zeros(3, runner.vocab_size)
    processed = runner.verifier._processed(logits, [st, st, st], [1, 2, 3], [[], [a], [a, 9]])
    assert torch.isinf(processed[:, b]).tolist() == [False, True, False]


def test_a_bad_word_is_spelled_both_ways_whatever_the_lengths():
    # SmolLM2 spells "Tokyo" in two tokens and " Tokyo" in one: both are banned (vLLM's same-length rule missed it)
    from cinq.engine.input_processor import bad_words_token_ids

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return {"Tokyo": [10, 11], " Tokyo": [12], "a": [5], " a": [5]}[text]

    assert bad_words_token_ids(Tok(), ["Tokyo", " a"]) == [[10, 11], [12], [5]]
