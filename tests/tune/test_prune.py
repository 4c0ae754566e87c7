"""The plan's verdicts: a KV budget that cannot fit and a roofline that misses the SLO are dropped; the rest
are kept, cheapest roofline first."""

from __future__ import annotations

from cinq.model.config import ModelConfig
from cinq.plan.devices import get_device
from cinq.tune.prune import Verdict, judge, measurement_order, precision_of, prune
from cinq.tune.space import Candidate


def config(tiny_llama) -> ModelConfig:
    return ModelConfig.from_pretrained(tiny_llama)


def test_verdicts(tiny_llama):
    cfg, dev = config(tiny_llama), get_device("L4")
    ok = judge(Candidate("none", 0, 8, 512, None), cfg, dev, "bfloat16", 256, 128, None)
    assert ok.kept and ok.roofline_tpot_ms > 0 and ok.roofline_cost > 0
    too_big = judge(Candidate("none", 0, 8, 512, 10 ** 12), cfg, dev, "bfloat16", 256, 128, None)
    assert not too_big.kept and "KV budget" in too_big.reason
    slo = ok.roofline_tpot_ms / 2  # below the roofline: unreachable without drafts ...
    assert not judge(Candidate("none", 0, 8, 512, None), cfg, dev, "bfloat16", 256, 128, slo).kept
    spec = judge(Candidate("none", 3, 8, 512, None), cfg, dev, "bfloat16", 256, 128, slo)
    assert spec.kept and spec.roofline_tpot_ms == ok.roofline_tpot_ms / 4  # ... reachable with 3 accepted


def test_prune_orders_kept_first_by_cost(tiny_llama):
    cands = [Candidate("none", 0, 1, 512, 10 ** 12), Candidate("none", 0, 1, 512, None),
             Candidate("none", 0, 16, 512, None)]
    out = prune(cands, config(tiny_llama), get_device("L4"), "bfloat16", 256, 128, None)
    assert [v.kept for v in out] == [True, True, False]
    assert out[0].roofline_cost <= out[1].roofline_cost


def test_precision_of_a_variant():
    assert precision_of("none", "bfloat16").name == "bfloat16"
    p = precision_of("gptq:4/128", "bfloat16")
    assert (p.name, p.group_size) == ("int4", 128)
    assert precision_of("rtn:8", "bfloat16").name == "int8"


def test_measurement_order_visits_every_family_first():
    def v(quant: str, k: int, seqs: int, kept: bool = True) -> Verdict:
        return Verdict(Candidate(quant, k, seqs, 512, None), kept, "", 1.0, 1.0)
    verdicts = [v("none", 0, 32), v("none", 0, 4), v("none", 3, 32), v("rtn:8", 0, 32), v("rtn:8", 0, 4),
                v("none", 3, 4, kept=False)]
    order = [(x.candidate.quant, x.candidate.spec_k, x.candidate.max_num_seqs) for x in measurement_order(verdicts)]
    assert order == [("none", 0, 32), ("none", 3, 32), ("rtn:8", 0, 32), ("none", 0, 4), ("rtn:8", 0, 4)]
