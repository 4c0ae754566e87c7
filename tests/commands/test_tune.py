"""`cinq tune` end to end on a tiny model: measured table, plan verdicts, and a config file `cinq serve
--config` reads back into the chosen configuration. Never timings: only what was chosen from what."""

from __future__ import annotations

import argparse
import json

from cinq.cli import main

ARGS = ["--dtype", "float32", "--num-threads", "1", "--workload", "mixed:3", "--request-rate", "50",
        "--num-problems", "1", "--ppl-tokens", "64", "--max-num-seqs-values", "2,4",
        "--max-num-batched-tokens-values", "256", "--spec-method", "ngram", "--spec-model", "", "--spec-extra",
        '{"prompt_lookup_max": 3}', "--plan-device", "L4"]


def test_tune_chooses_a_measured_candidate_and_writes_a_serve_config(capsys, tmp_path, tiny_llama):
    out = tmp_path / "t"
    rc = main(["tune", str(tiny_llama), *ARGS, "--quant", "none;rtn:8", "--spec-k", "0,2", "--max-trials", "3",
               "--kv-tokens", "auto,1000000000000", "--variants-dir", str(tmp_path / "v"), "--out", str(out)])
    assert rc == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert len(data["verdicts"]) == 2 * 2 * 2 * 2
    assert sum(not v["kept"] for v in data["verdicts"]) == 8  # the KV budget no device holds
    assert len(data["rows"]) == 3 and all(r["meets_slo"] for r in data["rows"])  # no bounds given
    chosen = data["chosen"]
    assert chosen["cost_per_m_tokens"] == min(r["cost_per_m_tokens"] for r in data["rows"])
    assert data["headline"].startswith("chosen: " + chosen["label"])

    from cinq.commands.engine_args import add_engine_args, engine_config_from_args
    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = engine_config_from_args(p.parse_args(["--config", str(tmp_path / "t.config.json")]))
    c = chosen["candidate"]
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (c["max_num_seqs"], c["max_num_batched_tokens"])
    assert (cfg.speculative_config is not None) == (c["spec_k"] > 0) and cfg.dtype == "float32"
    assert ("rtn" in cfg.model) == (c["quant"] == "rtn:8")
    assert "serve it: cinq serve --config" in capsys.readouterr().out


def test_an_slo_nothing_meets_exits_1_without_a_config(capsys, tmp_path, tiny_llama):
    out = tmp_path / "t"
    rc = main(["tune", str(tiny_llama), *ARGS, "--quant", "none", "--spec-k", "0", "--max-trials", "1",
               "--max-kl", "1e-30", "--out", str(out)])
    assert rc == 1 and not (tmp_path / "t.config.json").exists()
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["chosen"] is None and len(data["rows"]) == 1 and not data["rows"][0]["meets_slo"]
    assert data["rows"][0]["misses"][0].startswith("KL")
    assert "no measured candidate meets the SLO" in capsys.readouterr().out
