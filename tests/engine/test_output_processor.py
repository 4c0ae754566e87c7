"""OutputProcessor: plain per-step EngineCoreOutputs in, RequestOutputs out (no scheduler objects involved)."""

from __future__ import annotations

import pytest

from cinq.engine.io import EngineCoreOutput
from cinq.engine.output_processor import OutputProcessor
from cinq.model.byte_tokenizer import save_byte_tokenizer
from cinq.model.tokenizer import Tokenizer
from cinq.sampling_params import OutputKind, SamplingParams
from cinq.step.runner_output import TokenLogprobs


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_pretrained(save_byte_tokenizer(tmp_path_factory.mktemp("tok")))


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_deltas_accumulate_and_finish_on_a_token_level_stop(tok):
    op = OutputProcessor(tok)
    op.add_request("r", "p", [1, 2], SamplingParams(output_kind=OutputKind.DELTA), ["r"], 0.0)
    outs, stopped, _ = op.process([EngineCoreOutput("r", ids(tok, "ab"))], ["r"])
    assert outs[0].outputs[0].text == "ab" and not outs[0].finished and not stopped
    outs, _, _ = op.process([EngineCoreOutput("r", ids(tok, "c"), finish_reason="length")], [])
    assert outs[0].outputs[0].text == "c" and outs[0].finished
    assert outs[0].outputs[0].finish_reason == "length" and "r" not in op.parents
    assert outs[0].metrics.first_scheduled_time is not None


def test_a_stop_string_asks_the_scheduler_to_end_the_request(tok):
    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(stop=["xy"]), ["r"], 0.0)
    outs, stopped, _ = op.process([EngineCoreOutput("r", ids(tok, "axyz"))], ["r"])
    assert stopped == ["r"] and outs[0].finished
    assert outs[0].outputs[0].text == "a" and outs[0].outputs[0].stop_reason == "xy"


def test_prompt_logprobs_only_chunk_produces_no_output_until_tokens_come(tok):
    op = OutputProcessor(tok)
    op.add_request("r", None, [5, 6, 7], SamplingParams(prompt_logprobs=0, max_tokens=1), ["r"], 0.0)
    tl = TokenLogprobs(6, -1.0, 3, [], [])
    outs, _, _ = op.process([EngineCoreOutput("r", new_prompt_logprobs=[(1, tl)])], ["r"])
    assert outs == []
    outs, _, _ = op.process([EngineCoreOutput("r", ids(tok, "a"), finish_reason="length")], [])
    assert outs[0].prompt_logprobs[1][6].logprob == -1.0 and outs[0].prompt_logprobs[1][6].rank == 3


def test_n_children_gather_under_their_parent(tok):
    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(n=2, output_kind=OutputKind.FINAL_ONLY), ["0_r", "1_r"], 0.0)
    outs, _, _ = op.process([EngineCoreOutput("0_r", ids(tok, "a"), finish_reason="length")], ["0_r", "1_r"])
    assert outs == []  # final-only output waits for both children
    outs, _, _ = op.process([EngineCoreOutput("1_r", ids(tok, "b"), finish_reason="length")], [])
    assert [c.text for c in outs[0].outputs] == ["a", "b"] and outs[0].finished


def test_tokens_after_a_stop_string_in_the_same_step_are_dropped(tok):
    # a speculative step may emit several tokens at once: the request ends where the stop string completes
    op = OutputProcessor(tok)
    op.add_request("r", None, [1], SamplingParams(stop=["xy"], logprobs=0), ["r"], 0.0)
    new = ids(tok, "axyzw")
    lps = [TokenLogprobs(t, -0.1, 1, [], []) for t in new]
    outs, stopped = op.process([EngineCoreOutput("r", new, lps)], ["r"])[:2]
    comp = outs[0].outputs[0]
    assert stopped == ["r"] and comp.text == "a" and comp.token_ids == ids(tok, "axy") and len(comp.logprobs) == 3


@pytest.mark.parametrize("include", [False, True])
def test_a_token_stop_leaves_its_text_out_unless_asked(tok, include):
    # as vLLM: the EOS / stop_token_ids token that ended the request is in token_ids, its text only with
    # include_stop_str_in_output; a request that ran out of tokens keeps its last token's text
    op = OutputProcessor(tok)
    comma = ids(tok, ",")[0]
    op.add_request("r", None, [1], SamplingParams(stop_token_ids=[comma], include_stop_str_in_output=include),
                   ["r"], 0.0)
    outs, _, _ = op.process([EngineCoreOutput("r", ids(tok, "1,"), finish_reason="stop", stop_reason=comma)], [])
    out = outs[0].outputs[0]
    assert out.text == ("1," if include else "1") and out.token_ids == ids(tok, "1,")
    assert out.finish_reason == "stop" and out.stop_reason == comma
    op.add_request("s", None, [1], SamplingParams(), ["s"], 0.0)
    outs, _, _ = op.process([EngineCoreOutput("s", ids(tok, "1,"), finish_reason="length")], [])
    assert outs[0].outputs[0].text == "1,"
