"""Engine flags shared by every command that runs the engine (generate, chat, serve, eval)."""

from __future__ import annotations

import argparse

from cinq.config import EngineConfig


def add_engine_args(p: argparse.ArgumentParser, model_optional: bool = True) -> None:
    """Add MODEL (positional; default: the embedded model) and the EngineConfig flags."""
    d = EngineConfig()
    p.add_argument("model", nargs="?" if model_optional else None, default=None,
                   help="Hugging Face model folder (config.json + safetensors + tokenizer.json); "
                        "default: the embedded cinq-tiny")
    g = p.add_argument_group("engine")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    g.add_argument("--dtype", default=d.dtype, choices=["bfloat16", "float32", "float16"],
                   help=f"compute dtype (default {d.dtype}; float32 for exact parity)")
    g.add_argument("--device", default=d.device, help="torch device (default %(default)s)")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: from config.json)")
    g.add_argument("--block-size", type=int, default=d.block_size, help="KV cache block size in tokens")
    g.add_argument("--kv-cache-memory", type=float, default=None,
                   help="KV cache size in GiB (default: --kv-cache-memory-fraction of free memory)")
    g.add_argument("--kv-cache-memory-fraction", type=float, default=d.kv_cache_memory_fraction,
                   help="fraction of free memory for the KV cache when --kv-cache-memory is not given")
    g.add_argument("--num-kv-blocks", type=int, default=None, help="exact number of KV blocks (overrides memory)")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="token budget per engine step (decodes + prefill chunks)")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="max running requests per step")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="disable automatic prefix caching")
    g.add_argument("--attention-backend", default=None,
                   help="sdpa | flash-torch | reference | triton (default: triton on CUDA, sdpa on CPU)")
    g.add_argument("--seed", type=int, default=d.seed, help="global sampling seed")
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags; MODEL defaults to the embedded model."""
    model = args.model
    if model is None:
        from cinq.assets import default_model_path
        model = str(default_model_path())
    return EngineConfig(
        model=model, tokenizer=args.tokenizer, dtype=args.dtype, device=args.device,
        max_model_len=args.max_model_len, block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
        kv_cache_memory_fraction=args.kv_cache_memory_fraction, num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=args.enable_prefix_caching, attention_backend=args.attention_backend,
        seed=args.seed, num_threads=args.num_threads)
