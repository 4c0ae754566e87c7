"""The native row argmax (cinq/kernels/cpu/argmax.cpp through cinq.kernels.cpu_native.argmax_native): the indices
torch.argmax gives, ties (the first maximum), NaN (the first NaN), rows of -inf and rows whose length is no
multiple of the vector widths included; and the greedy paths that take it."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels.cpu_native import argmax_native, native_module
from cinq.layers.sampler import Sampler, row_argmax
from cinq.spec.rejection import DraftBatch, rejection_sample

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def available() -> bool:
    if native_module("argmax") is None:
        pytest.skip("native argmax unavailable here (no compiler, or neither AVX-512 nor AVX2)")
    return True


def variants(x: torch.Tensor) -> list[torch.Tensor]:
    """x, x with many equal maxima (values rounded to quarters), and with NaN, +inf and -inf placed where a
    vector pass could lose them: the first and last positions, and a whole row of -inf."""
    tied = (x * 4).round() / 4
    out = [x, tied]
    v = x.shape[1]
    for fill in ("nan", "nan-last", "inf", "-inf"):
        z = tied.clone()
        if fill == "nan":
            z[0, v // 2] = NAN
            z[-1, 0] = NAN
            z[-1, v - 1] = NAN
        elif fill == "nan-last":
            z[0, v - 1] = NAN
        elif fill == "inf":
            z[0, v - 1] = INF
            z[-1, 0] = INF
        else:
            z[0] = -INF
        out.append(z)
    return out


# 1-49: below, at and past one and two vectors of 16; 49,152: SmolLM2's vocabulary; 262,144: Gemma 3's (8 rows
# of it split over the threads)
@pytest.mark.parametrize("v", [1, 15, 16, 17, 31, 32, 33, 49, 1000, 49_152, 262_144])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_same_indices_as_torch(available, threads, v, rows):
    gen = torch.Generator().manual_seed(v + rows)
    for x in variants(torch.randn(rows, v, generator=gen)):
        got = argmax_native(x)
        assert got is not None and got.dtype == torch.long
        assert torch.equal(got, x.argmax(-1))


def test_ties_take_the_first_maximum(available):
    """A row whose maximum repeats in every lane of every vector: the smallest index, as torch."""
    x = torch.zeros(2, 100)
    x[0, 37::3] = 5.0
    x[1, 99] = 5.0
    x[1, 64] = 5.0
    assert argmax_native(x).tolist() == [37, 64]


def test_inputs_it_does_not_take_fall_back(available):
    """Not float32, not contiguous, not 2-D or empty rows: None, and row_argmax answers with PyTorch's."""
    x = torch.randn(4, 40)
    for bad in (x.double(), x.bfloat16(), x.t(), x[0], torch.empty(3, 0)):
        assert argmax_native(bad) is None
    for t in (x.double(), x.t()):
        assert torch.equal(row_argmax(t), t.argmax(-1))


def test_greedy_sampling_and_verification_take_it(available, monkeypatch):
    """Sampler.greedy (plain greedy steps) and the all-greedy verify go through the native pass, and the verify
    accepts exactly the drafts that are their rows' argmax."""
    calls = []

    def counting(x: torch.Tensor) -> torch.Tensor | None:
        calls.append(tuple(x.shape))
        return argmax_native(x)

    monkeypatch.setattr("cinq.layers.sampler.argmax_native", counting)
    logits = torch.randn(3, 500)
    assert torch.equal(Sampler.greedy(logits), logits.argmax(-1))
    assert calls == [(3, 500)]
    # one request, 3 drafts: the first two are the argmax of their rows, the third is not
    target = torch.randn(4, 500)
    best = target.argmax(-1)
    drafts = DraftBatch([3], torch.tensor([int(best[0]), int(best[1]), (int(best[2]) + 1) % 500]))
    out = rejection_sample(target, drafts, torch.tensor([True]))
    assert out.num_accepted == [2] and out.token_ids == [[int(best[0]), int(best[1]), int(best[2])]]
    assert calls[-1] == (4, 500)
