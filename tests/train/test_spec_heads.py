"""Training speculative heads on the target's own sequences: the loss goes down for every method, a resumed run
follows the uninterrupted one, other settings are refused on resume, generated sets are cached by their
settings (the prompt mix included: balanced per language or the corpus's natural proportions), a quantized
target's run learns from that target's own sequences and features (not its dense source's, even when they share
a generated-set folder), and `cinq distill --heads ...` runs end to end (engine generation, export with a model
card), for a quantized target too."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest
import torch

from cinq.cli import main
from cinq.errors import InvalidParameterError
from cinq.layers.quantization.linear import QuantizedLinear
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model
from cinq.spec.eagle import load_eagle_head
from cinq.spec.medusa import load_medusa_heads
from cinq.train import spec_head_data
from cinq.train.data import TokenSplit
from cinq.train.distill import load_teacher
from cinq.train.seqkd import balanced_prompts, corpus_prompts, mixed_prompts, natural_prompts
from cinq.train.spec_head_data import GenerationSettings, target_sequences
from cinq.train.spec_heads import HeadJob, HeadTrainer


@pytest.fixture(scope="module")
def int4_teacher(teacher, tmp_path_factory):
    """The micro teacher quantized (int4 RTN, groups of 32: its embedding stays the dense one)."""
    out = tmp_path_factory.mktemp("int4-teacher")
    quantize_model(teacher, out, QuantConfig("rtn", 4, 32), None, progress=False)
    return out


def greedy_agreement(model, seqs) -> float:
    """Share of generated tokens that are ``model``'s argmax after their prefix (1.0: its greedy output)."""
    same = total = 0
    with torch.no_grad():
        for i in range(len(seqs)):
            seq = torch.as_tensor(seqs.sequence(i).astype("int64"))[None]
            start = int(seqs.prompt_lens[i])
            guess = model.compute_logits(model(seq[:, :-1]))[0, start - 1:].argmax(-1)
            same += int((guess == seq[0, start:]).sum())
            total += seq.shape[1] - start
    return same / total


def job(teacher, corpus, out, method="eagle", **kw) -> HeadJob:
    base = dict(method=method, target=str(teacher), data_dir=str(corpus), out_dir=str(out), token_budget=4 * 28 * 8,
                batch_size=4, lr=1e-2, warmup_steps=2, train_prompts=12, eval_prompts=6, max_prompt=12,
                max_tokens=16, eval_max_tokens=8, generator="naive", num_heads=2, eval_every=0, progress=False)
    return HeadJob(**{**base, **kw})


def train_and_check_the_loss_drops(trainer: HeadTrainer) -> tuple[dict, dict]:
    """Run ``trainer`` to the end; its loss on the first batch must fall below 0.8x. Returns (summary, the
    first batch's metrics before training)."""
    batch = trainer.sampler.batch(0)
    with torch.no_grad():
        before, metrics = trainer.loss(batch, 0)
    summary = trainer.run()
    with torch.no_grad():
        after, _ = trainer.loss(batch, 0)
    assert summary["finished"] and float(after) < 0.8 * float(before), (float(before), float(after))
    return summary, metrics


def test_balanced_prompts_draw_the_same_number_per_language(tiny_corpus) -> None:
    pairs = balanced_prompts(tiny_corpus, 12, seed=0, max_prompt=8)
    counts = Counter(lang for lang, _ in pairs)
    assert len(counts) > 2 and len(set(counts.values())) == 1
    assert all(2 <= len(p) <= 8 for _, p in pairs)
    assert balanced_prompts(tiny_corpus, 12, seed=0, max_prompt=8) == pairs


def test_the_natural_mix_follows_the_corpus_with_as_many_prompts(tiny_corpus) -> None:
    balanced = mixed_prompts(tiny_corpus, 12, seed=0, max_prompt=8)
    natural = mixed_prompts(tiny_corpus, 12, seed=0, max_prompt=8, mix="natural")
    assert balanced == balanced_prompts(tiny_corpus, 12, seed=0, max_prompt=8)  # the default is today's draw
    assert len(natural) == len(balanced) and Counter(l for l, _ in natural) != Counter(l for l, _ in balanced)
    assert natural == natural_prompts(tiny_corpus, len(balanced), seed=0, max_prompt=8)
    assert corpus_prompts(tiny_corpus, len(natural), seed=0, max_prompt=8) == [p for _, p in natural]  # one draw
    with pytest.raises(InvalidParameterError):
        mixed_prompts(tiny_corpus, 12, seed=0, mix="uniform")


def test_the_english_mix_draws_as_many_prompts_from_english_documents(tiny_corpus) -> None:
    balanced = mixed_prompts(tiny_corpus, 12, seed=0, max_prompt=8)
    english = mixed_prompts(tiny_corpus, 12, seed=0, max_prompt=8, mix="english")
    english_docs = Counter(TokenSplit.load(tiny_corpus, "train").langs)["en"]
    assert {lang for lang, _ in english} == {"en"} and len(english) == min(len(balanced), english_docs)
    assert english == mixed_prompts(tiny_corpus, 12, seed=0, max_prompt=8, mix="english")


def test_chat_data_refuses_the_natural_mix_by_name(teacher, tmp_path) -> None:
    with pytest.raises(InvalidParameterError) as e:
        job(teacher, "chat", tmp_path, prompt_mix="natural")
    assert e.value.param == "prompt_mix" and "english" in str(e.value)
    assert job(teacher, "chat", tmp_path, prompt_mix="english").prompt_mix == "english"


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa"])
def test_a_few_steps_lower_the_loss(teacher, tiny_corpus, tmp_path, method: str) -> None:
    trainer = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "run", method, token_budget=30 * 4 * 28))
    summary, metrics = train_and_check_the_loss_drops(trainer)
    assert set(summary["acceptance"]["all"]) >= {"tau", "accept_rate", "steps"}
    assert summary["acceptance"]["all"]["tau"] >= 1.0 and (tmp_path / "run" / "head" / "config.json").is_file()
    assert any(k.startswith("kl") for k in metrics)


def test_resume_follows_the_uninterrupted_run(teacher, tiny_corpus, tmp_path) -> None:
    shared = dict(generated_dir=str(tmp_path / "gen"), method="eagle3", token_budget=5 * 4 * 28)
    straight = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "a", **shared)).run()
    first = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "b", max_run_s=0.0, **shared)).run()
    assert not first["finished"] and first["step"] == 1
    resumed = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "b", **shared)).run()
    assert resumed["finished"] and resumed["step"] == straight["step"] == 5
    target = load_model(teacher, torch.float32)
    a = load_eagle_head(tmp_path / "a" / "head", target, torch.float32, "cpu", "sdpa").state_dict()
    b = load_eagle_head(tmp_path / "b" / "head", target, torch.float32, "cpu", "sdpa").state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-2) for k in a)  # stored in bf16
    assert resumed["acceptance"] == straight["acceptance"]


@pytest.mark.parametrize("change", [{"lr": 5e-3}, {"prompt_mix": "natural"}])
def test_other_settings_are_refused_on_resume(teacher, tiny_corpus, tmp_path, change: dict) -> None:
    HeadTrainer(job(teacher, tiny_corpus, tmp_path, max_run_s=0.0)).run()
    with pytest.raises(InvalidParameterError) as e:
        HeadTrainer(job(teacher, tiny_corpus, tmp_path, **change))
    assert e.value.param == next(iter(change))


def test_a_run_recorded_before_the_prompt_mix_was_balanced(teacher, tiny_corpus, tmp_path) -> None:
    HeadTrainer(job(teacher, tiny_corpus, tmp_path, max_run_s=0.0)).run()
    record = tmp_path / "head_job.json"
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "prompt_mix"}))
    HeadTrainer(job(teacher, tiny_corpus, tmp_path))  # resumes
    with pytest.raises(InvalidParameterError) as e:
        HeadTrainer(job(teacher, tiny_corpus, tmp_path, prompt_mix="natural"))
    assert e.value.param == "prompt_mix"


def test_generated_sets_are_cached_by_their_settings(teacher, tiny_corpus, tmp_path, monkeypatch) -> None:
    target = load_model(teacher, torch.float32)
    settings = GenerationSettings("train", 6, 8, 6, 0.0, 0, "naive")
    first = target_sequences(teacher, target, tiny_corpus, settings, tmp_path, "fp", [6])
    assert len(first) == len(set(first.langs.tolist())) > 2  # one prompt per language
    assert all(len(first.sequence(i)) > first.prompt_lens[i] for i in range(len(first)))

    def no_generation(*a, **kw):
        raise AssertionError("regenerated a cached set")
    monkeypatch.setattr(spec_head_data, "generate_naive", no_generation)
    again = target_sequences(teacher, target, tiny_corpus, settings, tmp_path, "fp", [6])
    assert again.tokens.tolist() == first.tokens.tolist() and again.langs.tolist() == first.langs.tolist()
    monkeypatch.undo()
    hotter = GenerationSettings("train", 6, 8, 6, 1.0, 0, "naive")
    target_sequences(teacher, target, tiny_corpus, hotter, tmp_path, "fp", [6])
    assert len(list(tmp_path.glob("target-train-*.npz"))) == 2


def test_the_prompt_mix_is_part_of_the_cache_key(teacher, tiny_corpus, tmp_path) -> None:
    balanced = GenerationSettings("train", 12, 8, 4, 0.0, 0, "naive")
    natural = GenerationSettings("train", 12, 8, 4, 0.0, 0, "naive", prompt_mix="natural")
    corpus = spec_head_data.corpus_identity(tiny_corpus)
    assert natural.key("fp", corpus) != balanced.key("fp", corpus)
    # the balanced key is the one from before the option existed: caches made then still match
    before = {k: v for k, v in asdict(balanced).items() if k != "prompt_mix"}
    blob = json.dumps({"settings": before, "target": "fp", "corpus": corpus}, sort_keys=True)
    assert balanced.key("fp", corpus) == hashlib.sha256(blob.encode()).hexdigest()[:16]
    target = load_model(teacher, torch.float32)
    a = target_sequences(teacher, target, tiny_corpus, balanced, tmp_path, "fp", [6])
    b = target_sequences(teacher, target, tiny_corpus, natural, tmp_path, "fp", [6])
    assert len(a) == len(b) and Counter(a.langs.tolist()) != Counter(b.langs.tolist())
    assert len(list(tmp_path.glob("target-train-*.npz"))) == 2 and b.info["settings"]["prompt_mix"] == "natural"


def test_a_quantized_target_trains_on_its_own_sequences_and_features(teacher, int4_teacher, tiny_corpus,
                                                                     tmp_path) -> None:
    shared = dict(generated_dir=str(tmp_path / "gen"), sample_temperature=0.0, max_run_s=0.0)
    dense = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "dense", **shared))
    quant = HeadTrainer(job(int4_teacher, tiny_corpus, tmp_path / "int4", **shared))
    # the quantized copy keeps the dense embedding: the same head fingerprint, yet its own cached sets
    assert quant.fingerprint.fingerprint == dense.fingerprint.fingerprint
    assert len(list((tmp_path / "gen").glob("target-train-*.npz"))) == 2
    assert quant.train_seqs.info["target"] != dense.train_seqs.info["target"]
    # the data is the int4 target's greedy writing, not its dense source's
    assert greedy_agreement(quant.target, quant.train_seqs) == 1.0
    assert greedy_agreement(dense.target, quant.train_seqs) < 1.0
    # the features the head learns from are the quantized forward's
    assert any(isinstance(m, QuantizedLinear) for m in quant.target.modules())
    tokens, _ = quant.sampler.batch(0)
    with torch.no_grad():
        fq, fd = quant.target.forward_with_hidden_states(tokens)[0], dense.target.forward_with_hidden_states(tokens)[0]
    assert not torch.allclose(fq, fd, atol=1e-3)
    assert quant.run()["step"] == 1  # and it trains


@pytest.mark.parametrize("method,extra", [("eagle", []), ("eagle3", []), ("medusa", []),
                                          ("medusa", ["--medusa-lm-head", "target"])])
def test_cli_trains_exports_and_resumes(teacher, tiny_corpus, tmp_path, monkeypatch, method: str,
                                        extra: list[str]) -> None:
    monkeypatch.setattr("sys.argv", ["cinq"])
    out, dest = tmp_path / "run", tmp_path / f"shipped-{method}"
    argv = ["distill", "--heads", method, "--target", str(teacher), "--data", str(tiny_corpus), "--out", str(out),
            "--tokens", str(4 * 4 * 24), "--batch-size", "4", "--warmup", "1", "--train-prompts", "8",
            "--eval-prompts", "4", "--max-prompt", "8", "--max-tokens", "16", "--eval-max-tokens", "8",
            "--num-heads", "2", "--no-progress", "--export", str(dest), *extra]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["step"] == 4
    card = (dest / "README.md").read_text()
    assert "Held-out acceptance" in card and "| **all** |" in card and method in card
    target = load_model(teacher, torch.float32)
    if method == "medusa":
        heads = load_medusa_heads(dest, target, torch.float32, "cpu")
        assert heads.num_heads == 2 and heads.original_lm_head == bool(extra)
        assert ("drafting through the target's own LM head" in card) == bool(extra)
    else:
        assert load_eagle_head(dest, target, torch.float32, "cpu", "sdpa").method == method
    assert main(argv) == 0  # the same command again: resumes a finished run, trains nothing more
    assert json.loads((out / "summary.json").read_text())["step"] == 4


def test_cli_trains_a_head_for_a_quantized_target(int4_teacher, tiny_corpus, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["cinq"])
    out, dest = tmp_path / "run", tmp_path / "shipped"
    assert main(["distill", "--heads", "eagle", "--target", str(int4_teacher), "--data", str(tiny_corpus), "--out",
                 str(out), "--tokens", str(2 * 4 * 24), "--batch-size", "4", "--warmup", "1", "--train-prompts", "8",
                 "--eval-prompts", "4", "--max-prompt", "8", "--max-tokens", "16", "--eval-max-tokens", "8",
                 "--sample-temperature", "0", "--no-progress", "--export", str(dest)]) == 0
    head = load_eagle_head(dest, load_model(int4_teacher, torch.float32), torch.float32, "cpu", "sdpa")
    assert head.method == "eagle" and head.spec.target.name == int4_teacher.name


def test_cli_heads_need_a_target(tiny_corpus, tmp_path) -> None:
    assert main(["distill", "--heads", "eagle", "--data", str(tiny_corpus), "--out", str(tmp_path)]) == 2
    assert main(["distill", "--data", str(tiny_corpus), "--out", str(tmp_path)]) == 2


def test_an_eagle3_head_with_a_reduced_draft_vocabulary_trains_in_vllms_layout(teacher, tiny_corpus,
                                                                               tmp_path) -> None:
    from cinq.spec.eagle3 import Eagle3Head
    trainer = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "run", "eagle3", draft_vocab_size=64,
                              token_budget=30 * 4 * 28))
    # the 64 tokens the target wrote most in its training sequences
    written = np.concatenate([trainer.train_seqs.sequence(i)[int(trainer.train_seqs.prompt_lens[i]):]
                              for i in range(len(trainer.train_seqs))])
    top = np.bincount(written.astype(np.int64)).argmax()
    assert trainer.draft_ids.numel() == 64 and int(top) in trainer.draft_ids.tolist()
    summary, _ = train_and_check_the_loss_drops(trainer)
    assert 0 < summary["draft_vocab"]["coverage_held_out"] <= 1
    head = load_eagle_head(tmp_path / "run" / "head", load_teacher(teacher), torch.float32, "cpu", "sdpa")
    assert isinstance(head, Eagle3Head) and torch.equal(head.draft_ids, trainer.draft_ids)


def test_the_draft_vocabularys_label_logits_are_the_full_logits_columns(teacher, tiny_corpus, tmp_path) -> None:
    # the labels come from the LM head's draft rows alone: the same numbers as slicing the full logits
    trainer = HeadTrainer(job(teacher, tiny_corpus, tmp_path / "run", "eagle3", draft_vocab_size=64))
    assert trainer.draft_rows is not None and trainer.draft_rows.shape[0] == 64
    final = torch.randn(2, 5, trainer.draft_rows.shape[1])
    full = trainer.target.compute_logits(final)[..., trainer.draft_ids]
    torch.testing.assert_close(torch.nn.functional.linear(final, trainer.draft_rows).float(), full)


def test_a_draft_vocabulary_needs_an_eagle3_head(teacher, tiny_corpus, tmp_path) -> None:
    with pytest.raises(InvalidParameterError) as e:
        job(teacher, tiny_corpus, tmp_path, "eagle", draft_vocab_size=64)
    assert e.value.param == "draft_vocab_size"


@pytest.mark.parametrize("change", [{"max_prompt": 1}, {"draft_k": 0}, {"eval_prompts": 0}, {"num_heads": 2.5}])
def test_sizes_out_of_their_bounds_are_refused_by_name(tmp_path, change: dict) -> None:
    with pytest.raises(InvalidParameterError) as e:
        job(tmp_path, tmp_path, tmp_path, **change)
    assert e.value.param == next(iter(change))
