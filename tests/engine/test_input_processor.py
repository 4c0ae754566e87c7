"""InputProcessor: vLLM's ``truncate_prompt_tokens`` keeps a prompt's last k tokens (-1: the context length) before
the context check, so a prompt too long for the model is cut instead of refused; a size past the context, or 0, is
an error naming the field. The token ids of ``logit_bias`` and ``allowed_token_ids`` are checked against the
vocabulary."""

from __future__ import annotations

import pytest

from cinq import LLM, SamplingParams
from cinq.engine.input_processor import truncate_prompt
from cinq.errors import InvalidParameterError, PromptTooLongError

CONTEXT = 64


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", num_kv_blocks=32, block_size=16, max_model_len=CONTEXT, seed=0)


def test_the_cut_keeps_the_last_tokens():
    ids = list(range(10))
    assert truncate_prompt(ids, None, 8) is ids
    assert truncate_prompt(ids, 3, 8) == [7, 8, 9]
    assert truncate_prompt(ids, -1, 8) == ids[-8:]
    assert truncate_prompt(ids, 20, 32) == ids  # shorter than k: whole
    with pytest.raises(InvalidParameterError, match=r"truncate_prompt_tokens \(9\) is greater than max_model_len"):
        truncate_prompt(ids, 9, 8)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_sampling_params_refuse_a_size_that_is_not_minus_one_or_positive(bad):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(truncate_prompt_tokens=bad)
    assert e.value.param == "truncate_prompt_tokens"


def test_a_long_prompt_is_cut_and_decodes_as_its_tail_would(llm):
    long = [(7 * i) % 200 + 3 for i in range(3 * CONTEXT)]
    greedy = dict(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(PromptTooLongError):
        llm.generate([long], SamplingParams(**greedy), use_tqdm=False)
    (cut,) = llm.generate([long], SamplingParams(**greedy, truncate_prompt_tokens=20), use_tqdm=False)
    (tail,) = llm.generate([long[-20:]], SamplingParams(**greedy), use_tqdm=False)
    assert cut.prompt_token_ids == long[-20:]
    assert cut.outputs[0].token_ids == tail.outputs[0].token_ids
    # -1: the whole context, which leaves no room for a completion: refused as the same prompt would be
    with pytest.raises(PromptTooLongError):
        llm.generate([long], SamplingParams(**greedy, truncate_prompt_tokens=-1), use_tqdm=False)
    (fits,) = llm.generate([long], SamplingParams(temperature=0, max_tokens=0, truncate_prompt_tokens=-1),
                           use_tqdm=False)
    assert fits.prompt_token_ids == long[-CONTEXT:]


def test_a_text_prompt_is_cut_in_tokens_and_its_text_follows(llm):
    text = "one two three four five six seven eight nine ten " * 3
    ids = llm.get_tokenizer().encode(text)
    (out,) = llm.generate([text], SamplingParams(max_tokens=1, truncate_prompt_tokens=5), use_tqdm=False)
    assert out.prompt_token_ids == ids[-5:]
    assert out.prompt == llm.get_tokenizer().decode(ids[-5:], skip_special_tokens=False)


def test_a_size_past_the_context_names_the_field(llm):
    with pytest.raises(InvalidParameterError) as e:
        llm.generate(["hi"], SamplingParams(truncate_prompt_tokens=CONTEXT + 1), use_tqdm=False)
    assert e.value.param == "truncate_prompt_tokens" and str(CONTEXT) in str(e.value)


def test_token_ids_of_logit_bias_and_allowed_token_ids_are_checked(llm):
    vocab = llm.engine.info.vocab_size
    for field, params in (("logit_bias", SamplingParams(logit_bias={vocab: 1.0})),
                          ("allowed_token_ids", SamplingParams(allowed_token_ids=[1, vocab + 5]))):
        with pytest.raises(InvalidParameterError, match=str(vocab)) as e:
            llm.generate(["hi"], params, use_tqdm=False)
        assert e.value.param == field
    # only end tokens allowed while min_tokens bans them: nothing could be sampled (it emitted token 0)
    eos = llm.get_tokenizer().eos_token_ids
    with pytest.raises(InvalidParameterError, match="nothing could be sampled"):
        llm.generate(["hi"], SamplingParams(min_tokens=2, allowed_token_ids=eos), use_tqdm=False)
    (ok,) = llm.generate(["hi"], SamplingParams(min_tokens=2, max_tokens=3, allowed_token_ids=eos, ignore_eos=True),
                         use_tqdm=False)
    assert set(ok.outputs[0].token_ids) <= set(eos)
