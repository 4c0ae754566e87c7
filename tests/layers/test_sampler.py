"""Sampler: every parameter shapes the distribution as specified; seeds repeat; logprobs and ranks are right."""

from __future__ import annotations

import pytest
import torch

from cinq.layers.sampler import Sampler, SamplingMetadata, apply_penalties

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
ROWS = 40000


def meta(rows: int, temperature: float = 1.0, **kw) -> SamplingMetadata:
    greedy = temperature == 0
    return SamplingMetadata(temperature=torch.full((rows,), temperature), greedy=torch.full((rows,), greedy),
                            all_greedy=greedy, **kw)


def freqs(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=len(LOGITS)).float() / len(tokens)


def sample(m: SamplingMetadata, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    torch.manual_seed(0)
    return Sampler()(logits.expand(ROWS, -1).clone(), m).token_ids


def test_greedy_is_argmax():
    logits = torch.randn(7, 50)
    assert torch.equal(Sampler()(logits, meta(7, 0.0)).token_ids, logits.argmax(-1))


def test_temperature_scales_the_softmax():
    for t in (0.5, 1.0, 2.0):
        expected = (LOGITS / t).softmax(-1)
        assert (freqs(sample(meta(ROWS, t))) - expected).abs().max() < 0.01


def test_top_k_keeps_k_most_likely_renormalised():
    f = freqs(sample(meta(ROWS, top_k=torch.full((ROWS,), 2))))
    assert f[2:].sum() == 0
    assert (f[:2] - LOGITS[:2].softmax(-1)).abs().max() < 0.01


def test_top_p_keeps_smallest_nucleus():
    p = LOGITS.softmax(-1)  # [0.563, 0.207, 0.126, 0.076, 0.028]: the top two hold 0.77 < 0.8, three hold 0.90
    f = freqs(sample(meta(ROWS, top_p=torch.full((ROWS,), 0.8))))
    assert f[3:].sum() == 0 and f[2] > 0
    assert (f[:3] - p[:3] / p[:3].sum()).abs().max() < 0.01


def test_top_p_boundary():
    f = freqs(sample(meta(ROWS, top_p=torch.full((ROWS,), 0.5))))
    assert f[0] == 1.0  # the top token alone already holds 56% >= 50%


def test_min_p_drops_tokens_below_fraction_of_max():
    p = LOGITS.softmax(-1)
    f = freqs(sample(meta(ROWS, min_p=torch.full((ROWS,), 0.2))))  # threshold 0.2 * 0.61 = 0.12
    keep = p >= 0.2 * p.max()
    assert f[~keep].sum() == 0
    assert (f[keep] - p[keep] / p[keep].sum()).abs().max() < 0.01


def test_penalties_follow_vllm_formulas():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    counts = torch.tensor([[2, 1, 0, 0]], dtype=torch.int32)
    seen = torch.tensor([[True, True, False, True]])  # token 3 only in the prompt
    m = meta(1, penalty_rows=torch.tensor([0]), output_counts=counts, seen_mask=seen,
             presence_penalty=torch.tensor([0.5]), frequency_penalty=torch.tensor([0.25]),
             repetition_penalty=torch.tensor([2.0]))
    out = apply_penalties(logits, m)
    expected = torch.tensor([[2.0 / 2 - 0.25 * 2 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 1.0 / 2]])
    assert torch.allclose(out, expected)


def test_banned_tokens_never_sampled_even_when_greedy_winner():
    out = Sampler()(LOGITS.expand(4, -1).clone(), meta(4, 0.0, banned=[(1, [0]), (3, [0, 1])])).token_ids
    assert out.tolist() == [0, 1, 0, 2]


def test_seeded_rows_repeat_regardless_of_batch_mates():
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    logits = torch.randn(6, 100)
    a = Sampler()(logits[2:3].clone(), meta(1, generators={0: g1})).token_ids
    b = Sampler()(logits.clone(), meta(6, generators={2: g2})).token_ids
    assert a.item() == b[2].item()
    seq_a = [Sampler()(logits[2:3].clone(), meta(1, generators={0: g1})).token_ids.item() for _ in range(20)]
    seq_b = [Sampler()(logits.clone(), meta(6, generators={2: g2})).token_ids[2].item() for _ in range(20)]
    assert seq_a == seq_b and len(set(seq_a)) > 1


def test_logprobs_are_raw_with_ranks():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    out = Sampler()(logits, meta(1, 1.0, top_k=torch.tensor([1]), max_num_logprobs=2))
    raw = logits.log_softmax(-1)
    assert out.token_ids.item() == 1  # top_k=1 forces the argmax
    assert out.logprob_token_ids.tolist() == [[1, 3]]
    assert torch.allclose(out.logprobs, raw[:, [1, 3]])
    assert out.sampled_rank.item() == 1 and abs(out.sampled_logprob.item() - raw[0, 1].item()) < 1e-6


@pytest.mark.parametrize("peak", [0.0, 12.0])  # flat rows fall back to the full sort, peaked ones take topk
def test_top_p_over_a_large_vocabulary_keeps_what_the_full_sort_keeps(peak: float, monkeypatch):
    """Against the full sort in float64: a float32 softmax over 49k sorted values rounds its normaliser enough to
    move a p = 0.99 cutoff by two tokens; the candidates' log-sum-exp normaliser matches float64 exactly here."""
    import cinq.layers.sampler as sampler
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 49152, generator=gen) * 2
    logits[:, :20] += peak
    p = torch.tensor([0.9, 0.5, 0.99, 0.2])
    fast = sampler.apply_top_k_top_p(logits, None, p)
    assert (sampler._top_p_among_candidates(logits, p) is None) == (peak == 0.0)
    monkeypatch.setattr(sampler, "TOP_P_CANDIDATES", 10 ** 9)
    exact = sampler.apply_top_k_top_p(logits.double(), None, p.double())
    assert torch.equal(torch.isinf(fast), torch.isinf(exact))
    assert torch.equal(fast[~torch.isinf(fast)].double(), exact[~torch.isinf(exact)])


@pytest.mark.parametrize("with_top_p", [False, True])
def test_top_k_sorts_only_the_k_most_likely_with_the_full_sorts_result(with_top_p: bool) -> None:
    """Rows whose largest k is small take topk(k_max); a batch mate with top-k off (k = vocab) sends the same rows
    through the full sort: the kept tokens and their logits must agree."""
    from cinq.layers.sampler import apply_top_k_top_p
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 5000, generator=gen) * 3
    k = torch.tensor([1, 7, 50, 300])
    p = torch.tensor([1.0, 0.9, 0.5, 0.99]) if with_top_p else None
    fast = apply_top_k_top_p(logits, k, p)
    full = apply_top_k_top_p(torch.cat([logits, logits[:1]]), torch.cat([k, torch.tensor([5000])]),
                             None if p is None else torch.cat([p, torch.tensor([1.0])]))[:4]
    assert torch.equal(torch.isinf(fast), torch.isinf(full))
    assert torch.equal(fast[~torch.isinf(fast)], full[~torch.isinf(full)])
    kept = (~torch.isinf(fast)).sum(-1)
    assert kept[0] == 1 and (kept <= k).all() and (not with_top_p or kept[3] < 300)
    # the runner passes the largest k it read on the host (no device sync): the same rows survive
    assert torch.equal(apply_top_k_top_p(logits, k, p, max_top_k=300), fast)


def test_logit_bias_and_allowed_tokens_shape_greedy_and_sampled_rows():
    from cinq.layers.sampler import logit_bias_row
    from cinq.sampling_params import SamplingParams

    bias = logit_bias_row(SamplingParams(logit_bias={3: 5.0}), len(LOGITS), torch.device("cpu"))
    assert bias.tolist() == [0, 0, 0, 5.0, 0]
    only = logit_bias_row(SamplingParams(allowed_token_ids=[2, 4], logit_bias={4: 1.0}), len(LOGITS),
                          torch.device("cpu"))
    assert only[[2, 4]].tolist() == [0.0, 1.0] and torch.isinf(only[[0, 1, 3]]).all()
    # greedy: the biased token wins; sampled: the distribution is softmax(logits + bias), only allowed ids drawn
    rows = torch.tensor([0])
    greedy = meta(1, 0.0, bias_rows=rows, bias=bias[None])
    assert Sampler()(LOGITS[None].clone(), greedy).token_ids.tolist() == [3]
    m = meta(ROWS, 1.0, bias_rows=torch.arange(ROWS), bias=only.expand(ROWS, -1))
    assert (freqs(sample(m)) - (LOGITS + only).softmax(-1)).abs().max() < 0.01
    # rows without a bias are untouched
    mixed = meta(2, 0.0, bias_rows=torch.tensor([1]), bias=bias[None])
    assert Sampler()(LOGITS.expand(2, -1).clone(), mixed).token_ids.tolist() == [0, 3]


def test_a_bad_words_last_token_is_banned_where_its_other_tokens_end_the_output():
    from cinq.layers.sampler import bad_word_bans

    words = [[7], [3, 4, 5], [9, 4]]
    assert bad_word_bans(words, []) == [7]
    assert bad_word_bans(words, [1, 3, 4]) == [7, 5]
    assert bad_word_bans(words, [3, 4, 9]) == [7, 4]
    assert bad_word_bans(words, [4]) == [7]  # [3, 4] is not there
    assert bad_word_bans(words, [1, 3], [4]) == [7, 5]  # the drafts before a verify row count as output
    assert bad_word_bans(words, list(range(100)) + [9]) == [7, 4]
