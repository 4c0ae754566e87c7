"""Both grammar backends behind one interface: compile errors as ValueError, masks, accept / rollback; the
manager caches compiles, bounds them by a timeout and names the field; the bitmask apply matches the torch
reference."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from cinq.assets import resolve_model_path
from cinq.engine.structured_outputs import grammar_tokenizer, structured_output_manager
from cinq.errors import InvalidParameterError
from cinq.structured import bitmask as bm
from cinq.structured.manager import StructuredOutputManager, make_backend
from cinq.structured.params import StructuredOutputsParams

VOCAB = 49152


@pytest.fixture(scope="module")
def tiny_path():
    return resolve_model_path("cinq-tiny")


def allowed(m, vocab: int) -> set[int]:
    mask = bm.allocate_bitmask(1, vocab)
    m.fill_bitmask(mask, 0)
    return set(torch.nonzero(bm.bitmask_to_bool(mask, vocab)[0]).flatten().tolist())


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_backend_masks_accept_and_rollback(tiny_path, name: str) -> None:
    tok = grammar_tokenizer(tiny_path)
    vocab = tok.vocab_size
    backend = make_backend(name, tok, vocab)
    m = backend.matcher(backend.compile(StructuredOutputsParams(regex="(yes|no)!")))
    start = allowed(m, vocab)
    bang = tok.encode("!", add_special_tokens=False)
    assert bang[0] not in start and tok.encode("yes", add_special_tokens=False)[0] in start
    ids = tok.encode("yes", add_special_tokens=False)
    assert all(m.accept_token(t) for t in ids)
    assert not m.accept_token(tok.encode("x", add_special_tokens=False)[0])  # forbidden: state unchanged
    m.rollback(len(ids))
    assert allowed(m, vocab) == start
    for t in ids + bang:
        assert m.accept_token(t)
    eos = sorted(allowed(m, vocab))
    assert eos and set(eos) <= set(tok.eos_token_ids)  # a complete grammar allows only end-of-sequence tokens
    assert m.accept_token(eos[0]) and m.is_terminated()
    with pytest.raises(ValueError):
        backend.compile(StructuredOutputsParams(regex="(unclosed"))


def test_manager_caches_names_the_field_and_times_out(tiny_path, monkeypatch) -> None:
    from cinq.model.config import ModelConfig
    mgr = structured_output_manager(tiny_path, ModelConfig.from_pretrained(tiny_path).vocab_size)
    spec = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert mgr.compile(spec) is mgr.compile(spec)
    with pytest.raises(InvalidParameterError) as e:
        mgr.compile(StructuredOutputsParams(json={"type": "nonsense"}))
    assert e.value.param == "structured_outputs.json"
    with pytest.raises(InvalidParameterError, match="response_format") as e:
        mgr.compile(StructuredOutputsParams(grammar="root ::= ("), field="response_format")
    assert e.value.param == "response_format"
    release = threading.Event()
    slow = StructuredOutputManager(mgr.backend, compile_timeout_s=0.05)
    monkeypatch.setattr(slow, "_timed_compile", lambda key, s: release.wait(5))
    with pytest.raises(InvalidParameterError, match="did not compile within 0.05 s"):
        slow.compile(StructuredOutputsParams(regex="a+"))
    release.set()


@dataclass
class PlainTokenizer:
    """Not cinq's Tokenizer: only the fields GrammarTokenizer names."""

    backend_tokenizer: Any
    eos_token_ids: list[int]


def test_a_backend_needs_only_the_grammar_tokenizer_protocol(tiny_path) -> None:
    tok = grammar_tokenizer(tiny_path)
    stop = tok.eos_token_ids[-1]
    backend = make_backend("xgrammar", PlainTokenizer(tok.backend_tokenizer, [stop]), tok.vocab_size)
    m = backend.matcher(backend.compile(StructuredOutputsParams(regex="yes")))
    assert all(m.accept_token(t) for t in tok.encode("yes", add_special_tokens=False))
    assert allowed(m, tok.vocab_size) == {stop}  # the given eos ends the grammar, and only it


def test_the_manager_loads_its_tokenizer_once(tiny_path) -> None:
    loads: list[int] = []

    def load() -> Any:
        loads.append(1)
        return grammar_tokenizer(tiny_path)

    first = StructuredOutputManager.for_model("loads-once", VOCAB, load)
    assert StructuredOutputManager.for_model("loads-once", VOCAB, load) is first and loads == [1]


def test_additive_apply_matches_the_bit_reference() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.randint(-2**31, 2**31 - 1, (3, 4), dtype=torch.int32, generator=g)
    logits = torch.randn(6, 150, generator=g)  # 150 > 4 * 32: the padded LM head's tail is forbidden
    out = bm.apply_token_bitmask(logits.clone(), mask, [0, 3, 5])
    assert torch.equal(out[[1, 2, 4]], logits[[1, 2, 4]])  # rows without a mask untouched
    allowed = bm.bitmask_to_bool(mask, 128)
    for i, r in enumerate([0, 3, 5]):
        assert torch.equal(out[r, :128].isinf(), ~allowed[i]) and out[r, 128:].isinf().all()
        assert torch.equal(out[r, :128][allowed[i]], logits[r, :128][allowed[i]])  # allowed values exact
    contiguous = bm.apply_token_bitmask(logits.clone(), mask, [1, 2, 3])
    assert torch.equal(contiguous[1:4].isinf(), bm.apply_token_bitmask(logits[1:4].clone(), mask).isinf())
    import xgrammar
    ref = logits[:3, :128].clone().contiguous()
    xgrammar.apply_token_bitmask_inplace(ref, mask)
    assert torch.equal(bm.apply_token_bitmask(logits[:3, :128].clone(), mask), ref)
