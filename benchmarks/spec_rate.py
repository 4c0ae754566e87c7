"""Speculation against request rate (and so batch size), adaptive on and off: plain decoding, and each
speculative config (EAGLE k=3 with the shipped head, prompt lookup) with a fixed k and with ``adaptive: true``
(``spec/adaptive.py`` chooses k per step, 0 = off, from measured acceptance and step times per batch-size
bucket), each serving the same workload at each Poisson rate in process (``rate_run``).

At a low rate the batch stays small and a verify step costs about what a decode step costs, so drafts are nearly
free tokens; as the rate grows the batch grows, a step's cost grows with its rows, and the k extra rows per request
that a verify adds stop paying. An arm pays at a rate when every round's TPOT p50 is below every round of plain
decoding's there (beyond a loaded machine's run-to-run spread; with one round: at most ``PAYS`` = 0.95 times
plain's); the crossover is the lowest rate from which it pays at no higher rate (TPOT, not tokens/s: below
saturation every configuration delivers the tokens that arrive)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cinq.bench.mixed_workload import MixedOptions, mixed_workload
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError

EAGLE = {"method": "eagle", "model": "cinq-tiny-eagle", "num_speculative_tokens": 3}
# prompt lookup: the one method that pays at batch 1 on cinq-tiny on a CPU (benchmarks/results/speculative.md),
# so the one whose crossover the rates can show
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
PLAIN = "plain"
PAYS = 0.95  # with one round, an arm pays when its TPOT p50 is at most this fraction of plain decoding's


@dataclass(slots=True)
class SpecRateOptions:
    """Rates (req/s, ``inf`` allowed), the workload and the speculative configs (each run with adaptive off and
    on; a config's own ``adaptive`` is ignored)."""

    rates: tuple[float, ...] = (2.0, 8.0, 32.0, math.inf)
    workload: MixedOptions = field(default_factory=lambda: MixedOptions(num_requests=32, output_len=(32, 64)))
    speculative_configs: tuple[dict[str, Any], ...] = field(default_factory=lambda: (dict(EAGLE), dict(NGRAM)))
    rounds: int = 3  # runs per (rate, arm), the arms' order rotated each round; the run of median TPOT p50 is kept

    def validate(self) -> None:
        self.workload.validate()
        if not self.rates or any(not r > 0 for r in self.rates):
            raise InvalidParameterError(f"rates must be numbers > 0 (inf allowed), got {list(self.rates)}", "rates")
        if self.rounds < 1:
            raise InvalidParameterError(f"rounds must be >= 1, got {self.rounds}", "rounds")
        if not self.speculative_configs or any("method" not in sc for sc in self.speculative_configs):
            raise InvalidParameterError("speculative_configs must be one or more configs, each naming a method",
                                        "speculative_configs")


def arm_label(sc: dict[str, Any], adaptive: bool) -> str:
    """How the table names one speculative arm."""
    return f"{sc['method']} k={sc.get('num_speculative_tokens')}, adaptive {'on' if adaptive else 'off'}"


def arm_configs(config: EngineConfig, options: SpecRateOptions) -> dict[str, EngineConfig]:
    """Label -> engine config: plain decoding, then each speculative config with adaptive off and on."""
    arms = {PLAIN: dataclasses.replace(config, speculative_config=None)}
    for sc in options.speculative_configs:
        for adaptive in (False, True):
            arms[arm_label(sc, adaptive)] = dataclasses.replace(config, speculative_config={**sc,
                                                                                           "adaptive": adaptive})
    return arms


def run_spec_rate(config: EngineConfig, options: SpecRateOptions, progress: bool = True) -> BenchResult:
    """Every arm at every rate, a fresh engine each (see the module docstring)."""
    from cinq.bench.latency_stats import percentile
    from cinq.bench.rate_run import build_engine, median_by, rotated, run_at_rate
    from cinq.config import resolve_model
    from cinq.model.tokenizer import Tokenizer
    options.validate()
    config = dataclasses.replace(config, model=str(resolve_model(config.model)),
                                 seed=config.seed if config.seed is not None else 0)
    arms = arm_configs(config, options)
    work = mixed_workload(Tokenizer.from_pretrained(config.tokenizer or config.model), options.workload)
    bar = progress_bar(len(arms) * len(options.rates) * options.rounds, "spec-rate", progress, unit="run")
    labels = list(arms)
    runs: dict[tuple[float, str], list[dict[str, Any]]] = {(r, lb): [] for r in options.rates for lb in labels}
    for rnd in range(options.rounds):  # a loaded machine drifts: rotate the arms' order every round
        for rate in options.rates:
            outputs: dict[str, list[list[int]]] = {}
            for label in rotated(labels, rnd):
                engine = build_engine(arms[label])
                run = run_at_rate(engine, work.requests, rate, options.workload.seed)
                del engine
                arm = run.summary()
                arm["itl_p99_ms"] = percentile(run.itl_ms(), 99)
                outputs[label] = run.outputs
                runs[(rate, label)].append(arm)
                bar.update(1)
            for label in labels[1:]:  # greedy speculation reproduces plain decoding up to bf16 rounding
                runs[(rate, label)][-1]["same_as_plain"] = sum(a == b for a, b in zip(outputs[label],
                                                                                      outputs[PLAIN]))
    bar.close()
    rows = []
    for rate in options.rates:
        row: dict[str, Any] = {"rate": rate, "arms": {}}
        for label in labels:
            rs = runs[(rate, label)]
            row["arms"][label] = {**median_by(rs, "tpot_p50_ms"),
                                  "tpot_p50_rounds": [a["tpot_p50_ms"] for a in rs],
                                  "tok_s_rounds": [a["tok_s"] for a in rs]}
        rows.append(row)
    data = {"config": {"model": model_label(config.model), "dtype": config.dtype, "device": config.device},
            "options": {"rates": list(options.rates), "workload": options.workload.to_dict(),
                        "rounds": options.rounds, "speculative_configs": list(options.speculative_configs)},
            "workload": {"counts": work.counts(), "prompt_tokens": sum(len(r.prompt) for r in work.requests),
                         "output_tokens": sum(r.output_len for r in work.requests)},
            "machine": machine_info(), "arms": list(arms), "rows": rows}
    return spec_rate_result(data)


def pays(row: dict[str, Any], arm: str) -> bool:
    """Whether ``arm`` beats plain decoding in one rate's row: its slowest round's TPOT p50 below plain's fastest
    round's (with one round, at most ``PAYS`` times plain's TPOT p50)."""
    mine, plain = row["arms"][arm], row["arms"][PLAIN]
    if len(mine.get("tpot_p50_rounds", [])) > 1 and len(plain.get("tpot_p50_rounds", [])) > 1:
        return max(mine["tpot_p50_rounds"]) < min(plain["tpot_p50_rounds"])
    return mine["tpot_p50_ms"] <= PAYS * plain["tpot_p50_ms"]


def crossover(rows: list[dict[str, Any]], arm: str) -> float | None:
    """The lowest rate from which ``arm`` pays at no rate as high or higher (None: it pays at the highest rate
    measured)."""
    ordered = sorted(rows, key=lambda r: r["rate"])
    paid = [pays(r, arm) for r in ordered]
    for i, r in enumerate(ordered):
        if not any(paid[i:]):
            return r["rate"]
    return None


def _rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def spec_rate_result(data: dict[str, Any]) -> BenchResult:
    """The table, the headline, the reading and the plot of one run's ``data``."""
    arms = data["arms"]
    table = Table("Plain decoding vs speculation, adaptive off and on, by request rate",
                  ["rate req/s", "arm", "mean running batch", "tok/s", "TPOT p50 / p99 ms", "TPOT p50 x plain",
                   "TPOT p50 every round", "ITL p99 ms", "TTFT p50 ms", "tau", "outputs = plain"])
    for r in data["rows"]:
        base = r["arms"][PLAIN]["tpot_p50_ms"]
        for label in arms:
            a = r["arms"][label]
            same = "n/a" if label == PLAIN else f"{a['same_as_plain']} / {a['num_requests']}"
            table.rows.append([_rate(r["rate"]), label, a["mean_running"], a["tok_s"],
                               f"{a['tpot_p50_ms']:.1f} / {a['tpot_p99_ms']:.1f}", a["tpot_p50_ms"] / base,
                               " / ".join(f"{x:.0f}" for x in a.get("tpot_p50_rounds", [])), a["itl_p99_ms"],
                               a["ttft_p50_ms"], a["tau"], same])
    data["crossover"] = {label: crossover(data["rows"], label) for label in arms if label != PLAIN}
    cross = Table("Crossover: where speculation pays (every round's TPOT p50 below every round of plain decoding) "
                  "and from which rate it no longer does",
                  ["arm", "verdict", "pays at (req/s)", "TPOT p50 x plain, lowest to highest rate",
                   "plain's mean running batch at the crossover"])
    by_rate = {r["rate"]: r for r in data["rows"]}
    for label, rate in data["crossover"].items():
        cross.rows.append([label, _verdict(label, rate, data["rows"]),
                           ", ".join(_rate(r["rate"]) for r in data["rows"] if pays(r, label)) or "none",
                           " / ".join(f"{r['arms'][label]['tpot_p50_ms'] / r['arms'][PLAIN]['tpot_p50_ms']:.2f}"
                                      for r in data["rows"]),
                           None if rate is None else by_rate[rate]["arms"][PLAIN]["mean_running"]])
    headline = "; ".join(f"{label}: {_verdict(label, rate, data['rows'])}" for label, rate in
                         data["crossover"].items()) + " (paying: TPOT p50 below plain decoding's in every round)"
    n, m = data["workload"]["counts"], data["machine"]
    configs = "; ".join(f"`{sc}`" for sc in data["options"]["speculative_configs"])
    setup = (f"Target {data['config']['model']} ({data['config']['dtype']}, {data['config']['device']}); "
             f"speculative configs {configs}, each with adaptive off and on, against plain decoding. Workload: "
             f"{sum(n.values())} mixed requests ({n}), {data['workload']['prompt_tokens']} prompt and "
             f"{data['workload']['output_tokens']} output tokens (greedy, ignore_eos), arriving as a seeded Poisson "
             f"process at each rate (inf: all at once), in process, a fresh engine per run; "
             f"{data['options'].get('rounds', 1)} rounds, the arms' order rotated each round, "
             f"the run of median TPOT p50 shown per (rate, arm). Mean running "
             f"batch: requests served per engine step, averaged over the run's steps. TPOT per request = (last - "
             f"first token time) / (tokens - 1), p50 / p99 over requests; ITL p99 over every gap between a "
             f"request's tokens (tokens of one verify step share its gap). 'outputs = plain': requests whose greedy "
             f"output equals plain decoding's at the same rate (bf16 rounds a row differently at another row "
             f"count, so a near-tie may flip). CPU threads {m['threads']} of {m['cpus']}; load average at end "
             f"{m['loadavg_at_end']} (a shared machine).")

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        labels = [_rate(r["rate"]) for r in data["rows"]]
        for label in arms:
            ax1.plot(labels, [r["arms"][label]["tpot_p50_ms"] / r["arms"][PLAIN]["tpot_p50_ms"]
                              for r in data["rows"]], "o-", label=label)
            ax2.plot(labels, [r["arms"][label]["mean_running"] for r in data["rows"]], "o-", label=label)
        ax1.axhline(1.0, color="gray", ls=":")
        ax1.set_xlabel("request rate (req/s)")
        ax1.set_title("TPOT p50 / plain decoding's (< 1: speculation pays)")
        ax1.legend(fontsize=7)
        ax2.set_xlabel("request rate (req/s)")
        ax2.set_title("mean running batch")

    return BenchResult("spec-rate", "Speculation vs request rate (and batch), adaptive off and on", setup,
                       [table, cross], headline, data, notes=[_reading(data)], plot=plot)


def _verdict(arm: str, rate: float | None, rows: list[dict[str, Any]]) -> str:
    paid = [r["rate"] for r in rows if pays(r, arm)]
    if not paid:
        return "never pays"
    if len(paid) == len(rows):
        return "pays at every rate measured"
    if rate is None:
        return "pays at " + ", ".join(_rate(x) for x in paid) + " req/s only"
    return f"stops paying from {_rate(rate)} req/s"


def _reading(data: dict[str, Any]) -> str:
    lo, hi = data["rows"][0], data["rows"][-1]

    def ratio(r: dict[str, Any], label: str) -> str:
        return f"{r['arms'][label]['tpot_p50_ms'] / r['arms'][PLAIN]['tpot_p50_ms']:.2f}x"

    spec = [label for label in data["arms"] if label != PLAIN]
    return (f"Reading (from this run's numbers): TPOT p50 against plain decoding at {_rate(lo['rate'])} req/s "
            f"(plain's mean batch {lo['arms'][PLAIN]['mean_running']:.1f}): "
            + ", ".join(f"{label} {ratio(lo, label)}" for label in spec)
            + f"; at {_rate(hi['rate'])} req/s (mean batch {hi['arms'][PLAIN]['mean_running']:.1f}): "
            + ", ".join(f"{label} {ratio(hi, label)}" for label in spec) + ".")
