"""The figures of benchmarks/results_table.py computed from a result's JSON: one function per kind of record
(latency pairs, wait policies, speculation sweeps, servers, ...), each turning the JSON into the one-line figure its
row shows, and ``FIGURES``, which result uses which. A result not in ``FIGURES`` shows the headline its script
wrote (``results_table.figure_of``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def _latency_rows(rows: list[dict[str, Any]], threads: int, prompt: int) -> dict[str, dict[str, Any]]:
    return {r["engine"]: r for r in rows if r["threads"] == threads and r["prompt_len"] == prompt}


def smollm2_decode(d: dict[str, Any]) -> str:
    """cinq vs llama.cpp per variant at 2 threads, and at 1 thread where measured."""
    rows, one = _latency_rows(d["rows"], 2, 128), _latency_rows(d["rows"], 1, 128)

    def pair(r: dict[str, Any], v: str, base: str) -> str:
        return f"{r['cinq ' + v]['tok_s']:.1f} vs {r['llama.cpp ' + base]['tok_s']:.1f} tok/s " \
               f"({_x(r['cinq ' + v]['tok_s'], r['llama.cpp ' + base]['tok_s'])})"
    parts = [f"{name} {pair(rows, v, base)}" + (f", 1 thr {pair(one, v, base)}" if f"cinq {v}" in one else "")
             for name, v, base in (("bf16", "bf16", "bf16"), ("q8_0", "int8", "q8_0"), ("q4_0", "int4", "q4_0"),
                                   ("the Q4_1 file", "file", "file")) if f"cinq {v}" in rows]
    hf = rows.get("HF bf16")
    if hf:
        parts.append(f"HF generate bf16 {hf['tok_s']:.1f} (cinq {_x(rows['cinq bf16']['tok_s'], hf['tok_s'])} HF)")
    return "; ".join(parts)


# cinq's variant -> llama.cpp's engine on the same weights
_PAIRS = {"cinq int4": "llama.cpp q4_0", "cinq int8": "llama.cpp q8_0", "cinq bf16": "llama.cpp bf16",
          "cinq file": "llama.cpp file"}


def wait_policy(d: dict[str, Any]) -> str:
    """Per variant, cinq's best against llama.cpp's best (any policy; at any thread count, and at 1 thread), and
    cinq's int4 over its bf16, from the runs without a benchmark-made load (a separate condition) that gave a speed;
    a setting measured in several repeats counts as their median, as the result's table shows it."""
    runs: dict[tuple[str, int, str], list[float]] = {}
    for r in d["rows"]:
        if not r.get("under_load") and r.get("tok_s") is not None:
            runs.setdefault((r["engine"], r["threads"], r["policy"]), []).append(r["tok_s"])
    tok = {key: statistics.median(v) for key, v in runs.items()}

    def best(engine: str, threads: int | None = None) -> float | None:
        v = [x for (e, t, _), x in tok.items() if e == engine and threads in (None, t)]
        return max(v) if v else None

    parts = []
    for cinq, other in _PAIRS.items():
        if best(cinq) and best(other):
            part = f"{cinq.split()[1]}: {best(cinq):.1f} vs {best(other):.1f} tok/s (**{_x(best(cinq), best(other))}**)"
            if best(cinq, 1) and best(other, 1):
                part += f", 1 thr {best(cinq, 1):.1f} vs {best(other, 1):.1f} ({_x(best(cinq, 1), best(other, 1))})"
            parts.append(part)
    if best("cinq int4") and best("cinq bf16"):
        parts.append(f"cinq int4 / bf16: {_x(best('cinq int4'), best('cinq bf16'))}")
    from benchmarks.omp_wait_policy import roofline
    roof = roofline(d["rows"])
    for (variant, threads), c in roof.items():
        if variant == "bf16" and threads == max(t for v, t in roof if v == variant):
            parts.append(f"bf16 at {threads} thr: {100 * c['cinq_share']:.0f}% of the read roofline "
                         f"({c['roofline_tok_s']:.0f} tok/s), llama.cpp {100 * c.get('llama.cpp_share', 0):.0f}%")
    return "; ".join(parts)


def smollm2_bf16(d: dict[str, Any]) -> str:
    """cinq bf16 vs llama.cpp bf16 at 2 threads per prompt length: TTFT and decode speed."""
    parts = []
    for prompt in d["options"]["input_lens"]:
        rows = _latency_rows(d["rows"], 2, prompt)
        c, ll = rows["cinq bf16"], rows["llama.cpp bf16"]
        parts.append(f"prompt {prompt}: TTFT {c['ttft_ms']['mean']:.0f} vs {ll['ttft_ms']['mean']:.0f} ms, "
                     f"decode {c['tok_s']:.1f} vs {ll['tok_s']:.1f} tok/s ({_x(c['tok_s'], ll['tok_s'])})")
    return "; ".join(parts)


def gemma3_decode(d: dict[str, Any]) -> str:
    """Gemma 3 decode, cinq vs llama.cpp on the same file (and HF bf16) per prompt length, and its KV memory with
    per-group tables against one shared table."""
    parts = []
    for prompt in d["latency"]["options"]["input_lens"]:
        rows = _latency_rows(d["latency"]["rows"], 2, prompt)
        c, ll, hf = rows["cinq file"], rows["llama.cpp file"], rows.get("HF bf16")
        parts.append(f"prompt {prompt}: {c['tok_s']:.1f} vs {ll['tok_s']:.1f} tok/s ({_x(c['tok_s'], ll['tok_s'])})"
                     + (f", HF bf16 {hf['tok_s']:.1f}" if hf else ""))
    kv = ", ".join(f"{k['gemma3_per_group_tables_mib']:.1f} vs {k['gemma3_shared_table_mib']:.0f} MiB at "
                   f"{k['context']:,} tokens" for k in d["kv_memory"])
    return "; ".join(parts) + f"; KV with per-group (sliding-window) tables {kv}"


def gemma3_fair(d: dict[str, Any]) -> str:
    """Gemma 3's decode pair from the per-process policy run, and its KV memory from gemma3.json."""
    kv = json.loads((RESULTS / "gemma3.json").read_text())["kv_memory"]
    return wait_policy(d) + "; KV with per-group (sliding-window) tables " + ", ".join(
        f"{k['gemma3_per_group_tables_mib']:.1f} vs {k['gemma3_shared_table_mib']:.0f} MiB at {k['context']:,} tokens"
        for k in kv)


def throughput(d: dict[str, Any]) -> str:
    """Offline throughput, cinq vs HF generate, and the KV cache reserved but unused (paged vs max_model_len)."""
    return (f"{d['cinq']['tok_s']:.1f} vs {d['hf']['tok_s']:.1f} tok/s (**{d['ratio_cinq_over_hf']:.2f}x**), "
            f"{d['workload']['num_requests']} requests; KV reserved but unused {d['cinq']['kv_waste_paged']:.1%} "
            f"vs {d['cinq']['kv_waste_naive_max_len']:.1%} at max_model_len per request")


def speculation(d: dict[str, Any]) -> str:
    """The synthetic speculation sweep: the best method at batch 1, the named methods' speed-ups, batch 32's
    adaptive range and whether greedy output matched plain decoding."""
    b1 = [r for r in d["batch_sweep"] if r["batch"] == 1 and r["target"] == "bf16"]
    best = max(b1, key=lambda r: r["speedup"])
    fixed = {r["method"]: r for r in b1 if not r["adaptive"]}
    named = "; ".join(f"{m} {fixed[m]['speedup']:.2f}x (tau {fixed[m]['tau']:.2f})"
                      for m in ("ngram", "eagle", "eagle3-dynamic", "draft_model") if m in fixed)
    b32 = [r["speedup"] for r in d["batch_sweep"] if r["batch"] == 32 and r["target"] == "bf16" and r["adaptive"]]
    same = all(r["greedy_identical"] for r in b1 if not r["adaptive"] and r["method"] != "draft_model")
    return (f"k = 3, batch 1: best {best['method']}{' adaptive' if best['adaptive'] else ''} "
            f"{best['speedup']:.2f}x; {named}"
            + (f"; batch 32 adaptive {min(b32):.2f}-{max(b32):.2f}x" if b32 else "")
            + ("; greedy output identical to plain" if same else ""))


def quant_quality(d: dict[str, Any]) -> str:
    """Perplexity, accuracy and linear bytes of the picked quantization formats against the first (dense) row."""
    rows = {r["label"]: r for r in d["rows"]}
    base = d["rows"][0]

    def row(label: str, name: str) -> str:
        r = rows[label]
        return (f"{name} ppl {100 * (r['perplexity'] / base['perplexity'] - 1):+.1f}%, accuracy "
                f"{100 * (r['accuracy'] - base['accuracy']):+.1f} pt, {r['linear_bytes'] / 2**20:.1f} MiB")
    picks = [(lb, name) for lb, name in (("nf4-b64", "NF4 b64"), ("rtn-w4-g64", "RTN int4 g64"),
                                           ("fp8-channel-weight-only", "FP8 weight-only"), ("rtn-w8-ch", "int8 RTN"))
             if lb in rows]
    return (f"vs dense bf16 ({base['n_problems']} {d['task']} problems): "
            + "; ".join(row(lb, name) for lb, name in picks))


def quant_study(d: dict[str, Any]) -> str:
    """Any `cinq eval --variants` study: the spread of its rows against its first (the reference)."""
    base, rows = d["rows"][0], d["rows"][1:]
    ppl = [100 * (r["perplexity"] / base["perplexity"] - 1) for r in rows]
    acc = [100 * (r["accuracy"] - base["accuracy"]) for r in rows if r.get("accuracy") is not None]
    return (f"{len(rows)} variants vs {base['label']} on {d['task']}: perplexity {min(ppl):+.1f}% to "
            f"{max(ppl):+.1f}%" + (f", accuracy {min(acc):+.1f} to {max(acc):+.1f} pt" if acc else ""))


def server(d: dict[str, Any]) -> str:
    """The OpenAI server at rate = inf against the offline engine: output tok/s and each process's cores."""
    run = next(r for r in d["runs"] if r["request_rate"] in (None, "inf", float("inf")))
    return (f"{run['output_throughput']:.0f} vs {d['baseline']['output_throughput']:.0f} out tok/s "
            f"(**{d['ratio_server_over_offline']:.2f}x**), {run['completed']} streams, engine core in its own "
            f"process ({run['core_cores']:.2f} cores; front end {run['server_cores']:.2f})")


def speculation_real(d: dict[str, Any]) -> str:
    """A real-model speculation run (greedy rows): each method's best at the smallest batch measured, and every
    method at the largest."""
    rows = [r for r in d["rows"] if r.get("sampling", "greedy") == "greedy"]
    best: dict[str, dict[str, Any]] = {}
    least, most = min(r["batch"] for r in rows), max(r["batch"] for r in rows)
    for r in rows:
        if r["batch"] == least and (r["method"] not in best or r["speedup"] > best[r["method"]]["speedup"]):
            best[r["method"]] = r
    at_most = ", ".join(f"{r['method']} {r['speedup']:.2f}x" for r in rows if r["batch"] == most)
    def one(m: str, r: dict[str, Any]) -> str:
        decode = f", decode {r['decode_speedup']:.2f}x" if r.get("decode_speedup") else ""
        per_step = f", {r['tokens_per_step']:.2f} tokens per step" if r.get("tokens_per_step") else ""
        # an adaptive arm that mostly chose not to draft: its figure is plain decoding's, within the run's noise
        off = (r.get("k_share") or [0.0])[0]
        share = f", k = 0 on {off:.0%} of steps" if off >= 0.5 else ""
        return f"{m} **{r['speedup']:.2f}x** (tau {r['tau'] or 1:.2f}{per_step}{decode}{share})"
    return (f"batch {least}: " + ", ".join(one(m, r) for m, r in best.items())
            + (f"; batch {most}: {at_most}" if most != least else ""))


def step_breakdown(d: dict[str, Any]) -> str:
    """The clean decode step per (model, threads): before -> after and the speed-up, or after alone."""
    parts = []
    for r in d["runs"]:
        after = r["after"]["step_ms_median"]
        before = r.get("before", {}).get("step_ms_median")
        parts.append(f"{r['model']} {r['threads']} thr " + (f"{before:.2f} -> {after:.2f} ms ({_x(before, after)})"
                                                              if before else f"{after:.2f} ms"))
    return f"batch {d.get('batch', 1)}, prompt {d.get('prompt_len', 32)}: " + "; ".join(parts)


def structured(d: dict[str, Any]) -> str:
    """Structured outputs: valid JSON per model and speculation, and the step cost's overhead per model and batch."""
    valid = ", ".join(f"{v['model']} {v['speculation']}: {v['valid']}/{d['schemas']}" for v in d["validity"])
    cost = ", ".join(f"{c['model']} b{c['batch']} {100 * c['overhead']:+.1f}%" for c in d["step_cost"])
    return f"valid JSON {valid}; step cost {cost}"


def reliability(d: dict[str, Any]) -> str:
    """The server's soak, overload and disconnect runs: requests completed, RSS growth, blocks freed."""
    s, o, c = d["soak"], d["overload"], d["disconnects"]
    return (f"{s['completed']:,} of {s['requests']:,} mixed requests completed, RSS "
            f"{s['rss']['growth_after_warmup_pct']:+.1f}% after warm-up; {o['completed']} of {o['streams']} "
            f"streams at {o['demand_x']}x KV capacity ({o['preemptions']} preemptions); {c['clients']} vanishing "
            f"clients, {c['free_blocks_after']} of {c['num_kv_blocks']} blocks free after")


def gpu(d: dict[str, Any]) -> str:
    """The CUDA path: offline throughput against HF per model, and the Triton fp32 greedy check against the CPU."""
    tp = ", ".join(f"{r['model']} {r['ratio']:.2f}x" for r in d["throughput"]["rows"])
    check = d["check"]["cinq_triton_float32_vs_cinq_cpu_float32"]
    return (f"{d['environment']['gpu']}: offline throughput vs HF {tp}; Triton fp32 greedy tokens identical to the "
            f"CPU engine's on {check['identical_sequences']}/{check['sequences']} prompts")


# result stem -> its figure computed from the JSON, for results whose JSON has no one-line headline of its own
# (or whose headline leaves out what the tables need); every other result shows the headline its script wrote
FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "latency_smollm2": smollm2_decode, "omp_wait_policy": wait_policy, "omp_wait_policy_after_attention": wait_policy,
    "omp_wait_policy_gemma3": gemma3_fair,
    "latency_smollm2_bf16": smollm2_bf16, "gemma3": gemma3_decode,
    "throughput_gemma3": throughput, "throughput": throughput, "throughput_smollm2": throughput,
    "quant_study_float_codes": quant_quality, "speculative": speculation, "speculative_smollm2": speculation_real,
    "speculative_smollm2_copy": speculation_real, "speculative_smollm2_bf16": speculation_real,
    "speculative_smollm2_copy_bf16": speculation_real, "speculative_smollm2_trees_bf16": speculation_real,
    "speculative_smollm2_copy_bf16_eos": speculation_real, "speculative_smollm2_copy_eos": speculation_real,
    "speculative_smollm2_greedy": speculation_real, "speculative_smollm2_bf16_b1": speculation_real,
    "speculative_smollm2_bf16_batches": speculation_real,
    "serving_split": server,
    "serving_smollm2": server, "structured_outputs": structured,
    "reliability": reliability, "gpu": gpu, "step_breakdown": step_breakdown,
    "step_breakdown_context_b1": step_breakdown, "step_breakdown_context_b4": step_breakdown,
}
