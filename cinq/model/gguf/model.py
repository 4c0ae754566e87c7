"""Loading a model from a GGUF file: its ``ModelConfig``, its tokenizer and its weights, through the same
``ModelConfig`` / ``Tokenizer`` / ``LlamaForCausalLM`` every Hugging Face folder gets (cinq/model/loader.py,
``ModelConfig.from_pretrained`` and ``Tokenizer.from_pretrained`` come here for a .gguf path).

End-of-generation tokens: the file's ``eos_token_id`` plus, as llama.cpp does, the control tokens that end a turn
in the chat formats it knows (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>`` ...), so a chat reply stops at its
template's end marker whichever id the file calls eos.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cinq.distributed.parallel_state import TPShard
from cinq.model.gguf.config import gguf_config_dict
from cinq.model.gguf.file import GGUF_QUANT_METHOD, GGUFFile, read_gguf
from cinq.model.gguf.tokenizer import CONTROL, gguf_tokenizer
from cinq.model.gguf.weights import GGUFFormat, iter_gguf_checkpoint

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "</s>")


def gguf_model_config(path: str | Path):  # -> ModelConfig (imported late: config.py dispatches here)
    """The ``ModelConfig`` of a GGUF file. Its ``quantization_config`` says it is GGUF (``quant_method: gguf``) and
    carries the load line's summary; with the LM head served from a quantized tied embedding the config is untied
    (the head is then its own quantized linear over the same blocks)."""
    from cinq.model.config import ModelConfig
    gguf = read_gguf(path)
    cfg = gguf_config_dict(gguf)
    config = ModelConfig.from_dict(cfg, source=str(path))
    fmt = GGUFFormat.of(gguf, config.num_hidden_layers, config.tie_word_embeddings)
    if fmt.head_from_embedding:
        config.tie_word_embeddings = False
    config.quantization_config = {"quant_method": GGUF_QUANT_METHOD, "summary": fmt.summary()}
    config.eos_token_ids = list(dict.fromkeys(config.eos_token_ids + end_of_turn_ids(gguf)))
    return config


def end_of_turn_ids(gguf: GGUFFile) -> list[int]:
    """Control tokens of the vocabulary whose text ends a turn in a known chat format."""
    tokens = gguf.get("tokenizer.ggml.tokens") or []
    types = gguf.get("tokenizer.ggml.token_type")
    if types is None or len(types) != len(tokens):
        return []
    return [i for i, (t, k) in enumerate(zip(tokens, types)) if int(k) == CONTROL and t in END_OF_TURN]


def gguf_format(path: str | Path) -> GGUFFormat:
    """The linear factory of the file (which projections are served from their own blocks)."""
    gguf = read_gguf(path)
    cfg = gguf_config_dict(gguf)
    return GGUFFormat.of(gguf, cfg["num_hidden_layers"], cfg["tie_word_embeddings"])


def load_gguf_model(path: str | Path, dtype: torch.dtype, device: str | torch.device, attention_backend: str,
                    shard: TPShard | None = None):
    """The model of a GGUF file, ready to run (``load_model`` calls this for a .gguf path)."""
    from cinq.model.loader import build_empty_model, finish_loading, load_tensors
    path = Path(path)
    config = gguf_model_config(path)
    fmt = gguf_format(path)
    model = build_empty_model(config, dtype, device, attention_backend, path, shard, quant=fmt)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    load_tensors(model, iter_gguf_checkpoint(fmt.gguf, fmt, heads))
    finish_loading(model)
    return model.eval()


def gguf_hf_tokenizer(path: str | Path, vocab_size: int):
    """(`tokenizers` Tokenizer, tokenizer_config fields) of a GGUF file."""
    return gguf_tokenizer(read_gguf(path), vocab_size)
