"""The offline throughput benchmark's report (cinq/bench/throughput.py measures): tables, headline and figure
from its data dict."""

from __future__ import annotations

from typing import Any

from cinq.bench.report import BenchResult, Table, run_conditions


def throughput_result(data: dict[str, Any], missing: str | None) -> BenchResult:
    """The report of one run's ``data`` (``missing``: why there is no baseline, if there is none)."""
    c, h, b1, w, roof = data["cinq"], data["hf"], data["batch1"], data["workload"], data["roofline"]
    runs = data["variants"]
    rows: list[list[Any]] = [[r["engine"], r["model"], r["tok_s"], r["seconds"],
                              f"continuous batching, {r['steps']} steps"] for r in runs]
    if h:
        probes = ", ".join(f"b{p['batch_size']}={p['tok_s']:.1f}" for p in data["hf_probes"])
        rows.append(["HF transformers generate (baseline)", data["hf_model"], h["tok_s"], h["seconds"],
                     f"best batch size {h['batch_size']} (probes: {probes})"])
        rows += [[f"{r['engine']} / HF", "", r["ratio_over_hf"], "", "ratio of output tok/s"] for r in runs]
    m = data["machine"]
    _, conditions = run_conditions(m.get("load_at_start", m["loadavg_at_end"][0]))
    same = (" transformers runs the GGUF file's dense folder (dequantized by cinq): the same numbers as cinq's "
            "file." if h and data["hf_model"] != data["config"]["model"] else "")
    setup = (f"{conditions} Model {data['config']['model']} ({data['config']['dtype']}); {w['num_requests']} "
             f"requests queued at once, prompts uniform in {w['prompt_len']} tokens, outputs uniform in "
             f"{w['output_len']} (ignore_eos, greedy): {w['prompt_tokens']} prompt + {w['output_tokens']} output "
             f"tokens. CPU threads {m['threads']}; load average at end {m['loadavg_at_end']}.{same}")
    roofline = f"{100 * max(r['fraction_of_peak'] for r in runs):.0f}% of the compute roofline"
    if h:
        ratios = ", ".join(f"{r['engine']} / HF = {r['ratio_over_hf']:.2f}x" for r in runs)
        headline = f"{ratios} output tokens/s; {roofline}"
    else:
        headline = (f"cinq: {c['tok_s']:.1f} output tokens/s, {roofline}; "
                    f"{missing or 'baseline skipped (--no-baseline)'}")
    f = roof["flops"]
    tables = [
        Table("Offline throughput", ["engine", "model", "output tok/s", "seconds", "notes"], rows),
        Table(f"Compute roofline (workload {roof['total_flops'] / 1e12:.2f} TFLOP: decoder linears "
              f"{f['decoder_linears'] / 1e12:.2f}, LM head {f['lm_head'] / 1e12:.2f}, attention "
              f"{f['attention'] / 1e12:.3f}; peak {roof['peak_flop_s'] / 1e9:.1f} GFLOP/s, a 2048^3 "
              f"{roof['peak_dtype']} matmul at the same thread count)",
              ["engine", "GFLOP/s", "fraction of peak (%)"],
              [[r["engine"], r["flop_s"] / 1e9, 100 * r["fraction_of_peak"]] for r in runs]),
        Table(f"Batch-1 decode ({c['engine']})", ["measure", "value"], [
            ["cinq tok/s", b1["tok_s"]], ["weights (MB)", b1["weight_bytes"] / 1e6],
            ["measured read bandwidth (GB/s)", b1["read_bandwidth_gb_s"]],
            ["roofline tok/s (bandwidth / weight bytes)", b1["roofline_tok_s"]],
            ["fraction of roofline (%)", 100 * b1["fraction_of_roofline"]]]),
        Table(f"KV memory waste ({c['engine']}; reserved but unused / reserved, mean over steps)",
              ["layout", "waste (%)"], [
                  [f"cinq paged (block {data['config']['block_size']})", 100 * c["kv_waste_paged"]],
                  [f"naive per-request max_model_len ({c['max_model_len']}) reservation",
                   100 * c["kv_waste_naive_max_len"]]]),
    ]

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        names = [r["engine"] for r in runs] + [f"HF b{p['batch_size']}" for p in data["hf_probes"]]
        names += ["HF best"] if h else []
        values = [r["tok_s"] for r in runs] + [p["tok_s"] for p in data["hf_probes"]] + ([h["tok_s"]] if h else [])
        ax1.bar(names, values, color=["tab:blue"] * len(runs) + ["tab:gray"] * (len(names) - len(runs)))
        ax1.set_ylabel("output tokens/s")
        ax1.set_title("throughput (HF probes run a prefix of the requests)")
        ax2.bar(["cinq paged", "naive max_len"], [100 * c["kv_waste_paged"], 100 * c["kv_waste_naive_max_len"]])
        ax2.set_ylabel("KV waste (%)")
        ax2.set_title("KV cache waste")

    return BenchResult("throughput", "Offline throughput: cinq vs HF transformers (same model, same requests, "
                       "one run)", setup, tables, headline, data, plot=plot)
