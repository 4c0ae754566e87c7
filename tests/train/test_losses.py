import math

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.train import losses as L
from cinq.train.objective import Objective

P = [0.7, 0.2, 0.1]  # teacher
Q = [0.5, 0.3, 0.2]  # student


def _logits(probs):
    return torch.tensor([math.log(x) for x in probs], dtype=torch.float64).float()


def _kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b))


def _softmax_t(probs, T):
    w = [x ** (1 / T) for x in probs]
    z = sum(w)
    return [x / z for x in w]


S, T_ = _logits(Q), _logits(P)


def test_cross_entropy_by_hand():
    s = torch.stack([S, _logits(P)])
    y = torch.tensor([0, 2])
    expected = (-math.log(0.5) - math.log(0.1)) / 2
    assert L.cross_entropy(s, y).item() == pytest.approx(expected, rel=1e-5)
    assert L.cross_entropy(s, y, torch.tensor([False, True])).item() == pytest.approx(-math.log(0.1), rel=1e-5)


def test_forward_and_reverse_kl_by_hand_with_temperature():
    assert L.forward_kl(S, T_).item() == pytest.approx(_kl(P, Q), rel=1e-5)
    assert L.reverse_kl(S, T_).item() == pytest.approx(_kl(Q, P), rel=1e-5)
    pt, qt = _softmax_t(P, 2.0), _softmax_t(Q, 2.0)
    assert L.forward_kl(S, T_, temperature=2.0).item() == pytest.approx(4 * _kl(pt, qt), rel=1e-5)
    assert L.reverse_kl(S, T_, temperature=2.0).item() == pytest.approx(4 * _kl(qt, pt), rel=1e-5)
    assert L.forward_kl(S, S).item() == pytest.approx(0.0, abs=1e-7)


def test_generalized_jsd_by_hand_and_its_limits():
    beta = 0.3
    m = [beta * p + (1 - beta) * q for p, q in zip(P, Q)]
    expected = beta * _kl(P, m) + (1 - beta) * _kl(Q, m)
    assert L.generalized_jsd(S, T_, beta).item() == pytest.approx(expected, rel=1e-5)
    # End points are the named divergences, and the interior tends to them.
    assert L.generalized_jsd(S, T_, 0.0).item() == pytest.approx(_kl(P, Q), rel=1e-6)
    assert L.generalized_jsd(S, T_, 1.0).item() == pytest.approx(_kl(Q, P), rel=1e-6)
    s64, t64 = S.double(), T_.double()
    eps = 1e-5
    assert (L.generalized_jsd(s64, t64, eps) / eps).item() == pytest.approx(_kl(P, Q), rel=1e-3)
    assert (L.generalized_jsd(s64, t64, 1 - eps) / eps).item() == pytest.approx(_kl(Q, P), rel=1e-3)
    # The symmetric JSD (beta = 1/2) is bounded by log 2.
    assert 0 < L.generalized_jsd(S, T_, 0.5).item() < math.log(2)


def test_skew_kls_by_hand_and_their_limits():
    lam = 0.2
    m = [lam * p + (1 - lam) * q for p, q in zip(P, Q)]
    assert L.skew_kl(S, T_, lam).item() == pytest.approx(_kl(P, m), rel=1e-5)
    mr = [(1 - lam) * p + lam * q for p, q in zip(P, Q)]
    assert L.skew_reverse_kl(S, T_, lam).item() == pytest.approx(_kl(Q, mr), rel=1e-5)
    assert L.skew_kl(S, T_, 0.0).item() == pytest.approx(_kl(P, Q), rel=1e-6)
    assert L.skew_reverse_kl(S, T_, 0.0).item() == pytest.approx(_kl(Q, P), rel=1e-6)
    assert L.skew_kl(S, T_, 1.0).item() == pytest.approx(0.0, abs=1e-7)
    assert L.skew_reverse_kl(S, T_, 1.0).item() == pytest.approx(0.0, abs=1e-7)


def test_total_variation_by_hand():
    assert L.total_variation(S, T_).item() == pytest.approx(0.5 * (0.2 + 0.1 + 0.1), rel=1e-5)


def test_mask_averages_only_kept_tokens():
    s = torch.randn(2, 5, 7)
    t = torch.randn(2, 5, 7)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 2:] = True
    for fn in (L.forward_kl, L.reverse_kl, L.total_variation):
        assert fn(s, t, mask=mask).item() == pytest.approx(fn(s[1, 2:], t[1, 2:]).item(), rel=1e-5)


@pytest.mark.parametrize("fn", [
    lambda s, t: L.forward_kl(s, t, 2.0), lambda s, t: L.reverse_kl(s, t), lambda s, t: L.generalized_jsd(s, t, 0.4),
    lambda s, t: L.skew_kl(s, t, 0.1), lambda s, t: L.skew_reverse_kl(s, t, 0.1), lambda s, t: L.total_variation(s, t),
])
def test_gradients_reach_the_student_only(fn):
    s = torch.randn(3, 4, 11, requires_grad=True)
    t = torch.randn(3, 4, 11, requires_grad=True)
    fn(s, t).backward()
    assert t.grad is None
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_hidden_losses_project_when_widths_differ():
    hs = [torch.randn(2, 3, 4, requires_grad=True) for _ in range(3)]
    ht = [torch.randn(2, 3, 6, requires_grad=True) for _ in range(5)]
    pairs = L.layer_map(2, 4, "all")
    assert pairs == [(1, 2), (2, 4)]
    assert L.layer_map(2, 4, "final") == [(2, 4)]
    proj = L.HiddenProjection(4, 6, len(pairs))
    mse = L.hidden_mse(hs, ht, proj, pairs)
    expected = torch.stack([((proj.maps[k](hs[i]) - ht[j]) ** 2).mean() for k, (i, j) in enumerate(pairs)]).mean()
    assert mse.item() == pytest.approx(expected.item(), rel=1e-5)
    (mse + L.hidden_cosine(hs, ht, proj, pairs)).backward()
    assert all(h.grad is None for h in ht)
    assert hs[1].grad is not None and proj.maps[0].weight.grad is not None
    same = L.HiddenProjection(4, 4, 1)
    assert same.identity and len(list(same.parameters())) == 0
    a = torch.randn(2, 3, 4)
    assert L.hidden_cosine([a], [a * 3], same, [(0, 0)]).item() == pytest.approx(0.0, abs=1e-6)


def test_objective_is_the_weighted_sum_of_its_terms():
    s, t, y = torch.randn(2, 5, 9), torch.randn(2, 5, 9), torch.randint(0, 9, (2, 5))
    obj = Objective.parse("fkl=0.9,ce=0.1", temperature=2.0)
    total, terms = obj(s, t, y)
    expected = 0.9 * L.forward_kl(s, t, 2.0) + 0.1 * L.cross_entropy(s, y)
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)
    assert set(terms) == {"fkl", "ce"}
    assert Objective.parse("gjsd", beta=0.0)(s, t, y)[0].item() == pytest.approx(L.forward_kl(s, t).item(), rel=1e-6)
    assert not Objective.parse("ce").needs_teacher_logits and Objective.parse("hidden_mse").needs_hidden


def test_bad_objectives_raise():
    with pytest.raises(InvalidParameterError, match="unknown"):
        Objective.parse("kl")
    with pytest.raises(InvalidParameterError, match="weight"):
        Objective.parse("fkl=abc")
    with pytest.raises(InvalidParameterError, match="beta"):
        Objective.parse("gjsd", beta=1.5)
    with pytest.raises(InvalidParameterError, match="temperature"):
        L.forward_kl(S, T_, temperature=0.0)
