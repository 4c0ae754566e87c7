"""Offline throughput: cinq vs Hugging Face transformers `generate` on the same model and the same requests.

Workload (issue 2): a ~110M-parameter Llama with random weights (hidden 768, 12 layers, 12 heads, vocab 32000),
128 requests, prompt lengths uniform 32-512, output lengths uniform 32-256, ignore_eos, bf16, greedy.
HF runs batched (left padding) at its best batch size among a few, each batch generating up to its longest
requested output; only requested tokens count. Also measured: cinq batch-1 decode tokens/s against the memory
roofline (weight bytes / measured read bandwidth), and KV-cache waste (reserved but unused slots / reserved,
averaged over engine steps) against a naive per-request reservation of max_model_len slots.

    python benchmarks/throughput.py            # full run, writes benchmarks/results/throughput.{md,json}
    python benchmarks/throughput.py --quick    # small smoke version
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py
import torch  # noqa: E402

from cinq.config import EngineConfig  # noqa: E402
from cinq.engine.engine import LLMEngine  # noqa: E402
from cinq.model.byte_tokenizer import save_byte_tokenizer  # noqa: E402
from cinq.model.config import ModelConfig  # noqa: E402
from cinq.model.saver import init_random_model, save_model  # noqa: E402
from cinq.sampling_params import OutputKind, SamplingParams  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def build_model(path: Path, hidden: int, layers: int, heads: int, inter: int, vocab: int) -> Path:
    """The benchmark model folder (built once, cached): tied embeddings give ~110M parameters at 768/12/2048."""
    if (path / "config.json").is_file():
        return path
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "max_position_embeddings": 2048, "tie_word_embeddings": True,
        "bos_token_id": 256, "eos_token_id": 262})
    model = init_random_model(config, seed=0, dtype=torch.bfloat16)
    save_model(model, path, torch.bfloat16)
    save_byte_tokenizer(path)  # ids >= its 263 tokens decode to nothing; detokenization still runs
    return path


def workload(n: int, vocab: int, seed: int, plo: int, phi: int, olo: int, ohi: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(300, vocab) for _ in range(rng.randint(plo, phi))], rng.randint(olo, ohi))
            for _ in range(n)]


def run_cinq(path: Path, reqs: list[tuple[list[int], int]], max_num_seqs: int, budget: int) -> dict:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="bfloat16", max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=budget, kv_cache_memory=4.0))
    for i, (prompt, out_len) in enumerate(reqs):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True,
                                                           output_kind=OutputKind.FINAL_ONLY))
    bs, max_len = engine.config.block_size, engine.max_model_len
    waste_paged, waste_naive, steps, gen = [], [], 0, 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            gen += len(out.outputs[0].token_ids)
        steps += 1
        running = engine.scheduler.running
        if running:
            used = sum(r.num_computed_tokens for r in running)
            reserved = (engine.kv.num_blocks - engine.kv.num_free_blocks) * bs
            waste_paged.append(1 - used / reserved)
            waste_naive.append(1 - used / (len(running) * max_len))
    elapsed = time.perf_counter() - t0
    expected = sum(o for _, o in reqs)
    assert gen == expected, (gen, expected)
    return {"tokens": gen, "seconds": elapsed, "tok_s": gen / elapsed, "steps": steps,
            "kv_waste_paged": sum(waste_paged) / len(waste_paged),
            "kv_waste_naive_max_len": sum(waste_naive) / len(waste_naive), "max_model_len": max_len}


def run_hf(path: Path, reqs: list[tuple[list[int], int]], batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    gen_cfg = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    useful = 0
    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch_size):
        batch = reqs[start:start + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, (p, _) in enumerate(batch):  # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        new = max(o for _, o in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg,
                                 max_new_tokens=new, min_new_tokens=new)
        assert out.shape[1] == width + new
        useful += sum(o for _, o in batch)
    elapsed = time.perf_counter() - t0
    return {"batch_size": batch_size, "tokens": useful, "seconds": elapsed, "tok_s": useful / elapsed}


def read_bandwidth() -> float:
    """Bytes/s of a streaming read over a buffer far larger than the caches (best of several sums)."""
    x = torch.ones(256 * 2**20 // 4, dtype=torch.float32)  # 256 MiB (fp32: torch's bf16 sum is not vectorised)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * x.element_size() / best


def batch1_decode(path: Path, new_tokens: int) -> dict:
    engine = LLMEngine(EngineConfig(model=str(path), dtype="bfloat16", kv_cache_memory=1.0))
    engine.add_request("b1", list(range(300, 332)), SamplingParams(temperature=0, max_tokens=new_tokens,
                                                                   ignore_eos=True))
    engine.step()  # prefill + first token
    t0 = time.perf_counter()
    n = 0
    while engine.has_unfinished_requests():
        engine.step()
        n += 1
    elapsed = time.perf_counter() - t0
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bw = read_bandwidth()
    roofline = bw / weight_bytes
    return {"tok_s": n / elapsed, "weight_bytes": weight_bytes, "read_bandwidth_gb_s": bw / 1e9,
            "roofline_tok_s": roofline, "fraction_of_roofline": (n / elapsed) / roofline}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny workload for a smoke run (not for the record)")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--hf-batch-sizes", default="8,16,32,64")
    ap.add_argument("--hf-probe-requests", type=int, default=32,
                    help="requests used to pick HF's best batch size before its full run")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--model-dir", default=str(Path(os.environ.get("CINQ_CACHE_DIR", Path.home() / ".cache" / "cinq"))
                                                / "bench-llama-110m"))
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    hidden, layers, heads, inter, vocab = 768, 12, 12, 2048, 32000
    plo, phi, olo, ohi = 32, 512, 32, 256
    if args.quick:
        args.num_requests, args.hf_probe_requests, args.hf_batch_sizes = 16, 8, "8"
        phi, ohi = 128, 64
    path = build_model(Path(args.model_dir), hidden, layers, heads, inter, vocab)
    reqs = workload(args.num_requests, vocab, 0, plo, phi, olo, ohi)
    print(f"model {path}: threads={torch.get_num_threads()}, {len(reqs)} requests, "
          f"{sum(len(p) for p, _ in reqs)} prompt + {sum(o for _, o in reqs)} output tokens", flush=True)

    ours = run_cinq(path, reqs, args.max_num_seqs, args.max_num_batched_tokens)
    print(f"cinq: {ours['tok_s']:.1f} tok/s ({ours['seconds']:.1f}s, {ours['steps']} steps)", flush=True)
    hf, probes = None, []
    if not args.skip_hf:
        for b in [int(x) for x in args.hf_batch_sizes.split(",")]:
            probe = run_hf(path, reqs[:max(args.hf_probe_requests, b)], b)
            probes.append(probe)
            print(f"hf probe batch {b}: {probe['tok_s']:.1f} tok/s", flush=True)
        best = max(probes, key=lambda r: r["tok_s"])["batch_size"]
        hf = run_hf(path, reqs, best)
        print(f"hf (batch {best}): {hf['tok_s']:.1f} tok/s ({hf['seconds']:.1f}s)", flush=True)
    b1 = batch1_decode(path, 64 if args.quick else 256)
    print(f"batch-1 decode: {b1['tok_s']:.1f} tok/s, roofline {b1['roofline_tok_s']:.1f} tok/s "
          f"({100 * b1['fraction_of_roofline']:.0f}%)", flush=True)

    result = {"workload": {"num_requests": len(reqs), "prompt_len": [plo, phi], "output_len": [olo, ohi],
                           "model": {"hidden": hidden, "layers": layers, "heads": heads, "intermediate": inter,
                                     "vocab": vocab, "params": None}},
              "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__, "loadavg_at_end": os.getloadavg()},
              "cinq": ours, "hf_probes": probes, "hf": hf, "batch1": b1,
              "ratio_cinq_over_hf": ours["tok_s"] / hf["tok_s"] if hf else None, "quick": args.quick}
    ratio = f"{result['ratio_cinq_over_hf']:.2f}x" if hf else "n/a"
    print(f"RATIO cinq / HF = {ratio}")
    if not args.quick:
        write(result)


def write(r: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "throughput.json").write_text(json.dumps(r, indent=2) + "\n")
    c, h, b1 = r["cinq"], r["hf"], r["batch1"]
    lines = [
        "# Offline throughput: cinq vs HF transformers (same model, same requests, one run)",
        "",
        f"Workload: {r['workload']['num_requests']} requests, prompts U{tuple(r['workload']['prompt_len'])}, outputs "
        f"U{tuple(r['workload']['output_len'])}, ignore_eos, greedy, bf16; Llama 768/12L/12H/2048, vocab 32000, "
        f"random weights. CPU threads: {r['machine']['threads']}; load average at end {r['machine']['loadavg_at_end']}.",
        "",
        "| engine | output tok/s | seconds | notes |",
        "|---|---:|---:|---|",
        f"| cinq | {c['tok_s']:.1f} | {c['seconds']:.1f} | continuous batching, {c['steps']} steps |",
    ]
    if h:
        lines.append(f"| HF transformers generate | {h['tok_s']:.1f} | {h['seconds']:.1f} | best batch size "
                     f"{h['batch_size']} (probes: " + ", ".join(f"b{p['batch_size']}={p['tok_s']:.1f}"
                                                             for p in r["hf_probes"]) + ") |")
        lines += ["", f"**cinq / HF = {r['ratio_cinq_over_hf']:.2f}x** (goal >= 5x)"]
    lines += [
        "",
        "| batch-1 decode | value |", "|---|---:|",
        f"| cinq tok/s | {b1['tok_s']:.1f} |",
        f"| weights | {b1['weight_bytes'] / 1e6:.1f} MB |",
        f"| measured read bandwidth | {b1['read_bandwidth_gb_s']:.1f} GB/s |",
        f"| roofline tok/s (bandwidth / weight bytes) | {b1['roofline_tok_s']:.1f} |",
        f"| fraction of roofline | {100 * b1['fraction_of_roofline']:.0f}% |",
        "",
        "| KV memory waste (reserved but unused / reserved, mean over steps) | value |", "|---|---:|",
        f"| cinq paged (block 16) | {100 * c['kv_waste_paged']:.2f}% |",
        f"| naive per-request max_model_len ({c['max_model_len']}) reservation | "
        f"{100 * c['kv_waste_naive_max_len']:.1f}% |",
    ]
    (RESULTS / "throughput.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'throughput.md'}")


if __name__ == "__main__":
    main()
