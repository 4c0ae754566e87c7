"""The roofline against what cinq measured on this machine: every row of ``benchmarks/results`` whose model,
precision, batch and context are known, predicted vs measured decode tokens/s.

Rows read (each file is optional; missing ones are skipped and named):
- ``throughput.json`` ``batch1``: the ~110M Llama (768/12L/12H, vocab 32000, tied), bf16, one sequence, a 32-token
  prompt and 256 new tokens (context ~160);
- ``quant.json`` ``serving``: the same model as bf16 / int8 (per channel) / int4 (group 128), batch 1 (32-token
  prompts, 128 new tokens) and batch 32 (64 new tokens); its W8A8 and int4-LM-head rows are left out (the plan
  does not model activation quantization or a quantized head);
- ``speculative.json`` plain decoding: cinq-tiny bf16 at batch 1 / 4 / 16 / 32 and int4 at batch 1 (prompts of
  at most 24 tokens, 64 new tokens: context ~56).

Measured tokens/s count every step of a run, prefill included; the context is each run's mean. The fit
``measured step time = a + s * batch + memory time / e_mem + compute time / e_flop`` (non-negative least squares
in relative error over the rows, memory and compute time the roofline's two terms) turns the roofline into a
calibrated prediction for this machine: ``a`` is the per-step work that does not scale with bytes (Python,
scheduling, norms, rope), ``s`` the per-sequence work (sampling, detokenizing, block tables), ``e_mem`` and
``e_flop`` the fractions of the bandwidth and FLOP/s cinq's kernels reach (above 1 when a small model's weights
stay in the 32 MiB L3 cache, which reads faster than memory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.plan.devices import Device
from cinq.plan.memory import Precision
from cinq.plan.report import Section
from cinq.plan.roofline import decode_step
from cinq.plan.shapes import ModelShape, resolve_shape


@dataclass(slots=True, frozen=True)
class MeasuredRow:
    """One measured decode speed with everything the roofline needs to predict it."""

    source: str  # file and row
    shape: ModelShape
    precision: Precision
    batch: int
    context_len: int
    threads: int
    measured_tok_s: float


@dataclass(slots=True, frozen=True)
class CalibratedRow:
    row: MeasuredRow
    roofline_tok_s: float
    calibrated_tok_s: float  # the fit over every row
    held_out_tok_s: float | None  # the fit over the other rows only (None with fewer than 5 rows)

    @property
    def fraction_of_roofline(self) -> float:
        return self.row.measured_tok_s / self.roofline_tok_s


@dataclass(slots=True, frozen=True)
class Calibration:
    """The rows and the fitted step-time model: seconds = coef . (1, batch, roofline memory time, roofline
    compute time)."""

    device: Device
    rows: list[CalibratedRow]
    coef: list[float]
    skipped: list[str]

    def step_seconds(self, batch: int, memory_s: float, compute_s: float) -> float:
        """The calibrated time of a step whose roofline terms are ``memory_s`` and ``compute_s``."""
        return sum(c * f for c, f in zip(self.coef, (1.0, float(batch), memory_s, compute_s)))


def bench_llama_shape(model: dict[str, Any]) -> ModelShape:
    """The benchmarks' ~110M Llama from the shape their JSON records (MHA, tied embeddings, 2048 positions:
    benchmarks/throughput.py builds it so)."""
    heads = int(model["heads"])
    cfg = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": int(model["vocab"]), "hidden_size": int(model["hidden"]),
        "intermediate_size": int(model["intermediate"]), "num_hidden_layers": int(model["layers"]),
        "num_attention_heads": heads, "num_key_value_heads": heads, "max_position_embeddings": 2048,
        "tie_word_embeddings": True}, source="benchmark model")
    return ModelShape(f"llama-{model['hidden']}x{model['layers']}", cfg)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_rows(results_dir: str | Path) -> tuple[list[MeasuredRow], list[str]]:
    """The measured rows found under ``results_dir``, and the files that were missing or unreadable."""
    results = Path(results_dir)
    rows: list[MeasuredRow] = []
    skipped: list[str] = []
    bf16 = Precision.from_name("bfloat16")
    if (t := _load(results / "throughput.json")) is not None:
        shape = bench_llama_shape(t["workload"]["model"])
        rows.append(MeasuredRow("throughput.json batch1", shape, bf16, 1, 32 + 256 // 2,
                                int(t["machine"]["threads"]), float(t["batch1"]["tok_s"])))
    else:
        skipped.append("throughput.json")
    if (q := _load(results / "quant.json")) is not None:
        shape = bench_llama_shape(q["model"])
        precisions = {"bf16": bf16, "int8": Precision.from_name("int8", -1), "int4": Precision.from_name("int4", 128)}
        for r in q["serving"]:
            if r["variant"] in precisions:
                for key, batch, new in (("batch1", 1, 128), ("batch32", 32, 64)):
                    rows.append(MeasuredRow(f"quant.json {r['variant']} {key}", shape, precisions[r["variant"]],
                                            batch, 32 + new // 2, int(q["env"]["threads"]),
                                            float(r[key]["tokens_per_s"])))
    else:
        skipped.append("quant.json")
    if (s := _load(results / "speculative.json")) is not None:
        tiny = resolve_shape("cinq-tiny")
        seen: set[tuple[str, int]] = set()
        for r in s["batch_sweep"]:
            key = (r["target"], int(r["batch"]))
            if key in seen or r["target"] not in ("bf16", "int4"):
                continue
            seen.add(key)
            p = bf16 if r["target"] == "bf16" else Precision.from_name("int4", 128)
            rows.append(MeasuredRow(f"speculative.json plain {r['target']} b{key[1]}", tiny, p, key[1],
                                    24 + int(s["machine"]["max_tokens"]) // 2, int(s["machine"]["threads"]),
                                    float(r["plain_tok_s"])))
    else:
        skipped.append("speculative.json")
    return rows, skipped


TERMS = ("per-step overhead", "per-sequence overhead", "memory time", "compute time")


def fit(features: list[list[float]], targets: list[float]) -> list[float]:
    """Non-negative least squares of ``targets`` on ``features`` in relative error (each row weighted by
    1 / target, so a 4 ms step counts as much as a 40 ms one): the most negative coefficient's term is dropped
    and the rest refitted until none is negative. Dropped terms get 0."""
    import numpy as np
    x, y = np.asarray(features, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    w = 1.0 / y
    active = list(range(x.shape[1]))
    while True:
        coef = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)[0]
        if (coef >= 0).all() or len(active) == 1:
            out = [0.0] * x.shape[1]
            for i, c in zip(active, coef):
                out[i] = max(0.0, float(c))
            return out
        active.pop(int(np.argmin(coef)))


def calibrate(device: Device, results_dir: str | Path) -> Calibration:
    """Predict every measured row on ``device`` (this machine's CPU) and fit the step-time model."""
    rows, skipped = read_rows(results_dir)
    if not rows:
        raise InvalidParameterError(f"--results-dir: no benchmark results in {str(results_dir)!r} (looked for "
                                    f"{', '.join(skipped)})", "results_dir")
    steps = [decode_step(r.shape.config, r.precision, device, r.batch, r.context_len) for r in rows]
    features = [[1.0, float(r.batch), s.memory_s, s.compute_s] for r, s in zip(rows, steps)]
    targets = [r.batch / r.measured_tok_s for r in rows]
    coef = fit(features, targets)

    def predict(c: list[float], i: int) -> float:
        return rows[i].batch / sum(a * f for a, f in zip(c, features[i]))

    # Each row predicted by a fit that never saw it: the honest error of the calibrated model
    held_out = [predict(fit(features[:i] + features[i + 1:], targets[:i] + targets[i + 1:]), i)
                if len(rows) >= 5 else None for i in range(len(rows))]
    out = [CalibratedRow(r, r.batch / s.seconds, predict(coef, i), held_out[i])
           for i, (r, s) in enumerate(zip(rows, steps))]
    return Calibration(device, out, coef, skipped)


def calibrated_tokens_per_s(cal: Calibration, shape: ModelShape, precision: Precision, batch: int,
                            context_len: int) -> float:
    """Decode tokens/s of ``batch`` sequences at ``context_len`` on the calibrated machine: the roofline's terms
    through the fitted step-time model (meaningful for this machine's CPU and models like the fitted rows)."""
    s = decode_step(shape.config, precision, cal.device, batch, context_len)
    return batch / cal.step_seconds(batch, s.memory_s, s.compute_s)


def calibration_sections(cal: Calibration) -> tuple[str, list[Section], list[str]]:
    """The calibration as (title, sections, notes) for report.render_sections."""
    d = cal.device
    rows = [[c.row.source, c.row.shape.name, c.row.precision.name, str(c.row.batch), str(c.row.context_len),
             str(c.row.threads), f"{c.roofline_tok_s:,.1f}", f"{c.row.measured_tok_s:,.1f}",
             f"{c.fraction_of_roofline:.0%}", f"{c.calibrated_tok_s:,.1f}",
             f"{c.calibrated_tok_s / c.row.measured_tok_s - 1:+.0%}",
             "-" if c.held_out_tok_s is None else f"{c.held_out_tok_s / c.row.measured_tok_s - 1:+.0%}"]
            for c in cal.rows]
    header = ["benchmark row", "model", "dtype", "batch", "context", "threads", "roofline tok/s", "measured tok/s",
              "measured / roofline", "calibrated tok/s", "error", "held-out error"]
    a, s, m, f = cal.coef
    eff = [f"{1 / c:.0%}" if c > 0 else "dropped" for c in (m, f)]
    notes = [f"roofline on {d.name}: {d.bandwidth_gbs:.1f} GB/s read bandwidth, {d.tflops:.3f} bf16 TFLOP/s",
             f"calibrated step time = {a * 1e3:.2f} ms + {s * 1e3:.3f} ms x batch + memory time / {eff[0]} + "
             f"compute time / {eff[1]} (non-negative least squares in relative error over these rows); held-out "
             f"error: each row predicted by the fit over the other rows"]
    if cal.skipped:
        notes.append(f"not found (skipped): {', '.join(cal.skipped)}")
    return "calibration: cinq's measured decode speed vs the roofline", [("rows", header, rows)], notes


def calibration_dict(cal: Calibration) -> dict[str, Any]:
    """The calibration as a JSON-ready dict."""
    return {"device": cal.device.name, "bandwidth_gbs": cal.device.bandwidth_gbs, "tflops": cal.device.tflops,
            "coef": dict(zip(TERMS, cal.coef)), "skipped": cal.skipped, "rows": [
                {"source": c.row.source, "model": c.row.shape.name, "dtype": c.row.precision.name,
                 "batch": c.row.batch, "context_len": c.row.context_len, "threads": c.row.threads,
                 "roofline_tok_s": c.roofline_tok_s, "measured_tok_s": c.row.measured_tok_s,
                 "calibrated_tok_s": c.calibrated_tok_s, "held_out_tok_s": c.held_out_tok_s} for c in cal.rows]}
