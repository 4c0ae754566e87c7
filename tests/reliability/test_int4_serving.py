"""End to end through the engine with a bf16 int4 GPTQ model at group size 128, made in the test with cinq's own
quantizer: batched, streamed-through-AsyncLLM and preempted generation all run the int4 linears in bf16, finish
at full length, and every generated token is what a full recompute of the same quantized model predicts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.engine.async_engine import AsyncLLM
from cinq.layers.quantization.linear import GPTQLinear
from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.loader import load_model
from cinq.model.saver import init_random_model, save_model
from cinq.quant.calibration import calibration_windows
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model
from cinq.sampling_params import OutputKind

PROMPTS = ["Question: Anna has 12 apples.", "The cat sat on the mat and", "1 + 2 = 3, 4 + 5 ="]


@pytest.fixture(scope="module")
def int4_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_byte_tokenizer()
    # in / out features multiples of 128 so every decoder linear has whole g128 groups
    cfg = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": tok.get_vocab_size(), "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "tie_word_embeddings": True, "initializer_range": 0.15,
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|end|>")})
    dense = tmp_path_factory.mktemp("dense")
    save_model(init_random_model(cfg, seed=0), dense)
    save_byte_tokenizer(dense)
    text = " ".join(PROMPTS * 40)
    calib = calibration_windows(tok.encode(text, add_special_tokens=False).ids, 8, 64, seed=0)
    out = tmp_path_factory.mktemp("gptq-int4-g128")
    quantize_model(dense, out, QuantConfig("gptq", 4, 128), calib, progress=False)
    return out


def agreement(folder: Path, prompt_ids: list[int], generated: list[int]) -> float:
    """Fraction of generated tokens that are the argmax of one bf16 recompute over prompt + output."""
    model = load_model(folder, dtype="bfloat16")
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        logits = model.compute_logits(model(ids)[0, len(prompt_ids) - 1:-1])
    return (logits.argmax(-1) == torch.tensor(generated)).float().mean().item()


def test_bf16_int4_g128_gptq_through_the_engine(int4_folder):
    llm = LLM(str(int4_folder), dtype="bfloat16", num_kv_blocks=16, block_size=16, max_model_len=256)
    linears = [m for m in llm.model.modules() if isinstance(m, GPTQLinear)]
    assert linears and all(m.bits == 4 and m.group_size == 128 for m in linears)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    # 6 requests x ~5 blocks on 16 blocks: they preempt each other and still finish
    outs = llm.generate(PROMPTS * 2, params)
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(PROMPTS * 2, outs):
        comp = out.outputs[0]
        assert comp.finish_reason == "length" and len(comp.token_ids) == 48
        assert agreement(int4_folder, list(out.prompt_token_ids), list(comp.token_ids)) >= 0.9
    assert llm.engine.kv.num_free_blocks == 16

    async def stream() -> list[int]:
        async_llm = AsyncLLM(llm.engine)
        async_llm.start()
        try:
            tokens: list[int] = []
            async for o in async_llm.generate(PROMPTS[0], params.clone(output_kind=OutputKind.DELTA), "s"):
                tokens += o.outputs[0].token_ids
            return tokens
        finally:
            await async_llm.shutdown_async()

    streamed = asyncio.run(stream())
    assert len(streamed) == 48
    assert agreement(int4_folder, list(outs[0].prompt_token_ids), streamed) >= 0.9
