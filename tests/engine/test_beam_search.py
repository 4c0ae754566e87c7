"""Beam search (vLLM's front-end algorithm): checked against an exhaustive search where the beam covers every
continuation, against greedy at width 1, and for its stops (end tokens, length, the context) and its refusals."""

from __future__ import annotations

import math

import pytest
import torch

from cinq import LLM, BeamSearchParams, SamplingParams
from cinq.engine.beam_search import MAX_BEAM_WIDTH, BeamSearch
from cinq.errors import InvalidParameterError
from cinq.outputs import CompletionOutput, Logprob, RequestOutput

PROMPT = [3, 17, 29, 41, 5]


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=16, max_model_len=64, seed=0)


def _logprobs(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """The model's next-token log-probabilities after ``tokens`` (its own forward pass, as a reference)."""
    (out,) = llm.generate([{"prompt_token_ids": tokens}], SamplingParams(max_tokens=1, logprobs=20,
                                                                         temperature=0, ignore_eos=True))
    lp = torch.full((llm.engine.vocab_size,), -math.inf)
    for t, v in out.outputs[0].logprobs[0].items():
        lp[t] = v.logprob
    return lp


def test_width_one_is_greedy(llm):
    (greedy,) = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=8, temperature=0,
                                                                            ignore_eos=True))
    (beam,) = llm.beam_search([{"prompt_token_ids": PROMPT}], BeamSearchParams(beam_width=1, max_tokens=8,
                                                                                ignore_eos=True))
    (best,) = beam.sequences
    assert best.tokens[len(PROMPT):] == greedy.outputs[0].token_ids
    assert best.cum_logprob == pytest.approx(sum(best.logprobs)) and best.finish_reason == "length"


def test_two_steps_match_a_search_written_out(llm):
    width = 3
    (beam,) = llm.beam_search([{"prompt_token_ids": PROMPT}], BeamSearchParams(width, max_tokens=2,
                                                                                ignore_eos=True, length_penalty=0))
    # the width best first tokens live on; each is extended by its top 2 * width: the best width of those
    first = _logprobs(llm, PROMPT)
    scored = []
    for a in first.topk(width).indices.tolist():
        second = _logprobs(llm, PROMPT + [a])
        for b, lp in zip(*[x.tolist() for x in reversed(second.topk(2 * width))]):
            scored.append((first[a].item() + lp, [a, b]))
    scored.sort(reverse=True)
    assert [s.tokens[len(PROMPT):] for s in beam.sequences] == [toks for _, toks in scored[:width]]
    assert [s.cum_logprob for s in beam.sequences] == pytest.approx([lp for lp, _ in scored[:width]], abs=1e-4)
    assert beam.sequences[0].text == llm.get_tokenizer().decode(beam.sequences[0].tokens[len(PROMPT):])


def _step(top: dict[int, float]) -> RequestOutput:
    lps = {t: Logprob(v, rank) for rank, (t, v) in enumerate(sorted(top.items(), key=lambda kv: -kv[1]), 1)}
    return RequestOutput("r", None, [], [CompletionOutput(0, "", [0], logprobs=[lps])], True)


def test_an_end_token_finishes_a_beam_and_the_length_penalty_ranks_the_results():
    search = BeamSearch([1], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=1.0), [0], 64)
    search.advance([_step({0: -0.5, 5: -1.0, 6: -2.0, 7: -3.0})])  # the end token closes the best extension
    assert [b.tokens for b in search.finished] == [[1, 0]] and [b.tokens for b in search.live] == [[1, 5], [1, 6]]
    search.advance([_step({8: -0.1, 0: -5.0, 9: -6.0, 10: -7.0}), _step({11: -0.1, 12: -0.2, 0: -9.0, 13: -9.5})])
    assert not search.done
    search.advance([_step({14: -0.1, 15: -8.0, 16: -8.5, 17: -9.0}), _step({18: -0.1, 19: -8.0, 0: -8.5, 1: -9.0})])
    assert search.done  # max_tokens
    best = search.result()
    # scores: [1, 0] -0.5 / 1; [1, 5, 8, 14] -1.2 / 3 = -0.4 best; the rest lower
    assert [b.tokens for b in best] == [[1, 5, 8, 14], [1, 0]] and [b.finish_reason for b in best] == ["length",
                                                                                                         "stop"]


def test_the_context_bounds_the_steps():
    search = BeamSearch(list(range(60)), BeamSearchParams(beam_width=2, max_tokens=100), [], 64)
    assert search.room == 4


@pytest.mark.parametrize("kw,field", [({"beam_width": 0}, "beam_width"), ({"beam_width": MAX_BEAM_WIDTH + 1},
                                      "beam_width"), ({"max_tokens": 0}, "max_tokens"),
                                     ({"length_penalty": "x"}, "length_penalty"), ({"temperature": -1}, "temperature")])
def test_bad_params_name_the_field(kw, field):
    with pytest.raises(InvalidParameterError) as e:
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **kw})
    assert e.value.param == field
