"""--chat-template (vLLM's): a template file's path or the template inline replaces the tokenizer's, in the offline
engine, the server's chat route and /tokenize; a path that is no file, or a template that does not compile, is an
error naming chat_template before anything loads or changes."""

from __future__ import annotations

import httpx
import pytest

from cinq import LLM, SamplingParams
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.model.chat_template import cut_after_final_message, load_chat_template
from cinq.model.tokenizer import Tokenizer
from tests.server.harness import serve

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}>{% endif %}")
HI = [{"role": "user", "content": "hi"}]


def test_a_path_is_read_and_an_inline_template_is_itself(tmp_path):
    file = tmp_path / "t.jinja"
    file.write_text(TEMPLATE)
    assert load_chat_template(str(file)) == TEMPLATE == load_chat_template(TEMPLATE)


@pytest.mark.parametrize("value,words", [("no/such/file.jinja", "is not a file"), ("", "file path or"),
                                         ("{% for %}", "does not compile")])
def test_bad_values_name_the_field(tiny_llama, value, words):
    with pytest.raises(InvalidParameterError, match=words) as e:
        Tokenizer.from_pretrained(tiny_llama, chat_template=value)
    assert e.value.param == "chat_template"
    if "compile" not in words:  # refused by the config already, before any loading
        with pytest.raises(InvalidParameterError, match=words):
            EngineConfig(model=str(tiny_llama), chat_template=value)


def test_a_bad_template_leaves_the_tokenizer_as_it_was(tiny_llama):
    tok = Tokenizer.from_pretrained(tiny_llama)
    before = tok.apply_chat_template(HI)
    with pytest.raises(InvalidParameterError):
        tok.use_chat_template("{% if %}")
    assert tok.apply_chat_template(HI) == before


def test_the_offline_engine_renders_with_it(tiny_llama, tmp_path):
    file = tmp_path / "t.jinja"
    file.write_text(TEMPLATE)
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16, chat_template=str(file), seed=0)
    tok = llm.get_tokenizer()
    assert tok.apply_chat_template(HI) == "[user] hi\n>"
    (out,) = llm.chat(HI, SamplingParams(max_tokens=1))
    assert out.prompt_token_ids == tok.encode("[user] hi\n>", add_special_tokens=False)


def test_the_server_renders_with_it(tiny_llama):
    tokenizer = Tokenizer.from_pretrained(tiny_llama)
    with serve(tiny_llama, chat_template=TEMPLATE) as s:
        r = httpx.post(s.url + "/tokenize", json={"messages": HI}, timeout=30)
        assert r.json()["tokens"] == tokenizer.encode("[user] hi\n>", add_special_tokens=False)
        chat = httpx.post(s.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 1}, timeout=60)
        assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == len(r.json()["tokens"])


def test_llm_chat_takes_vllms_chat_arguments(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16, seed=0)
    tok = llm.get_tokenizer()
    own = tok.apply_chat_template(HI)
    greedy = SamplingParams(max_tokens=1, temperature=0)
    # a template for this call only
    (out,) = llm.chat(HI, greedy, chat_template=TEMPLATE)
    assert out.prompt_token_ids == tok.encode("[user] hi\n>", add_special_tokens=False)
    assert tok.apply_chat_template(HI) == own
    # the final message left open, as the server's continue_final_message
    convo = [*HI, {"role": "assistant", "content": "Once upon"}]
    (cont,) = llm.chat(convo, greedy, chat_template=TEMPLATE, continue_final_message=True)
    assert cont.prompt_token_ids == tok.encode("[user] hi\n[assistant] Once upon", add_special_tokens=False)
    with pytest.raises(InvalidParameterError, match="Cannot set both") as e:
        llm.chat(convo, greedy, continue_final_message=True, add_generation_prompt=True)
    assert e.value.param == "continue_final_message"
    # the template's extra variables
    (kw,) = llm.chat(HI, greedy, chat_template="{{ greeting }}{{ messages[0]['content'] }}",
                     chat_template_kwargs={"greeting": "Hey "})
    assert kw.prompt_token_ids == tok.encode("Hey hi", add_special_tokens=False)


def test_the_cut_is_right_after_the_final_content():
    rendered = "<u>hi<end><a>Sure, here<end>"
    assert cut_after_final_message(rendered, "Sure, here") == "<u>hi<end><a>Sure, here"
    # the last occurrence: earlier turns may say the same words
    assert cut_after_final_message("<a>ok<end><a>ok<end>", "ok") == "<a>ok<end><a>ok"
    # trailing whitespace: kept where the template kept it, dropped where the template trimmed it
    assert cut_after_final_message("<a>Sure \n<end>", "Sure \n") == "<a>Sure \n"
    assert cut_after_final_message("<a>Sure<end>", "Sure \n") == "<a>Sure"


@pytest.mark.parametrize("rendered,content,words", [
    ("<a>x<end>", "  ", "does not appear"),
    ("<a>x<end>", "absent", "does not appear"),
])
def test_the_cut_refuses_what_it_cannot_find(rendered, content, words):
    with pytest.raises(InvalidParameterError, match=words) as e:
        cut_after_final_message(rendered, content)
    assert e.value.param == "continue_final_message"
