import json

import pytest

from cinq.eval.perplexity import perplexity
from cinq.model.loader import load_model
from cinq.train.data import TokenSplit
from cinq.train.distill_report import write_report
from cinq.train.evaluate import arithmetic_eval, kl_to_teacher, language_perplexities
from cinq.train.model_card import ship_run


def test_language_perplexities_cover_each_language_and_pool(teacher, tiny_corpus):
    model = load_model(teacher, dtype="float32")
    ppl = language_perplexities(model, tiny_corpus, "test", context_len=64)
    test = TokenSplit.load(tiny_corpus, "test")
    assert set(ppl) == set(test.languages()) | {"all"}
    en = perplexity(model, test.stream(lang="en"), context_len=64)
    assert ppl["en"] == pytest.approx(en, rel=0.02)  # bf16 autocast vs float32
    assert min(v for k, v in ppl.items() if k != "all") <= ppl["all"] <= max(ppl.values())
    assert kl_to_teacher(model, model, tiny_corpus, seq_len=32, max_windows=4) == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("generator", ["engine", "naive"])
def test_arithmetic_eval_scores_greedy_completions(teacher, generator):
    from cinq.tasks import arithmetic_problems
    model = load_model(teacher, dtype="float32")
    out = arithmetic_eval(teacher, n=4, generator=generator, model=model)
    assert out["problems"] == 4 and out["samples"][0]["prompt"] == arithmetic_problems(4, 0, "test")[0].prompt()
    assert out["accuracy"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert out["steps"] == sum(len(p.steps) for p in arithmetic_problems(4, 0, "test"))
    assert 0.0 <= out["step_accuracy"] <= 1.0 and out["step_accuracy"] * out["steps"] == round(
        out["step_accuracy"] * out["steps"])
    assert len(out["samples"]) == 3 and all(isinstance(x["completion"], str) for x in out["samples"])


def test_ship_run_writes_a_complete_card(teacher, tiny_corpus, tmp_path, few_arithmetic_problems):
    dest = tmp_path / "shipped"
    result = ship_run(teacher.parent, dest, tiny_corpus, "micro-teacher", "A test model.",
                      ["cinq data build --out X", "cinq train ..."], n_arith=4)
    card = (dest / "README.md").read_text()
    assert "cinq train ..." in card and "tokens seen" in card and "| en |" in card
    assert {"model.safetensors", "tokenizer.json", "training.json", "data_manifest.json", "eval.json"} <= {
        p.name for p in dest.iterdir()}
    training = json.loads((dest / "training.json").read_text())
    assert training["tokens_seen"] == 120 * 8 * 32 and training["elapsed_s"] > 0
    paths = write_report({"a": {**result, "tokens_seen": 1, "train_seconds": 2.0}}, tmp_path / "r", "T")
    md = paths[0].read_text()
    assert md.startswith("# T") and "| a |" in md and "ppl en" in md
