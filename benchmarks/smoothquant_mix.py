"""SmoothQuant W8A8 under continuous batching with a mixed workload: static activation scales (per tensor, fixed
at calibration on one distribution, the shipped calibration text) against dynamic ones (per token, each row's own
max) against the bf16 model they were made from; and static scales calibrated on one language of that text alone
(``calibration_language``), which shows whether the calibration distribution matters for the languages served.

Each model serves the mixed multilingual chat + code + arithmetic workload (``mixed_workload``) in process at
rate = inf and at a fixed Poisson rate (``rate_run``): output tokens/s, TTFT and TPOT, and how many requests'
greedy outputs equal the bf16 engine's in the same batches. Quality as served (``served_quality``): perplexity,
KL and top-1 agreement to bf16 on the held-out text, arithmetic accuracy of the serving engine; and KL to bf16
per language of the held-out text (``text_languages``), where scales calibrated on one mix of languages would
show a language they fit badly. The batch-mates check (``batch_mates``: does a request's output change with who
else runs) is folded in from its own run when given."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cinq.bench.mixed_workload import MixedOptions, mixed_workload, run_head
from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.served_quality import QualitySettings
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, check_bounds

SCHEMES = ("static", "dynamic")
REFERENCE = "bf16"
STATIC, DYNAMIC = (f"SmoothQuant W8A8 {scheme}" for scheme in SCHEMES)


def single_language_label(language: str) -> str:
    """The row of static scales calibrated on one language of the calibration text."""
    return f"{STATIC} ({language}-only calibration)"


@dataclass(slots=True)
class SmoothQuantMixOptions:
    """The workload, the fixed rate, the quality sizes and where the quantized copies are kept."""

    workload: MixedOptions = field(default_factory=lambda: MixedOptions(num_requests=32, output_len=(8, 32)))
    request_rate: float = 8.0
    quality: QualitySettings = field(default_factory=QualitySettings)
    language_tokens: int = bounded(512, ge=2)  # KL tokens per language of the held-out text
    rounds: int = bounded(3, ge=1)  # speed runs per (model, rate), the models' order rotated each round; the median one is kept
    # one more static copy calibrated on this language's records of the calibration text alone (None: none), to
    # show what a calibration distribution that misses the served languages does to each of them
    calibration_language: str | None = "en"
    variants_dir: str | None = None  # None: the cinq cache

    def validate(self) -> None:
        self.workload.validate()
        self.quality.validate()
        from cinq.bench.rate_run import check_fixed_rate
        check_fixed_rate(self.request_rate)
        check_bounds(self)
        from benchmarks.text_languages import LANGUAGES
        if self.calibration_language is not None and self.calibration_language not in LANGUAGES:
            raise InvalidParameterError(f"calibration_language must be one of {', '.join(LANGUAGES)} or None, got "
                                        f"{self.calibration_language!r}", "calibration_language")


def smoothquant_models(model: str, options: SmoothQuantMixOptions, progress: bool = False) -> dict[str, str]:
    """Label -> folder: the bf16 model and its SmoothQuant W8A8 copies (made once, kept under the variants dir):
    static and dynamic calibrated on the shipped calibration text, and static calibrated on one language of it."""
    from pathlib import Path

    from benchmarks.text_languages import language_records
    from cinq.cache import cache_dir
    from cinq.quant.variants import one_variant
    from cinq.quant.variant_folder import Calibration, variant_folder
    root = Path(options.variants_dir) if options.variants_dir else cache_dir() / "variants"
    models = {REFERENCE: model}
    for scheme in SCHEMES:
        spec = one_variant(f"smoothquant:{scheme}")
        models[f"SmoothQuant W8A8 {scheme}"] = str(variant_folder(model, spec, root, progress=progress))
    lang = options.calibration_language
    if lang is not None:
        text = root / f"calibration-{lang}.txt"  # the variant's key names this file: its content is fixed by cinq
        body = "\n\n".join(language_records("calibration").get(lang, []))
        if not body:
            raise InvalidParameterError(f"the calibration text has no {lang} records", "calibration_language")
        root.mkdir(parents=True, exist_ok=True)
        if not text.is_file() or text.read_text(encoding="utf-8") != body:
            text.write_text(body, encoding="utf-8")
        models[single_language_label(lang)] = str(variant_folder(
            model, one_variant("smoothquant:static"), root, Calibration(text=str(text)), progress=progress))
    return models


def run_smoothquant_mix(config: EngineConfig, options: SmoothQuantMixOptions,
                        batch_mates: dict[str, list[dict[str, Any]]] | None = None,
                        progress: bool = True) -> BenchResult:
    """Measure bf16, static and dynamic SmoothQuant on one workload (see the module docstring). ``batch_mates``:
    a batch-mates run's rows by model label (its labels may carry a parenthesis, e.g. "bf16 (control)")."""
    from cinq.bench.served_quality import engine_quality, held_out_ids, reference_scores
    from benchmarks.text_languages import language_token_ids
    from cinq.config import resolve_model
    from cinq.eval.text_scores import base_scores, score_text
    from cinq.model.loader import load_model
    from cinq.model.tokenizer import Tokenizer
    options.validate()
    config = dataclasses.replace(config, model=str(resolve_model(config.model)), speculative_config=None,
                                 seed=config.seed if config.seed is not None else 0)
    models = smoothquant_models(config.model, options, progress)
    tokenizer = Tokenizer.from_pretrained(config.tokenizer or config.model)
    work = mixed_workload(tokenizer, options.workload)
    ids = held_out_ids(config.model, options.quality)
    base = reference_scores(config.model, ids, options.quality)
    per_lang = language_token_ids(tokenizer, options.language_tokens)
    ref = load_model(config.model, dtype="bfloat16")
    ctx = options.quality.context_len
    lang_base = {lang: base_scores(ref, t, ctx, len(t)) for lang, t in per_lang.items()}
    del ref
    bar = progress_bar(len(models) * (2 * options.rounds + 1), "smoothquant-mix", progress, unit="run")
    speed = _speed_rounds(config, models, work.requests, options, bar)
    reference_outputs = speed[REFERENCE]["outputs"]
    rows = []
    for label, folder in models.items():
        cfg = dataclasses.replace(config, model=folder)
        quality = engine_quality(cfg, ids, options.quality, base)
        served = load_model(folder, dtype=config.dtype, attention_backend=config.attention_backend or "sdpa")
        kl = {lang: score_text(served, t, ctx, lang_base[lang]).kl for lang, t in per_lang.items()}
        del served
        sp = speed[label]
        same = sum(a == b for a, b in zip(sp["outputs"], reference_outputs))
        rows.append({"label": label, "model": _label(folder, config.model), "inf": sp["inf"], "rate": sp["rate"],
                     "tok_s_rounds": sp["tok_s_rounds"], "quality": quality.to_dict(), "kl_by_language": kl,
                     "same_as_bf16": same, "batch_mates": _mates(label, batch_mates)})
        bar.update(1)
    bar.close()
    data = {**run_head(config, options, work), "language_tokens": {lang: len(t) for lang, t in per_lang.items()},
            "machine": machine_info(), "rows": rows}
    return smoothquant_mix_result(data)


def _speed_rounds(config: EngineConfig, models: dict[str, str], requests: list[Any],
                  options: SmoothQuantMixOptions, bar: Any) -> dict[str, dict[str, Any]]:
    """Each model at rate = inf and at the fixed rate, ``rounds`` times with the models' order rotated (a loaded
    machine drifts); per (model, rate) the run of median tokens/s is kept, every round's tokens/s recorded, and
    the greedy outputs of the first rate = inf run."""
    from cinq.bench.rate_run import build_engine, median_by, rotated, run_at_rate
    labels = list(models)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {lb: {"inf": [], "rate": []} for lb in labels}
    outputs: dict[str, list[list[int]]] = {}
    for rnd in range(options.rounds):
        for label in rotated(labels, rnd):
            for name, rate in (("inf", math.inf), ("rate", options.request_rate)):
                engine = build_engine(dataclasses.replace(config, model=models[label]))  # no prefix cache carried
                run = run_at_rate(engine, requests, rate, options.workload.seed)
                del engine
                runs[label][name].append(run.summary())
                outputs.setdefault(label, run.outputs)
                bar.update(1)
    out = {}
    for label in labels:
        out[label] = {"outputs": outputs[label],
                      "tok_s_rounds": {name: [r["tok_s"] for r in rs] for name, rs in runs[label].items()}}
        for name, rs in runs[label].items():
            out[label][name] = median_by(rs, "tok_s")
    return out


def _label(folder: str, reference: str) -> str:
    from pathlib import Path
    return model_label(folder) if folder == reference else "<variants>/" + Path(folder).name


def _mates(label: str, batch_mates: dict[str, list[dict[str, Any]]] | None) -> dict[str, int] | None:
    """A model's batch-mates totals (differing pairs of all pairs), matched by label (the bf16 row's may say
    "(control)")."""
    for name, rows in (batch_mates or {}).items():
        if name.removesuffix(" (control)") == label:
            return {"differ": sum(r["differ"] for r in rows), "pairs": sum(r["pairs"] for r in rows),
                    "batch_sizes": [r["batch"] for r in rows]}
    return None


def smoothquant_mix_result(data: dict[str, Any]) -> BenchResult:
    """The tables, the headline, the reading and the plot of one run's ``data``."""
    rows, rate = data["rows"], data["options"]["request_rate"]
    first = rows[0]
    n = data["workload"]["counts"]
    speed = Table(f"Speed under continuous batching: rate = inf and rate = {rate:g} req/s (ratios to {REFERENCE})",
                  ["model", "tok/s (inf)", f"x {REFERENCE}", "tok/s (inf) every round", "TTFT p50 / p99 ms (inf)",
                   "TPOT p50 / p99 ms (inf)",
                   f"tok/s ({rate:g}/s)", f"TTFT p50 / p99 ms ({rate:g}/s)", f"TPOT p50 / p99 ms ({rate:g}/s)",
                   f"greedy outputs = {REFERENCE}", "changed by batch mates"])
    for r in rows:
        i, f = r["inf"], r["rate"]
        m = r["batch_mates"]
        rounds = " / ".join(f"{x:.0f}" for x in r.get("tok_s_rounds", {}).get("inf", []))
        speed.rows.append([r["label"], i["tok_s"], i["tok_s"] / first["inf"]["tok_s"], rounds, _pair(i, "ttft"),
                           _pair(i, "tpot"), f["tok_s"], _pair(f, "ttft"), _pair(f, "tpot"),
                           f"{r['same_as_bf16']} / {i['num_requests']}",
                           f"{m['differ']} / {m['pairs']}" if m else None])
    quality = Table("Quality as served", ["model", "held-out ppl", f"KL to {REFERENCE}", "top-1 agreement %",
                                          "arith acc % ± SE"])
    for r in rows:
        q = r["quality"]
        acc = None if q["accuracy"] is None else f"{100 * q['accuracy']:.0f} ± {100 * q['accuracy_se']:.0f}"
        quality.rows.append([r["label"], q["perplexity"], _kl(q["kl"]), 100 * (q["top1"] or 0), acc])
    quant = [r for r in rows if r["label"] != REFERENCE]
    by_label = {r["label"]: r for r in rows}
    static, dynamic = by_label.get(STATIC), by_label.get(DYNAMIC)
    lang = data["options"].get("calibration_language")
    single = by_label.get(single_language_label(lang)) if lang else None
    langs = list(data["language_tokens"])
    ratios = []  # (column, numerator, denominator)
    if static and dynamic:
        ratios.append(("static / dynamic", static, dynamic))
    if single and static:
        ratios.append((f"{lang}-only static / static", single, static))
    by_lang = Table(f"KL to {REFERENCE} per language of the held-out text",
                    ["language", "tokens"] + [r["label"] for r in quant] + [c for c, _, _ in ratios])
    for lg in langs:
        kls = [r["kl_by_language"][lg] for r in quant]
        by_lang.rows.append([lg, data["language_tokens"][lg]] + [_kl(k) for k in kls] + [
            a["kl_by_language"][lg] / b["kl_by_language"][lg] if b["kl_by_language"][lg] else None
            for _, a, b in ratios])
    m = data["machine"]
    setup = (f"Model {data['config']['model']} ({data['config']['dtype']}, {data['config']['device']}) and its "
             f"SmoothQuant W8A8 copies (alpha 0.5, calibrated on the shipped calibration text, a mix of every "
             f"language of the corpus): static = one activation scale per tensor fixed at calibration, dynamic = "
             f"per token at run time"
             + (f"; one more static copy calibrated on the {lang} records of the calibration text alone" if single
                else "") + f". Workload: {sum(n.values())} mixed requests ({n}), "
             f"{data['workload']['prompt_tokens']} prompt and {data['workload']['output_tokens']} output tokens "
             f"(greedy, ignore_eos), all at once (inf) or as a Poisson process of {rate:g} req/s, in process, a "
             f"fresh engine per run; {data['options']['rounds']} rounds, the models' order rotated each round, the "
             f"run of median tokens/s shown per (model, rate). 'greedy outputs = {REFERENCE}': requests of the "
             f"first rate = inf run whose whole output equals the {REFERENCE} engine's. Quality: perplexity, KL and "
             f"top-1 to the {REFERENCE} model on the first {data['options']['quality']['ppl_tokens']} held-out "
             f"tokens (context {data['options']['quality']['context_len']}), arithmetic accuracy of the serving engine "
             f"on {data['options']['quality']['n_problems']} test problems; per language: the held-out records split "
             f"by language (benchmarks/text_languages.py, a script and common-word heuristic), up to "
             f"{data['options']['language_tokens']} tokens each. 'changed by batch mates': target requests whose "
             f"greedy output changed when run among other requests (benchmarks/batch_mates.py, its own run). CPU "
             f"threads {m['threads']} of {m['cpus']}; load average at end {m['loadavg_at_end']}.")
    headline = "; ".join(f"{r['label']}: {r['inf']['tok_s'] / first['inf']['tok_s']:.2f}x {REFERENCE} tok/s, KL "
                         f"{_kl(r['quality']['kl'])}" for r in quant)
    notes = [_reading(static, dynamic, single, lang, langs)] if static and dynamic else []

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
        ax1.bar([r["label"].replace("SmoothQuant W8A8 ", "SQ ") for r in rows], [r["inf"]["tok_s"] for r in rows])
        ax1.set_title("output tokens/s (rate = inf)")
        width = 0.8 / max(1, len(quant))
        for j, r in enumerate(quant):
            ax2.bar([x + j * width for x in range(len(langs))], [r["kl_by_language"][lg] for lg in langs],
                    width=width, label=r["label"])
        ax2.set_xticks([x + width * (len(quant) - 1) / 2 for x in range(len(langs))], langs)
        ax2.set_title(f"KL to {REFERENCE} per language")
        ax2.legend()

    return BenchResult("smoothquant-mix", "SmoothQuant static vs dynamic activation scales under continuous "
                       "batching with a mixed workload", setup, [speed, quality, by_lang], headline, data,
                       notes=notes, plot=plot)


def _reading(static: dict[str, Any], dynamic: dict[str, Any], single: dict[str, Any] | None, lang: str | None,
             langs: list[str]) -> str:
    """The reading paragraph, from the numbers."""
    s_kl, d_kl = static["kl_by_language"], dynamic["kl_by_language"]
    ratio = [s_kl[lg] / d_kl[lg] for lg in langs if d_kl[lg]]
    worst = max(langs, key=lambda lg: s_kl[lg])
    spread = max(s_kl.values()) / max(1e-12, min(s_kl.values()))
    speed = static["inf"]["tok_s"] / dynamic["inf"]["tok_s"]
    overall = static["quality"]["kl"] / dynamic["quality"]["kl"] if dynamic["quality"]["kl"] else float("nan")
    lo, hi = (min(ratio), max(ratio)) if ratio else (float("nan"), float("nan"))
    text = (f"Reading (from this run's numbers): static scales cost {overall:.2f}x the dynamic KL to bf16 overall, "
            f"{lo:.2f}x to {hi:.2f}x per language; static's worst language is {worst} (KL {_kl(s_kl[worst])}, "
            f"{spread:.1f}x its best). Static serves at {speed:.2f}x dynamic's tokens/s at rate = inf.")
    if single is not None:
        one = {lg: single["kl_by_language"][lg] / s_kl[lg] for lg in langs if s_kl[lg]}
        hurt = max(one, key=lambda lg: one[lg])
        text += (f" Calibrated on {lang} alone, static scales give {one.get(lang, float('nan')):.2f}x the "
                 f"mixed-calibration KL on {lang} itself and up to {one[hurt]:.2f}x on {hurt} (outputs equal to "
                 f"bf16: {single['same_as_bf16']} vs {static['same_as_bf16']} of the requests).")
    return text


def _pair(run: dict[str, Any], name: str) -> str:
    return f"{run[f'{name}_p50_ms']:.1f} / {run[f'{name}_p99_ms']:.1f}"


def _kl(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f}"
