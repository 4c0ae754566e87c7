"""Gemma 3 270M (Q4_K_M GGUF, `gemma3-270m`): batch-1 decode in cinq vs llama.cpp (llama-cpp-python) on the same
file vs HF transformers (the file dequantized to a bf16 folder), in one run; and the KV memory of one request at
4k and 16k tokens with and without freeing the blocks that fell out of the sliding window.

Latency is `cinq bench latency gemma3-270m --variants file --baselines hf,llama.cpp` (cinq/bench/latency.py: the
same timer, prompts of random ids, median decode step per generation, rounds rotated). KV memory: cinq's block
table is shared by all layers, so for Gemma 3 (3 global layers of 18) no block can be freed; the table gives the
bytes held with one table shared by all layers (what cinq does for single-type models), with KV cache groups
(cinq/engine/kv_cache_groups.py, vLLM's hybrid allocator: what cinq does for Gemma 3: blocks counted on
HybridKVCacheManager driven through a 4k / 16k decode, no model) and, measured the same way on
KVCacheManager vs SlidingWindowKVCacheManager, what freeing saves when every layer is windowed.

    python benchmarks/gemma3.py            # writes benchmarks/results/gemma3.{md,json}
    python benchmarks/gemma3.py --quick    # prompt 128, 1 round, 8 tokens; not written
    python benchmarks/gemma3.py --render   # rewrite gemma3.md from gemma3.json, measuring nothing
    python benchmarks/gemma3.py --kv-only  # re-measure the KV table only (kept latency from gemma3.json)
"""

from __future__ import annotations

import argparse
import os
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()  # before torch loads OpenMP: see cinq/process_env.py

from cinq.bench.latency import LatencyOptions, run_latency  # noqa: E402
from cinq.bench.report import markdown, run_conditions  # noqa: E402
from cinq.cache import cache_dir  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402
from cinq.engine.kv_cache import KVCacheManager  # noqa: E402
from cinq.engine.kv_cache_groups import HybridKVCacheManager  # noqa: E402
from cinq.engine.sliding_window import SlidingWindowKVCacheManager, kv_memory_per_context  # noqa: E402
from cinq.model.config import ModelConfig  # noqa: E402
from cinq.sampling_params import SamplingParams  # noqa: E402
from cinq.step.request import Request  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BLOCK = 16
MIB = 2 ** 20


def blocks_held(kv: KVCacheManager, prompt: int, context: int) -> int:
    """Blocks one request holds at the end of a decode from ``prompt`` to ``context`` tokens (prefill in one
    step, then one token a step), driven through the manager as the scheduler drives it."""
    req = Request("r", list(range(prompt)), SamplingParams(max_tokens=context), context, 0.0)
    assert kv.allocate_slots(req, prompt)
    req.num_computed_tokens = prompt
    while req.num_tokens < context:
        req.append_output_token(1)
        assert kv.allocate_slots(req, 1)
        req.num_computed_tokens += 1
    if isinstance(kv, HybridKVCacheManager):  # the full group's blocks (the sliding one: group_blocks_held)
        return kv.full.num_blocks - kv.full.num_free_blocks
    return kv.num_blocks - kv.num_free_blocks


def group_blocks_held(kv: HybridKVCacheManager, prompt: int, context: int) -> tuple[int, int]:
    """(full, sliding) blocks one request holds at ``context`` tokens (the null block is not the request's)."""
    full = blocks_held(kv, prompt, context)
    return full, kv.sliding.num_blocks - kv.sliding.num_free_blocks - 1


def kv_rows(cfg: ModelConfig) -> list[dict]:
    windows = [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]
    per_block = 2 * cfg.num_hidden_layers * BLOCK * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16, all layers
    rows = []
    for context in (4096, 16384):
        mem = kv_memory_per_context(context, windows, cfg.num_key_value_heads, cfg.head_dim, 2, BLOCK)
        n = context // BLOCK + 2
        plain = blocks_held(KVCacheManager(n, BLOCK, enable_caching=False), 512, context)
        local = SlidingWindowKVCacheManager(n + 1, BLOCK, cfg.sliding_window, enable_caching=False)
        freed = blocks_held(local, 512, context) - 1  # the null block is not the request's
        n_full = sum(1 for w in windows if w is None)
        full, sliding = group_blocks_held(HybridKVCacheManager(n, n + 1, BLOCK, cfg.sliding_window), 512, context)
        layer_block = per_block // cfg.num_hidden_layers
        groups = full * n_full * layer_block + sliding * (len(windows) - n_full) * layer_block
        rows.append({"context": context, "gemma3_shared_table_mib": plain * per_block / MIB,
                     "gemma3_per_group_tables_arithmetic_mib": mem.per_group_tables / MIB,
                     "gemma3_groups_full_blocks": full, "gemma3_groups_sliding_blocks": sliding,
                     "gemma3_per_group_tables_mib": groups / MIB, "gemma3_ratio": plain * per_block / groups,
                     "all_local_blocks_kept": plain, "all_local_blocks_freeing": freed,
                     "all_local_mib_kept": plain * per_block / MIB, "all_local_mib_freeing": freed * per_block / MIB,
                     "all_local_ratio": plain / freed})
    return rows


def weight_bytes(path: Path) -> dict:
    """Bytes of weights one decode step streams (every linear + the LM head): llama.cpp reads the file's blocks;
    cinq reads the blocks of the types it serves natively and bf16 for what it dequantizes at load."""
    from math import prod

    from cinq.layers.quantization.gguf_blocks import SERVED_BYTES
    from cinq.model.gguf.file import read_gguf
    from cinq.model.gguf.names import hf_tensor_name
    from cinq.model.gguf.plan import GGUFFormat
    gguf = read_gguf(path)
    cfg = ModelConfig.from_pretrained(path)
    fmt = GGUFFormat.of(gguf, cfg.num_hidden_layers, tied="output.weight" not in gguf.tensors)
    file_bytes = cinq_bytes = 0
    for info in gguf.tensors.values():
        head = info.name in ("output.weight", "token_embd.weight") and (info.name == "output.weight" or
                                                                       "output.weight" not in gguf.tensors)
        if not (head or (info.name.startswith("blk.") and len(info.shape) == 2)):
            continue
        module = "lm_head" if head else hf_tensor_name(info.name, gguf.architecture).rsplit(".", 1)[0]
        file_bytes += info.nbytes
        served = fmt.native.get(module)  # what its kernel reads (Q5_0 rewritten as Q8_0), else bf16 values
        cinq_bytes += prod(info.shape) // 32 * SERVED_BYTES[served] if served else prod(info.shape) * 2
    return {"llama_cpp_mb": file_bytes / 1e6, "cinq_mb": cinq_bytes / 1e6}


def kv_markdown(rows: list[dict], cfg: ModelConfig) -> str:
    g = sum(1 for t in cfg.layer_types if t == "full_attention")
    lines = [f"## KV memory of one request (bf16, block {BLOCK}, window {cfg.sliding_window}; "
             f"{cfg.num_hidden_layers} layers: {g} global, {cfg.num_hidden_layers - g} local)", "",
             "| context | Gemma 3, one shared table (nothing freed) | Gemma 3, KV cache groups (cinq, measured: "
             "full + sliding blocks) | saved | all layers local: kept (measured blocks) | all local: freeing "
             "(measured blocks) | saved |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['gemma3_shared_table_mib']:.1f} MiB | "
                     f"{r['gemma3_per_group_tables_mib']:.1f} MiB ({r['gemma3_groups_full_blocks']} + "
                     f"{r['gemma3_groups_sliding_blocks']}) | {r['gemma3_ratio']:.1f}x | "
                     f"{r['all_local_mib_kept']:.1f} MiB "
                     f"({r['all_local_blocks_kept']}) | {r['all_local_mib_freeing']:.1f} MiB "
                     f"({r['all_local_blocks_freeing']}) | {r['all_local_ratio']:.1f}x |")
    lines += ["", "Blocks are counted on cinq's managers driven through a decode from a 512-token prompt (no model): "
              "HybridKVCacheManager for Gemma 3 (a full-attention group of the global layers, every position kept; "
              "a sliding group of the local layers, blocks wholly out of the window returned to its pool), "
              "KVCacheManager for the shared table. Per-layer-group arithmetic (window + one partial block per "
              "local layer): " + ", ".join(f"{r['gemma3_per_group_tables_arithmetic_mib']:.1f} MiB at {r['context']}"
                                           for r in rows if 'gemma3_per_group_tables_arithmetic_mib' in r) +
              ". The all-local columns are the same shape with every layer windowed (a hypothetical model)."]
    return "\n".join(lines) + "\n"


def report(result, rows: list[dict], weights: dict, cfg: ModelConfig, conditions: str) -> str:
    why = ("Every engine here runs in one process under cinq's OpenMP wait policy (PASSIVE), which slows "
           "llama.cpp's 2-thread decode; `benchmarks/omp_wait_policy.py --model gemma3-270m --variants file` runs "
           "each engine in its own process under every policy (omp_wait_policy_gemma3.md), the fair pair.\n\n"
           f"What each engine streams on this file: cinq serves Q8_0 / Q4_0 / Q4_1 / Q4_K blocks natively (Q4_K as "
           f"int4 codes with a float32 scale and offset per 32 values: d x its 6-bit scale is not an fp16) and Q5_0 "
           f"as Q8_0 blocks of the same values, and dequantizes every other type at load: of this Q4_K_M file the "
           f"Q6_K matrices (half the MLP downs) run as bf16. A decode step streams {weights['cinq_mb']:.0f} MB of "
           f"weights in cinq vs {weights['llama_cpp_mb']:.0f} MB in llama.cpp "
           f"({weights['cinq_mb'] / weights['llama_cpp_mb']:.2f}x); both multiply Q8-rounded activations with "
           f"integer dot products on the blocks.\n")
    return ("# Gemma 3 270M (Q4_K_M GGUF): batch-1 decode vs llama.cpp and HF; KV memory\n\n"
            + conditions + " Load averages per row in the table.\n\n" + markdown(result) + "\n" + why + "\n" + kv_markdown(rows, cfg))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-lens", default="128,1024")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--render", action="store_true", help="rewrite gemma3.md from gemma3.json, measuring nothing")
    ap.add_argument("--kv-only", action="store_true",
                    help="re-measure the KV memory table only; latency and weight bytes kept from gemma3.json")
    args = ap.parse_args()
    from cinq.assets import resolve_model_path
    path = Path(resolve_model_path("gemma3-270m", "model"))
    cfg = ModelConfig.from_pretrained(path)
    if args.render or args.kv_only:
        from cinq.bench.latency_report import latency_result
        data = json.loads((RESULTS / "gemma3.json").read_text())
        if args.kv_only:
            data["kv_memory"] = kv_rows(cfg)
            (RESULTS / "gemma3.json").write_text(json.dumps(data, indent=1))
        (RESULTS / "gemma3.md").write_text(report(latency_result(data["latency"]), data["kv_memory"],
                                                  data["weight_bytes"], cfg, data["conditions"]))
        return 0
    if args.quick:
        args.prompt_lens, args.rounds, args.new_tokens = "128", 1, 8
    prompt_lens = tuple(int(x) for x in args.prompt_lens.split(","))
    options = LatencyOptions(input_lens=prompt_lens, output_len=args.new_tokens, num_iters=1, seed=1,
                             baselines=("hf", "llama.cpp"), variants=("file",),
                             threads_list=tuple(int(x) for x in args.threads.split(",")), rounds=args.rounds,
                             work_dir=cache_dir() / "bench-latency")
    max_len = max(prompt_lens) + args.new_tokens + 16
    config = EngineConfig(model="gemma3-270m", dtype="bfloat16", kv_cache_memory=0.25, max_model_len=max_len,
                          max_num_batched_tokens=max_len, enable_prefix_caching=False, seed=0)
    draft, conditions = run_conditions(os.getloadavg()[0])
    result = run_latency(config, options)
    rows, weights = kv_rows(cfg), weight_bytes(path)
    text = report(result, rows, weights, cfg, conditions)
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "gemma3.json").write_text(json.dumps({"draft": draft, "conditions": conditions, "latency": result.data, "kv_memory": rows,
                                                          "weight_bytes": weights}, indent=1))
        (RESULTS / "gemma3.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
