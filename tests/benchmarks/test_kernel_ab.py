"""The same-process kernel A/B: a commit's kernel sources are extracted and built beside this checkout's, both runs
compute the same results from the same weights, every round times both sides, and the speedup is the median of the
per-round ratios."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from benchmarks.decode_kernels import call_for, module_name
from benchmarks.kernel_ab import commit_sources, measure, step_weights
from cinq.kernels.cpu_native import module_from, native_module
from cinq.layers.quantization import native


@pytest.fixture(scope="module")
def head_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return commit_sources("HEAD", tmp_path_factory.mktemp("ab"))


def test_a_commits_kernel_sources_are_extracted_with_their_headers(head_sources: Path) -> None:
    names = {p.name for p in head_sources.iterdir()}
    assert {"int8_activation_linear.cpp", "small_m_gemm.cpp", "small_m.h", "bf16.h"} <= names


def test_each_kernel_names_the_extension_that_runs_it() -> None:
    assert module_name("bf16") == "small_m_gemm"
    assert module_name("q4_0 i8") == module_name("int4 g64 i8") == "int8_activation_linear"
    assert module_name("int4 g32") == "grouped_int_linear"
    assert module_name("nf4 b64") == "float_code_linear"


def test_every_round_times_both_sides_and_the_speedup_is_their_median_ratio() -> None:
    if not native.affine_kernels_available():
        pytest.skip("no native int8-activation kernel on this machine (no compiler, or no AVX2 + FMA)")
    weights = step_weights("q4_0 i8", torch.Generator().manual_seed(0))
    assert len(weights) == 30 * 4 + 1 and weights[-1][0] == "lm_head"
    cells = measure("q4_0 i8", native_module("int8_activation_linear"), None, [1, 2], [1], rounds=3)
    assert [(c["threads"], c["rows"]) for c in cells] == [(1, 1), (1, 2)]
    for c in cells:
        assert len(c["ratios"]) == 3 and all(r > 0 for r in c["ratios"])
        assert c["speedup"] == statistics.median(c["ratios"])
        assert c["weight_mb"] == pytest.approx(75.6, abs=0.5)  # the step's Q4_0 codes and fp16 scales


@pytest.mark.slow  # builds a second copy of the extension (~40 s)
def test_a_commits_build_loads_beside_this_checkouts_and_computes_the_same(head_sources: Path) -> None:
    if not native.affine_kernels_available():
        pytest.skip("no native int8-activation kernel on this machine (no compiler, or no AVX2 + FMA)")
    before = module_from("int8_activation_linear", head_sources)
    assert before is not None
    weights = step_weights("q4_0 i8", torch.Generator().manual_seed(0))
    name, w = weights[2]
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1)).bfloat16()
    # HEAD's source built on its own (no torch.ops registrations, which would clash with this checkout's): the same
    # results as the checkout's build, which is what makes the ratio a kernel's
    assert name == "gate_up_proj"
    assert torch.equal(call_for("q4_0 i8", 32, x, before)(w), call_for("q4_0 i8", 32, x)(w))


def test_a_before_that_is_not_a_commit_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from benchmarks.kernel_ab import main
    monkeypatch.setattr(sys, "argv", ["kernel_ab.py", "--before", "no-such-commit"])
    with pytest.raises(SystemExit, match="--before: 'no-such-commit' is not a commit"):
        main()
