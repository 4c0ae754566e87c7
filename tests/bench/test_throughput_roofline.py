from cinq.bench.throughput_roofline import decoder_linear_params, workload_flops
from cinq.bench.workload import BenchRequest
from cinq.model.config import ModelConfig


def _cfg() -> ModelConfig:
    # hidden 8, 4 query heads and 2 kv heads of 2, intermediate 12, 3 layers, vocab 50
    return ModelConfig("LlamaForCausalLM", 50, 8, 12, 3, 4, 2, 2, 64)


def test_decoder_linear_params_count_qkv_o_and_the_gated_mlp():
    # qkv 8 x (8 + 2 * 4) + o 8 x 8 + gate/up/down 3 x 8 x 12 = 128 + 64 + 288 per layer
    assert decoder_linear_params(_cfg()) == 3 * 480


def test_workload_flops_count_fed_tokens_sampled_tokens_and_causal_pairs():
    reqs = [BenchRequest([1, 2, 3], 2), BenchRequest([4], 1)]
    f = workload_flops(_cfg(), reqs)
    # fed: 3 + 2 - 1 = 4 and 1 + 1 - 1 = 1 tokens; sampled: 3; pairs: 4 * 5 / 2 + 1 = 11
    assert f.decoder_linears == 2 * 1440 * 5
    assert f.lm_head == 2 * 8 * 50 * 3
    assert f.attention == 4 * 4 * 2 * 3 * 11
    assert f.total == f.decoder_linears + f.lm_head + f.attention
