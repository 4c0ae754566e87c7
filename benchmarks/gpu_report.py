"""The report of benchmarks/gpu.py: the markdown of a gpu.json (environment, findings, failed sections, the Triton
kernel tests and attention numbers typed from a log, then the check, throughput, decode, graphs and int4 tables)."""

from __future__ import annotations

from typing import Any, Iterable

from cinq.markdown_table import markdown_table


def render(r: dict[str, Any], sections: Iterable[str]) -> str:
    """The markdown of a gpu.json: findings, failed sections (in ``sections``' order), then each section's table."""
    env = r.get("environment", {})
    lines = ["# The CUDA path on a GPU (benchmarks/gpu.py)", "",
             f"{env.get('gpu', '?')}; torch {env.get('torch')}, Triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}. Baselines measured in the same run on the same GPU.", ""]
    if r.get("findings"):
        lines += ["## Findings", ""] + [f"- {x}" for x in r["findings"]] + [""]
    for name in sections:
        s = r.get(name)
        if s and "error" in s:
            lines += [f"## {name}: FAILED", "", "```", s["error"], "```", ""] + ([s["note"], ""] if "note" in s else [])
    kt = r.get("kernel_tests")
    if kt:
        lines += ["## Triton kernel tests, compiled for CUDA", "", f"`{kt['command']}`", ""]
        lines += [f"- passed: {x}" for x in kt["passed"]] + [f"- failed: {x}" for x in kt["failed"]]
        lines += [f"- not run: {kt['not_run']}", f"- first run: {kt['first_run']}", ""]
    a = r.get("attention_quick")
    if a:
        lines += [f"## Attention kernels ({a['source']})", "",
                  markdown_table(["prefill N", "Triton TFLOP/s", "% of bf16 peak", "torch flash SDPA TFLOP/s"],
                                 [[x["n"], f"{x['triton_tflops']:.0f}", f"{x['triton_pct_peak']}%",
                                   f"{x['torch_flash_tflops']:.0f}"] for x in a["prefill"]], "rrrr"),
                  "", markdown_table(["decode batch x context", "Triton GB/s", "% of copy bandwidth",
                                      "vs the sdpa backend"],
                                     [[f"{x['batch']} x {x['ctx']}", str(x["triton_gbs"]),
                                       f"{x['triton_pct_copy_bw']}%", f"{x['speedup_vs_sdpa_backend']}x"]
                                      for x in a["decode"]]), ""]
    c = r.get("check")
    if c and "error" not in c:
        lines += ["## Greedy tokens of cinq-tiny: CUDA against the CPU engine (float32, sdpa)", "",
                  f"{c['tokens_per_prompt']} tokens for each of 8 prompts.", "",
                  markdown_table(["run", "identical tokens (to first divergence)", "identical sequences"],
                                 [[k, f"{v['identical_prefix_fraction']:.1%}",
                                   f"{v['identical_sequences']}/{v['sequences']}"] for k, v in c.items()
                                  if isinstance(v, dict) and "identical_prefix_fraction" in v]), ""]
    t = r.get("throughput")
    if t and "error" not in t:
        lines += ["## Offline throughput (bf16, greedy, ignore_eos)", "",
                  markdown_table(["model", "requests", "output tokens", "cinq tok/s", "HF best tok/s", "cinq / HF"],
                                 [[x["model"], x["requests"], x["output_tokens"], f"{x['cinq_tok_s']:.0f}",
                                   f"{x['hf_best_tok_s']:.0f}", f"**{x['ratio']:.2f}x**"] for x in t["rows"]]), ""]
    d = r.get("decode")
    if d and "error" not in d:
        lines += ["## Batch-1 decode (bf16, 128-token prompt)", "",
                  f"Roofline = weight bytes / measured read bandwidth ({d['read_bandwidth_gb_s']:.0f} GB/s).", "",
                  markdown_table(["model", "weights MB", "cinq tok/s", "roofline tok/s", "of roofline", "HF tok/s",
                                  "cinq / HF"],
                                 [[x["model"], f"{x['weight_bytes'] / 1e6:.0f}", f"{x['cinq_tok_s']:.0f}",
                                   f"{x['roofline_tok_s']:.0f}", f"{x['cinq_fraction_of_roofline']:.0%}",
                                   f"{x.get('hf_tok_s', float('nan')):.0f}",
                                   f"**{x.get('ratio', float('nan')):.2f}x**"] for x in d["rows"]]), ""]
    g = r.get("graphs")
    if g and "error" not in g:
        lines += ["## The decode step as CUDA graphs (bf16 batch 1, 128-token prompt)", "",
                  f"cinq-tiny float32 greedy tokens identical to eager: {g['fp32_tokens_identical']}.", "",
                  markdown_table(["model", "mode", "cinq tok/s", "of roofline"],
                                 [[x["model"], x["mode"], f"{x['cinq_tok_s']:.0f}",
                                   f"{x['cinq_fraction_of_roofline']:.0%}"] for x in g["rows"]]), ""]
    q = r.get("int4")
    if q and "error" not in q:
        lines += [f"## int4 ({q['method']}) on {q['model']}", "",
                  markdown_table(["", "bf16", "int4", "int4 / bf16"], [
                      ["batch-1 decode tok/s", f"{q['decode_bf16']['cinq_tok_s']:.0f}",
                       f"{q['decode_int4']['cinq_tok_s']:.0f}", f"**{q['decode_int4_over_bf16']:.2f}x**"],
                      ["offline throughput tok/s", f"{q['throughput_bf16_tok_s']:.0f}",
                       f"{q['throughput_int4_tok_s']:.0f}", f"**{q['throughput_int4_over_bf16']:.2f}x**"]]), ""]
        if q.get("kernel"):
            lines += [markdown_table(["GEMM rows", "K x N", "Triton int4 us", "torch bf16 us", "int4 speed / bf16"],
                                     [[k["rows"], f"{k['k']} x {k['n']}", f"{k['int4_us']:.1f}", f"{k['bf16_us']:.1f}",
                                       f"{k['int4_over_bf16_speed']:.2f}x"] for k in q["kernel"]], "rlrrr"), ""]
    return "\n".join(lines)
