"""Speculative decoding is exact at the engine level: with speculation on, the sampled continuations follow the
same distribution as with it off (temperature 0.7, top-p 0.9), per method, and a deliberately broken verifier is
caught by the same test.

Each arm samples ``N`` continuations of the same prompt (each request its own seed; the two arms use disjoint
seeds, so their samples are independent) and the test compares the empirical distributions of the token at
output positions 2..4 (position 1 comes from the prefill, which speculation never touches). Bound: for an
empirical distribution of n samples over K outcomes, ``P(||p_hat - p||_1 >= eps) <= 2^K exp(-n eps^2 / 2)``
(Bretagnolle-Huber-Carol / Weissman et al. 2003); with both arms drawn from the same p, the total-variation
distance ``TV = ||p_hat_on - p_hat_off||_1 / 2 <= eps`` except with probability ``2 * 2^K exp(-n eps^2 / 2)``,
so ``eps = sqrt(2 (K ln 2 + ln(2 / delta)) / n)`` at ``delta = 1e-6`` per comparison (K: the tokens seen in
either arm, plus one for all the others). A verifier that keeps every draft the target allows (both the
one-hot path of n-gram drafts and the probabilistic path of sampled EAGLE-3 drafts) or that ignores the
proposer's q (the probabilistic path) moves these distributions far past the bound.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.model.loader import load_model
from cinq.spec import verifier
from cinq.spec.eagle import save_eagle_head
from cinq.spec.eagle3 import new_eagle3_head
from cinq.spec.rejection import DraftBatch

N = 400  # samples per arm
POSITIONS = (1, 2, 3)  # output positions (0-based) that verification decides
DELTA = 1e-6
PROMPT = "the cat and the cat and the cat and"


def tv_bound(k: int, n: int = N, delta: float = DELTA) -> float:
    """The largest TV distance two n-sample empirical distributions of the same p over k outcomes reach, except
    with probability ``delta`` (see the module docstring)."""
    return math.sqrt(2 * (k * math.log(2) + math.log(2 / delta)) / n)


def continuations(model: Path, speculative_config: dict | None, seed0: int) -> list[list[int]]:
    llm = LLM(str(model), dtype="float32", speculative_config=speculative_config, max_num_seqs=128)
    params = [SamplingParams(temperature=0.7, top_p=0.9, max_tokens=len(POSITIONS) + 1, seed=seed0 + i,
                             ignore_eos=True) for i in range(N)]
    return [list(o.outputs[0].token_ids) for o in llm.generate([PROMPT] * N, params)]


def worst_excess(on: list[list[int]], off: list[list[int]]) -> float:
    """max over positions of TV(on, off) - bound: > 0 means the two differ beyond chance."""
    worst = -1.0
    for j in POSITIONS:
        a, b = Counter(s[j] for s in on), Counter(s[j] for s in off)
        tv = sum(abs(a[t] / len(on) - b[t] / len(off)) for t in set(a) | set(b)) / 2
        worst = max(worst, tv - tv_bound(len(set(a) | set(b)) + 1))
    return worst


@pytest.fixture(scope="module")
def plain(tiny_llama: Path) -> list[list[int]]:
    return continuations(tiny_llama, None, 10_000)


@pytest.fixture(scope="module")
def eagle3_head(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = load_model(tiny_llama, torch.float32)
    vocab = target.config.vocab_size
    head = new_eagle3_head(target, torch.arange(0, vocab, 2), seed=1)  # every other token: a reduced vocabulary
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2 and name != "lm_head.weight":
                p.normal_(0, 0.3)
    return save_eagle_head(head, tmp_path_factory.mktemp("eagle3"))


def methods(head: Path) -> dict[str, dict]:
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
        "eagle3": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3,
                   "draft_sample_method": "probabilistic"},
    }


def test_the_bound_is_what_the_docstring_says() -> None:
    assert tv_bound(10, 400) == pytest.approx(math.sqrt(2 * (10 * math.log(2) + math.log(2e6)) / 400))
    assert tv_bound(10, 1600) == pytest.approx(tv_bound(10, 400) / 2)


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_sampling_with_speculation_follows_the_plain_distribution(tiny_llama: Path, plain, eagle3_head: Path,
                                                                  method: str) -> None:
    llm_cfg = methods(eagle3_head)[method]
    on = continuations(tiny_llama, llm_cfg, 20_000)
    assert worst_excess(on, plain) <= 0


def _keep_every_allowed_draft(real):  # noqa: ANN001, ANN202
    def broken(target_probs, drafts: DraftBatch, greedy, generators=None, generator=None):  # noqa: ANN001, ANN202
        # q = 0 at every draft: u * q < p holds wherever the target gives the draft any probability
        zero = torch.zeros(drafts.token_ids.numel(), target_probs.shape[-1])
        return real(target_probs, DraftBatch(drafts.num_draft_tokens, drafts.token_ids, zero), greedy, generators,
                    generator)
    return broken


def _ignore_q(real):  # noqa: ANN001, ANN202
    def broken(target_probs, drafts: DraftBatch, greedy, generators=None, generator=None):  # noqa: ANN001, ANN202
        return real(target_probs, DraftBatch(drafts.num_draft_tokens, drafts.token_ids, None), greedy, generators,
                    generator)
    return broken


@pytest.mark.parametrize("method,break_it", [("ngram", _keep_every_allowed_draft),
                                             ("eagle3", _keep_every_allowed_draft), ("eagle3", _ignore_q)])
def test_a_broken_verifier_fails_the_same_check(tiny_llama: Path, plain, eagle3_head: Path, method: str, break_it,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifier, "rejection_sample", break_it(verifier.rejection_sample))
    on = continuations(tiny_llama, methods(eagle3_head)[method], 20_000)
    assert worst_excess(on, plain) > 0
