"""What ``cinq tune`` hands back: the measured table behind the choice and the plan's verdicts (as a
``BenchResult``: PREFIX.md / PREFIX.json) and the chosen configuration as a file ``cinq serve --config`` reads."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.stack_report import pair


def config_file_text(config: Any, where: Path) -> str:
    """The chosen EngineConfig as a ``--config`` JSON file to be written at ``where``: its model an embedded
    model's name, a path relative to the file's folder when it lies under it, else as it is."""
    from cinq.config_argv import config_file_dict
    out = config_file_dict(config)
    label = model_label(config.model)
    if "/" not in label:
        out["model"] = label  # an embedded model, by name
    else:
        try:
            out["model"] = str(Path(os.path.relpath(Path(config.model).resolve(), where.parent.resolve())))
        except ValueError:
            pass
        if out["model"].startswith(".."):
            out["model"] = str(config.model)
    out.pop("seed", None)  # the search's fixed seed is no serving choice
    return json.dumps(out, indent=2) + "\n"


def tune_result(data: dict[str, Any], options: dict[str, Any], model: str) -> BenchResult:
    """Tables: the measured candidates (cheapest first) and the plan's verdicts."""
    slo = options["slo"]
    measured = Table("Measured candidates (cheapest that meets the SLO wins)",
                     ["candidate", "roofline TPOT ms", f"TTFT p50 / p99 ms ({options['request_rate']:g}/s)",
                      f"TPOT p50 / p99 ms ({options['request_rate']:g}/s)", "tok/s (inf)", "tau", "arith acc %",
                      "KL to bf16", "$ / M tokens", "meets SLO", "misses"])
    for r in sorted(data["rows"], key=lambda r: r["cost_per_m_tokens"] or 1e30):
        q, at = r["quality"], r["rate"]
        measured.rows.append([r["label"], r["roofline_tpot_ms"], pair(at["ttft_p50_ms"], at["ttft_p99_ms"]),
                              pair(at["tpot_p50_ms"], at["tpot_p99_ms"]), r["inf"]["tok_s"], r["inf"]["tau"],
                              None if q["accuracy"] is None else 100 * q["accuracy"],
                              None if q["kl"] is None else f"{q['kl']:.4f}", r["cost_per_m_tokens"],
                              r["meets_slo"], "; ".join(r["misses"]) or "-"])
    plan = Table("The plan's verdicts (cinq plan: memory fit, roofline TPOT lower bound)",
                 ["candidate", "kept", "roofline TPOT ms (best case)", "roofline $ / M tokens", "reason"])
    for v in data["verdicts"]:
        plan.rows.append([v["label"], v["kept"], v["roofline_tpot_ms"], v["roofline_cost"], v["reason"]])
    chosen = data["chosen"]
    bounds = ", ".join(f"{k} {v:g}" for k, v in slo.items() if v is not None) or "none"
    headline = (f"chosen: {chosen['label']} at {chosen['cost_per_m_tokens']:.3g} $/M tokens"
                if chosen else "no measured candidate meets the SLO")
    w, m = data["workload"], machine_info()
    setup = (f"Model {model_label(model)}; SLO: {bounds} at {options['request_rate']:g} req/s (Poisson). Workload "
             f"{w['spec']}: {w['requests']} requests, {w['prompt_tokens']} prompt and {w['output_tokens']} output "
             f"tokens (greedy, ignore_eos). {len(data['verdicts'])} candidates; the plan (device "
             f"{data['device']['name']}) pruned those that cannot fit or whose roofline TPOT misses the SLO, the "
             f"rest were measured cheapest roofline first, up to {options['max_trials']}: one short run at the "
             f"SLO's rate, one at rate = inf (cost = {options['price_per_hour']:g} $/h over its tokens/s), and the "
             f"served quality ({options['quality']['n_problems']} arithmetic test problems, KL on "
             f"{options['quality']['ppl_tokens']} held-out tokens). Measured with this checkout's assets on a "
             f"shared CPU (threads {m['threads']} of {m['cpus']}, load average {m['loadavg_at_end']}): single "
             f"short runs, so near-ties can flip between runs.")
    rows = [{k: v for k, v in r.items() if k != "engine_config"} for r in data["rows"]]
    options = {**options, "variants_dir": "<variants>" if options.get("variants_dir") else "<cinq cache>/variants"}
    payload = {"model": model_label(model), "options": options, "machine": m, **data, "rows": rows,
               "chosen": None if chosen is None else {k: v for k, v in chosen.items() if k != "engine_config"}}
    return BenchResult("tune", "cinq tune: the cheapest configuration that meets the SLO", setup,
                       [measured, plan], headline, payload)


def options_dict(options: Any) -> dict[str, Any]:
    return dataclasses.asdict(options)
