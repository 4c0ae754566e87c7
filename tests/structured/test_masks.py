"""The runner's masks: a verify step's rows masked at the grammar state after each row's path (chains and trees,
walked incrementally) equal row-by-row fresh matchers; forbidden paths leave their row unmasked; the matcher ends
where it started; unconstrained rows are untouched."""

from __future__ import annotations

import pytest
import torch

from cinq.assets import resolve_model_path
from cinq.engine.structured_outputs import grammar_tokenizer
from cinq.structured.manager import make_backend
from cinq.structured.masks import advance, mask_logits
from cinq.structured.params import StructuredOutputsParams


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def setup(request):
    path = resolve_model_path("cinq-tiny")
    tok = grammar_tokenizer(path)
    backend = make_backend(request.param, tok, tok.vocab_size)
    return tok, backend, backend.compile(StructuredOutputsParams(regex="(ab|cd)+!"))


def test_paths_give_the_masks_of_fresh_matchers(setup) -> None:
    tok, backend, compiled = setup
    ids = {s: tok.encode(s, add_special_tokens=False) for s in ("ab", "cd", "!", "x")}
    a, c, bang, x = ids["ab"][0], ids["cd"][0], ids["!"][0], ids["x"][0]
    # one request's tree (root, a, a->c, c, a->x forbidden, a->x->c under a forbidden token), then a plain row
    paths = [[], [a], [a, c], [c], [a, x], [a, x, c], []]
    m = backend.matcher(compiled)
    other = backend.matcher(compiled)
    advance(other, [a], "other")
    logits = torch.randn(len(paths), tok.vocab_size)
    out = mask_logits(logits.clone(), [m] * 6 + [other], paths)
    for r, path in enumerate(paths[:6]):
        fresh = backend.matcher(compiled)
        ok = all(fresh.accept_token(t) for t in path)
        expect = mask_logits(logits[r:r + 1].clone(), [fresh]) if ok else logits[r:r + 1]
        assert torch.equal(out[r:r + 1], expect), (r, path)
    assert torch.equal(out[6:], mask_logits(logits[6:].clone(), [backend.matcher(compiled)], [[a]]))
    assert out[4].isinf().sum() == 0 and out[2].isinf().any()  # the unreachable row is left unmasked
    # the matcher is back at the start: it accepts the first token again, and no unconstrained row moved
    assert m.accept_token(a) and not backend.matcher(compiled).accept_token(bang)
    plain = mask_logits(logits.clone(), [None] * len(paths))
    assert torch.equal(plain, logits)
