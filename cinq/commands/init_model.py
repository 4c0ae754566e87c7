"""`cinq init-model`: write a random-weight Llama-family model folder (tests, benchmarks, smoke runs)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init-model", help="write a random-weight model folder (HF format)",
                       description="Write config.json + model.safetensors + a byte-level tokenizer for a "
                                   "randomly initialised Llama-family model.")
    p.add_argument("out", help="output folder")
    p.add_argument("--arch", default="LlamaForCausalLM",
                   choices=["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--intermediate-size", type=int, default=None, help="default: 8/3 x hidden, rounded to 64")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=None, help="default: = num heads")
    p.add_argument("--vocab-size", type=int, default=None, help="default: the byte tokenizer's size")
    p.add_argument("--max-position-embeddings", type=int, default=2048)
    p.add_argument("--tie-word-embeddings", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer
    from cinq.model.config import ModelConfig
    from cinq.model.loader import parse_dtype
    from cinq.model.saver import init_random_model, save_model

    tok = build_byte_tokenizer()
    vocab = args.vocab_size or tok.get_vocab_size()
    if vocab < tok.get_vocab_size():
        raise ValueError(f"--vocab-size must be >= {tok.get_vocab_size()} (the tokenizer's size), got {vocab}")
    inter = args.intermediate_size or (args.hidden_size * 8 // 3 + 63) // 64 * 64
    config = ModelConfig.from_dict({
        "architectures": [args.arch], "vocab_size": vocab, "hidden_size": args.hidden_size,
        "intermediate_size": inter, "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads, "num_key_value_heads": args.num_kv_heads or args.num_heads,
        "max_position_embeddings": args.max_position_embeddings, "tie_word_embeddings": args.tie_word_embeddings,
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|end|>"),
    })
    dtype = parse_dtype(args.dtype)
    model = init_random_model(config, seed=args.seed, dtype=dtype)
    save_model(model, args.out, dtype)
    save_byte_tokenizer(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {args.arch}, {n / 1e6:.1f}M parameters, {args.dtype}")
    return 0
