import math

import pytest
import torch
import torch.nn.functional as F

from cinq.errors import InvalidParameterError
from cinq.eval.perplexity import perplexity, perplexity_of_text, token_nll
from cinq.model.byte_tokenizer import build_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.saver import init_random_model


def _model(vocab: int = 64, seed: int = 0):
    cfg = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512})
    return init_random_model(cfg, seed=seed, std=0.2)


def _ids(n: int, vocab: int = 64, seed: int = 1) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_uniform_model_has_perplexity_vocab_size():
    model = _model()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    assert perplexity(model, _ids(40), context_len=16) == pytest.approx(64.0, rel=1e-5)


def test_single_window_matches_cross_entropy_by_hand():
    model = _model()
    ids = _ids(30)
    with torch.no_grad():
        logits = model.compute_logits(model(torch.tensor([ids])))[0, :-1]
        expected = math.exp(F.cross_entropy(logits, torch.tensor(ids[1:])).item())
    assert perplexity(model, ids, context_len=64) == pytest.approx(expected, rel=1e-5)


def test_strided_windows_match_a_naive_loop():
    model = _model()
    ids, k = _ids(23), 6
    nll = 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            # Window stride 1: target t is predicted from the window that ends at t (k - 1 tokens of context).
            ctx = ids[max(0, t - k + 1):t + 1]
            logits = model.compute_logits(model(torch.tensor([ctx])))[0, -2]
            nll -= torch.log_softmax(logits, -1)[ids[t]].item()
    total, count = token_nll(model, ids, context_len=k, stride=1, batch_size=3)
    assert count == len(ids) - 1
    assert total == pytest.approx(nll, rel=1e-5)


def test_non_overlapping_windows_score_each_token_once_and_batching_does_not_matter():
    model = _model()
    ids = _ids(50)
    total1, count1 = token_nll(model, ids, context_len=8, stride=8, batch_size=1)
    total8, count8 = token_nll(model, ids, context_len=8, batch_size=8)
    assert count1 == count8 == 49
    assert total1 == pytest.approx(total8, rel=1e-5)
    # Shorter context can only be measured, not assumed better or worse; but it must differ from full context.
    full, _ = token_nll(model, ids, context_len=64)
    assert full != pytest.approx(total1, rel=1e-6)


def test_perplexity_of_text_uses_the_tokenizer_and_restores_training_mode():
    tok = build_byte_tokenizer()
    model = _model(vocab=tok.get_vocab_size())
    model.train()
    text = "hello world, hello cinq"
    ids = tok.encode(text).ids
    assert perplexity_of_text(model, tok, text, context_len=8) == pytest.approx(perplexity(model, ids, 8))
    assert model.training


def test_bad_arguments_raise():
    model = _model()
    with pytest.raises(InvalidParameterError, match="token_ids"):
        perplexity(model, [1])
    with pytest.raises(InvalidParameterError, match="stride"):
        perplexity(model, _ids(10), context_len=4, stride=5)
    with pytest.raises(InvalidParameterError, match="context_len"):
        perplexity(model, _ids(10), context_len=1)
