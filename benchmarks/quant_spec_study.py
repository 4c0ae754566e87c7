"""Quantized target x speculation (issue 12's interaction table): does quantizing the target lower EAGLE's tau,
and does a head retrained on the quantized target win it back?

For each target (the dense model and its quantized copies) and batch size, one run measures plain decoding
before and after (their mean is the baseline, their ratio the drift), and between them EAGLE with every head
that applies: the heads trained on the dense model (the shipped one and a control trained with the same reduced
budget as the retrained ones), and the head retrained on this very target when there is one. Each measurement is
``cinq bench spec``'s (cinq/bench/spec.py ``measure`` / ``compare``): greedy, so the speculative output is also
checked token for token against the same target decoding plainly. Speculation runs with adaptive k (the
speedup a user gets) and, optionally, with k fixed (tau from the same number of drafts every step, which is
what tells heads apart: the adaptive controller drafts less after rejections)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.spec import compare, measure
from cinq.bench.workload import TokenWindows, text_tokens
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from benchmarks.head_transfer import held_out_acceptance

DENSE = "bf16"
# (label, cinq eval --variants entry): the targets; the dense model is the first
TARGETS: tuple[tuple[str, str | None], ...] = (
    (DENSE, None), ("int8 RTN", "rtn:8"), ("int4 RTN g128", "rtn:4/128"), ("int4 GPTQ g128", "gptq:4/128"),
    ("int4 AWQ g128", "awq:4/128"), ("W8A8 SmoothQuant dynamic", "smoothquant:dynamic"))


@dataclass(slots=True)
class Head:
    """An EAGLE head folder, the target label it was trained on and its training budget (for the table)."""

    name: str
    folder: Path
    trained_on: str
    budget: str


@dataclass(slots=True)
class QuantSpecOptions:
    """Batch sizes, prompts (windows of a shipped text), tokens per request, draft length and modes."""

    batch_sizes: tuple[int, ...] = (1,)
    num_prompts: int = 8
    prompt_len: int = 64
    max_tokens: int = 64
    text: str = "held-out"
    k: int = 3
    fixed_k: bool = True  # also measure with adaptive off (tau at a fixed draft length)
    offline_prompts: int = 32  # held-out tau offline (benchmarks/head_transfer.py) on this many prompts; 0: off
    offline_max_tokens: int = 64
    num_threads: int | None = None
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # recorded as given (teacher identity, budgets, ...)

    def validate(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise InvalidParameterError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}", "batch_sizes")
        if self.offline_prompts < 0 or self.offline_max_tokens < 1:
            raise InvalidParameterError(f"offline_prompts must be >= 0 and offline_max_tokens >= 1, got "
                                        f"{self.offline_prompts} and {self.offline_max_tokens}", "offline_prompts")
        for name in ("num_prompts", "prompt_len", "max_tokens", "k"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}", name)


def heads_for(target: str, general: list[Head], retrained: dict[str, Head]) -> list[Head]:
    """The heads measured on ``target``: every general head (trained on the dense model), then the head
    retrained on ``target`` itself when there is one and it is not already among them."""
    out = list(general)
    own = retrained.get(target)
    if own is not None and all(h.folder != own.folder for h in out):
        out.append(own)
    return out


def run_quant_spec(targets: dict[str, Path], general: list[Head], retrained: dict[str, Head],
                   options: QuantSpecOptions, control: str | None = None, progress: bool = True) -> BenchResult:
    """Measure every (target, batch, head, mode) against plain decoding of that target in the same run.
    ``control``: the name of the general head trained with the retrained heads' budget (their comparison)."""
    options.validate()
    if not targets:
        raise InvalidParameterError("no target to measure", "targets")
    if control is not None and control not in [h.name for h in general]:
        raise InvalidParameterError(f"control head {control!r} is not among {[h.name for h in general]}", "control")
    unknown = sorted(set(retrained) - set(targets))
    if unknown:
        raise InvalidParameterError(f"retrained heads for unknown targets {unknown}; targets: {list(targets)}",
                                    "retrained")
    from cinq.model.tokenizer import Tokenizer
    first = next(iter(targets.values()))
    text = TokenWindows(text_tokens(Tokenizer.from_pretrained(first), options.text), start=options.seed * 7919)
    prompts = [text.take(options.prompt_len) for _ in range(options.num_prompts)]
    held_out = [text.take(options.prompt_len) for _ in range(options.offline_prompts)]
    modes = [True, False] if options.fixed_k else [True]
    plan = [(t, b) for t in targets for b in options.batch_sizes]
    total = sum(2 + len(modes) * len(heads_for(t, general, retrained)) for t, _ in plan)
    total += len(targets) if held_out else 0
    bar = progress_bar(total, "quant-spec", progress, unit="run")
    rows: list[dict[str, Any]] = []
    for label, batch in plan:
        plain_cfg = EngineConfig(model=str(targets[label]), dtype="bfloat16", kv_cache_memory=0.5,
                                 num_threads=options.num_threads)
        base = measure(plain_cfg, prompts, batch, options.max_tokens)
        bar.update(1)
        results = []
        for head in heads_for(label, general, retrained):
            for adaptive in modes:
                spec = {"method": "eagle", "model": str(head.folder), "num_speculative_tokens": options.k,
                        "adaptive": adaptive}
                results.append((head, adaptive, measure(dataclasses.replace(plain_cfg, speculative_config=spec),
                                                        prompts, batch, options.max_tokens)))
                bar.update(1)
        again = measure(plain_cfg, prompts, batch, options.max_tokens)
        bar.update(1)
        drift = again["tok_s"] / base["tok_s"]
        base["tok_s"] = (base["tok_s"] + again["tok_s"]) / 2
        for head, adaptive, r in results:
            row = compare({"target": label, "batch": batch, "head": head.name, "head_trained_on": head.trained_on,
                           "head_budget": head.budget, "adaptive": adaptive, "baseline_drift": round(drift, 3)},
                          base, r)
            rows.append(row)
    offline = []
    for label in targets if held_out else []:  # no timing: after the served runs, while the bar is still up
        heads = heads_for(label, general, retrained)
        got = held_out_acceptance(targets[label], {h.name: h.folder for h in heads}, held_out,
                                  options.offline_max_tokens, options.k)
        offline += [{"target": label, "head": h.name, "head_trained_on": h.trained_on, "tau": got[h.name]["tau"],
                     "accept_rate": got[h.name]["accept_rate"], "steps": got[h.name]["steps"]} for h in heads]
        bar.update(1)
    bar.close()
    data = {"config": {"targets": {k: _short(v) for k, v in targets.items()},
                       "heads": [{"name": h.name, "folder": _short(h.folder), "trained_on": h.trained_on,
                                  "budget": h.budget} for h in [*general, *retrained.values()]],
                       "control": control},
            "options": dataclasses.asdict(options), "machine": machine_info(), "rows": rows, "offline": offline}
    return quant_spec_result(data)


def _short(folder: Path) -> str:
    """A folder as the report names it: an embedded model by its name, else its last parts (no machine paths;
    a variant folder's name carries its variant and content key, a run's ``head`` folder its run's name)."""
    label = model_label(str(folder))
    if label == Path(label).name:
        return label
    return "/".join(Path(folder).parts[-2:]) if Path(folder).name == "head" else Path(folder).name


def _summary(data: dict[str, Any]) -> Table:
    """One row per (target, batch): tau (fixed k when measured, else adaptive) and adaptive speedup per head."""
    heads = list(dict.fromkeys(r["head"] for r in data["rows"]))
    fixed = data["options"]["fixed_k"]
    tau_mode = "k fixed" if fixed else "adaptive"
    cols = ["target", "batch", "plain tok/s"]
    for h in heads:
        cols += [f"tau {h} ({tau_mode})", f"speedup {h} (adaptive)"]
    table = Table(f"tau and speedup per target and head (k={data['options']['k']})", cols)
    for key in dict.fromkeys((r["target"], r["batch"]) for r in data["rows"]):
        mine = [r for r in data["rows"] if (r["target"], r["batch"]) == key]
        row: list[Any] = [*key, mine[0]["plain_tok_s"]]
        for h in heads:
            tau = next((r["tau"] for r in mine if r["head"] == h and r["adaptive"] != fixed), None)
            speed = next((r["speedup"] for r in mine if r["head"] == h and r["adaptive"]), None)
            row += [tau, speed]
        table.rows.append(row)
    return table


def _effects(rows: list[dict[str, Any]], control: str | None, title: str) -> Table | None:
    """Per target: tau of each dense-trained head and its change from the dense target, and the retrained head's
    tau against the head trained on the dense model with the same budget (``control``). ``rows``: one
    measurement per (target, head)."""
    targets = list(dict.fromkeys(r["target"] for r in rows))
    if DENSE not in targets:
        return None
    tau = {(r["target"], r["head"]): r["tau"] for r in rows}
    general = list(dict.fromkeys(r["head"] for r in rows if r["head_trained_on"] == DENSE))
    table = Table(title, ["target"] + [f"tau {h} (vs bf16 target)" for h in general]
                  + ["tau retrained", "retrained - control"])
    for t in targets:
        row: list[Any] = [t]
        for h in general:
            mine, dense = tau.get((t, h)), tau.get((DENSE, h))
            row.append(None if mine is None else f"{mine:.2f} ({mine - dense:+.2f})" if dense else f"{mine:.2f}")
        own = next((r["tau"] for r in rows if r["target"] == t and r["head_trained_on"] == t != DENSE), None)
        ctl = tau.get((t, control)) if control else None
        row += [own, None if own is None or ctl is None else f"{own - ctl:+.2f}"]
        table.rows.append(row)
    return table


def _comparisons(data: dict[str, Any]) -> list[Table | None]:
    """The comparison from served tau (smallest batch, fixed k when measured) and from held-out tau (offline)."""
    o, control = data["options"], data["config"].get("control")
    batch = min(r["batch"] for r in data["rows"])
    served = [r for r in data["rows"] if r["batch"] == batch and r["adaptive"] != o["fixed_k"]]
    out = [_effects(served, control, f"Does quantizing lower tau, does retraining win it back? Served, batch {batch}, "
                                     f"k={o['k']} {'fixed' if o['fixed_k'] else 'adaptive'}")]
    if data.get("offline"):
        out.insert(0, _effects(data["offline"], control, (
            f"Does quantizing lower tau, does retraining win it back? Held-out tau offline, on each target's own "
            f"greedy continuations ({o['offline_prompts']} prompts x "
            f"up to {o['offline_max_tokens']} tokens, float32), k={o['k']} drafts, offline")))
    return out


def quant_spec_result(data: dict[str, Any]) -> BenchResult:
    """The report of a ``run_quant_spec`` run (also rebuilt from its JSON)."""
    o, m = data["options"], data["machine"]
    detail = Table("Every measurement", ["target", "batch", "head", "trained on", "head budget", "adaptive",
                                         "plain tok/s (baseline)", "eagle tok/s", "speedup", "tau",
                                         "acceptance per position", "greedy identical", "baseline drift"])
    for r in data["rows"]:
        detail.rows.append([r["target"], r["batch"], r["head"], r["head_trained_on"], r["head_budget"],
                            r["adaptive"], r["plain_tok_s"], r["spec_tok_s"], r["speedup"], r["tau"],
                            ", ".join(f"{a:.2f}" for a in r["accept_per_pos"]), r["greedy_identical"],
                            r["baseline_drift"]])
    setup = (f"EAGLE (k={o['k']}) on each target, {o['num_prompts']} prompts of {o['prompt_len']} tokens cut from "
             f"the `{o['text']}` text, {o['max_tokens']} new tokens each (greedy, ignore_eos), in waves of `batch` "
             f"requests; bf16 compute. Plain decoding of the same target ran before and after its speculative runs: "
             f"the baseline is their mean, the drift their ratio. CPU threads {m['threads']}; load average at end "
             f"{m['loadavg_at_end']} (a shared machine: read the ratios with the drift).")
    identical = all(r["greedy_identical"] for r in data["rows"])
    adaptive = [r for r in data["rows"] if r["adaptive"]]
    headline = (f"greedy output identical to plain decoding in {sum(r['greedy_identical'] for r in data['rows'])}"
                f"/{len(data['rows'])} runs; adaptive EAGLE speedup over plain decoding "
                f"{min(r['speedup'] for r in adaptive):.2f}x to {max(r['speedup'] for r in adaptive):.2f}x")
    notes = [] if identical else ["Some speculative runs did not reproduce plain greedy output (see the table)."]
    if data.get("reading"):
        notes.insert(0, f"Reading: {data['reading']}")
    if o.get("extra"):
        notes.append("Recorded with the run: " + "; ".join(f"{k}: {v}" for k, v in o["extra"].items()) + ".")

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        fixed = o["fixed_k"]
        batch = min(r["batch"] for r in data["rows"])
        targets = list(dict.fromkeys(r["target"] for r in data["rows"]))
        heads = list(dict.fromkeys(r["head"] for r in data["rows"]))
        width = 0.8 / len(heads)
        for i, h in enumerate(heads):
            for ax, mode, field_ in ((ax1, not fixed, "tau"), (ax2, True, "speedup")):
                ys = [next((r[field_] or 0 for r in data["rows"] if r["target"] == t and r["head"] == h
                            and r["batch"] == batch and r["adaptive"] == mode), 0) for t in targets]
                ax.bar([j + (i - (len(heads) - 1) / 2) * width for j in range(len(targets))], ys, width=width,
                       label=h)
        for ax, title in ((ax1, f"tau (k={o['k']}{' fixed' if fixed else ', adaptive'}), batch {batch}"),
                          (ax2, f"speedup over plain decoding (adaptive), batch {batch}")):
            ax.set_xticks(range(len(targets)), targets, rotation=20, ha="right", fontsize=8)
            ax.set_title(title)
        ax2.axhline(1.0, color="gray", ls=":")
        ax1.legend(fontsize=7)

    tables = [t for t in (*_comparisons(data), _summary(data), detail) if t is not None]
    return BenchResult("quant-spec", "Quantized target x speculation: EAGLE heads trained on bf16 vs retrained on "
                       "the quantized target", setup, tables, headline, data, notes, plot=plot)
