"""Speculative decoding is exact at the engine level: with speculation on, the sampled continuations follow the
same distribution as with it off (temperature 0.7, top-p 0.9), per method, and a deliberately broken verifier is
caught by the same test.

Each arm samples ``N`` continuations of the same prompt (each request its own seed; the two arms use disjoint
seeds, so their samples are independent) and the test compares the empirical distributions of the token at
output positions 2..4 (position 1 comes from the prefill, which speculation never touches), coarsened to a
partition fixed before sampling: each token of the prompt on its own (what n-gram lookup drafts), then every
other token by parity (the EAGLE-3 head below drafts only even ids). Coarsening never increases the TV
distance, so the test stays exact; a small fixed K keeps its bound tight on the tiny random target, whose
distributions at temperature 0.7 spread over hundreds of tokens. Bound: for an
empirical distribution of n samples over K outcomes, ``P(||p_hat - p||_1 >= eps) <= 2^K exp(-n eps^2 / 2)``
(Bretagnolle-Huber-Carol / Weissman et al. 2003); with both arms drawn from the same p, the total-variation
distance ``TV = ||p_hat_on - p_hat_off||_1 / 2 <= eps`` except with probability ``2 * 2^K exp(-n eps^2 / 2)``,
so ``eps = sqrt(2 (K ln 2 + ln(2 / delta)) / n)`` at ``delta = 1e-6`` per comparison. A verifier that skips the check (keeps
every draft) is caught on both of the verifier's paths: EAGLE-3's sampled drafts with their q
(``draft_sample_method: probabilistic``) and its greedy drafts, verified with a one-hot q, and on the tree path
(a static tree's greedy candidates, accepted one sibling after another against the residual). (Dropping q alone
would not do as a broken variant: for the first draft, accepting with p(x) and resampling from p without x
still emits exactly p.) Methods: n-gram lookup, a draft model (another random model of the same tokenizer),
Medusa heads and EAGLE-3 (sampled drafts, greedy drafts, prompt lookup first, a static tree).
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
from cinq.spec.medusa import new_medusa_heads, save_medusa_heads
from cinq.spec.rejection import DraftBatch, target_rows
from tests.model_factory import build_tiny_model

N = 600  # samples per arm
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


def partition(prompt_ids: list[int]):  # noqa: ANN201
    """token -> its cell: a prompt token's own cell, else "even" / "odd" (see the module docstring)."""
    own = set(prompt_ids)
    return lambda t: t if t in own else ("even", "odd")[t % 2]


def worst_excess(on: list[list[int]], off: list[list[int]], cell) -> float:  # noqa: ANN001
    """max over positions of TV(on, off) - bound over the partition ``cell``: > 0 means the two differ beyond
    chance."""
    worst = -1.0
    for j in POSITIONS:
        a, b = Counter(cell(s[j]) for s in on), Counter(cell(s[j]) for s in off)
        cells = set(a) | set(b)
        tv = sum(abs(a[c] / len(on) - b[c] / len(off)) for c in cells) / 2
        worst = max(worst, tv - tv_bound(len(cells)))
    return worst


@pytest.fixture(scope="module")
def plain(tiny_llama: Path) -> list[list[int]]:
    return continuations(tiny_llama, None, 10_000)


@pytest.fixture(scope="module")
def cell(tiny_llama: Path):  # noqa: ANN201
    from cinq.model.tokenizer import Tokenizer
    return partition(Tokenizer.from_pretrained(tiny_llama).encode(PROMPT))


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


@pytest.fixture(scope="module")
def drafters(tiny_llama: Path, eagle3_head: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model-backed proposers' folders: EAGLE-3's head, a draft model, Medusa heads."""
    target = load_model(tiny_llama, torch.float32)
    torch.manual_seed(2)
    medusa = new_medusa_heads(target, num_heads=3)
    with torch.no_grad():  # distinct, confident guesses (the default init proposes little)
        for p in medusa.parameters():
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * 0.3)
    # the draft model: another random model of the same tokenizer whose LM head favours even ids (as the EAGLE-3
    # head drafts only even ids), so that drafts kept unchecked show in the parity cells
    from transformers import AutoModelForCausalLM
    folder = build_tiny_model(tmp_path_factory.mktemp("draft"), "llama", seed=1)
    draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        w = draft.get_output_embeddings().weight
        w[1::2] = 0.0
        w[0::2] *= 4.0
    draft.save_pretrained(folder)
    return {"eagle3": eagle3_head, "medusa": save_medusa_heads(medusa, tmp_path_factory.mktemp("medusa")),
            "draft": folder}


def methods(heads: dict[str, Path]) -> dict[str, dict]:
    head = heads["eagle3"]
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
        "draft_model": {"method": "draft_model", "model": str(heads["draft"]), "num_speculative_tokens": 3,
                        "draft_sample_method": "probabilistic"},
        "medusa": {"method": "medusa", "model": str(heads["medusa"]), "num_speculative_tokens": 3,
                   "draft_sample_method": "probabilistic"},
        # a static tree: each node's greedy candidates, verified sibling by sibling (cinq/spec/tree.py)
        "eagle3-tree": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 4,
                        "speculative_token_tree": [[0], [1], [0, 0], [1, 0]]},
        "eagle3": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3,
                   "draft_sample_method": "probabilistic"},
        # greedy drafts: the verifier's one-hot q path
        "eagle3-greedy": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3},
        # prompt lookup first: one step verifies lookup drafts (one-hot q) beside the head's sampled ones
        "eagle3-lookup": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3,
                          "draft_sample_method": "probabilistic", "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    }


def test_the_bound_is_what_the_docstring_says() -> None:
    assert tv_bound(10, 400) == pytest.approx(math.sqrt(2 * (10 * math.log(2) + math.log(2e6)) / 400))
    assert tv_bound(10, 1600) == pytest.approx(tv_bound(10, 400) / 2)
    cell = partition([5, 9])
    assert [cell(t) for t in (5, 9, 4, 7)] == [5, 9, "even", "odd"]


@pytest.mark.parametrize("method", ["ngram", "draft_model", "medusa", "eagle3", "eagle3-greedy", "eagle3-lookup",
                                    "eagle3-tree"])
def test_sampling_with_speculation_follows_the_plain_distribution(tiny_llama: Path, plain, cell, drafters,
                                                                  method: str) -> None:
    on = continuations(tiny_llama, methods(drafters)[method], 20_000)
    assert worst_excess(on, plain, cell) <= 0


def _accept_every_draft(real):  # noqa: ANN001, ANN202
    """A verifier that skips the check: every draft is kept (its row made one-hot at the draft), then the bonus
    token is drawn from the target as usual."""
    def broken(target_probs, drafts: DraftBatch, greedy, generators=None, generator=None):  # noqa: ANN001, ANN202
        probs = target_probs.clone()
        starts, _ = target_rows(drafts.num_draft_tokens)
        n = 0
        for start, k in zip(starts, drafts.num_draft_tokens):
            for j in range(k):
                probs[start + j] = 0.0
                probs[start + j, int(drafts.token_ids[n])] = 1.0
                n += 1
        return real(probs, DraftBatch(drafts.num_draft_tokens, drafts.token_ids, None), greedy, generators,
                    generator)
    return broken


def _accept_every_tree_draft(real):  # noqa: ANN001, ANN202
    """A tree verifier that skips the check: at every node its first child is kept (the node's row made one-hot
    at the child's token); past the last kept node the target is sampled as usual."""
    def broken(probs, tokens, parents, greedy, generators=None, generator=None):  # noqa: ANN001, ANN202
        probs = probs.clone()
        at = 0
        for toks, par in zip(tokens, parents):
            for node in range(len(par)):
                first = next((c for c in range(1, len(par)) if par[c] == node), None)
                if first is not None:
                    probs[at + node] = 0.0
                    probs[at + node, toks[first]] = 1.0
            at += len(par)
        return real(probs, tokens, parents, greedy, generators, generator)
    return broken


@pytest.mark.parametrize("method", ["draft_model", "medusa", "eagle3", "eagle3-greedy", "eagle3-lookup",
                                    "eagle3-tree"])
def test_a_broken_verifier_fails_the_same_check(tiny_llama: Path, plain, cell, drafters, method: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifier, "rejection_sample", _accept_every_draft(verifier.rejection_sample))
    monkeypatch.setattr(verifier, "verify_tree", _accept_every_tree_draft(verifier.verify_tree))
    on = continuations(tiny_llama, methods(drafters)[method], 20_000)
    assert worst_excess(on, plain, cell) > 0
