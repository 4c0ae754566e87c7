import json

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.model.loader import load_model
from cinq.train.distill import DistillJob, Distiller, distill

STUDENT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1}


def _job(teacher, corpus, out, **kw):
    base = dict(teacher=str(teacher), student=json_path(out), data_dir=str(corpus), out_dir=str(out),
                token_budget=40 * 8 * 32, batch_size=8, seq_len=32, lr=1e-2, warmup_steps=5, eval_every=0,
                progress=False, generator="naive")
    base.update(kw)
    return DistillJob(**base)


def json_path(out):
    out.mkdir(parents=True, exist_ok=True)
    p = out.parent / "student.json"
    p.write_text(json.dumps(STUDENT))
    return str(p)


def test_kd_gets_closer_to_the_teacher_than_ce_for_the_same_steps(teacher, tiny_corpus, tmp_path):
    kd = distill(_job(teacher, tiny_corpus, tmp_path / "kd", loss="fkl"))
    ce = distill(_job(teacher, tiny_corpus, tmp_path / "ce", loss="ce"))
    assert kd["finished"] and ce["finished"] and kd["tokens_seen"] == ce["tokens_seen"]
    assert kd["evals"]["val_kl_to_teacher"] < ce["evals"]["val_kl_to_teacher"]
    student = load_model(tmp_path / "kd" / "model", dtype="float32")
    assert sum(p.numel() for p in student.parameters()) < sum(
        p.numel() for p in load_model(teacher, dtype="float32").parameters())


def test_teacher_gets_no_gradient_and_hidden_losses_train_a_projection(teacher, tiny_corpus, tmp_path):
    d = Distiller(_job(teacher, tiny_corpus, tmp_path, loss="rkl=1,hidden_mse=0.5", hidden_layers="all"))
    assert d.proj is not None and len(d.proj.maps) == 1  # student width 16 -> teacher width 32
    loss, metrics = d.loss(d.batch(0), 0)
    loss.backward()
    assert set(metrics) == {"rkl", "hidden_mse"}
    assert all(p.grad is None for p in d.teacher.parameters())
    assert d.proj.maps[0].weight.grad is not None
    assert d.student.model.embed_tokens.weight.grad is not None


@pytest.mark.parametrize("regime,generator", [("seqkd", "naive"), ("onpolicy", "naive"), ("cot", "naive"),
                                              ("seqkd", "engine"), ("onpolicy", "engine")])
def test_regimes_run(teacher, tiny_corpus, tmp_path, regime, generator):
    job = _job(teacher, tiny_corpus, tmp_path, regime=regime, generator=generator, token_budget=6 * 8 * 32,
               loss="gjsd", seqkd_sequences=24, seqkd_max_tokens=24, prompt_len=16, refresh_every=3,
               student_fraction=0.7, cot_problems=4)
    summary = distill(job)
    assert summary["finished"] and (tmp_path / "model" / "model.safetensors").is_file()
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in json.loads(
        (tmp_path / "history.json").read_text())["history"])


def test_onpolicy_batches_score_only_sampled_tokens(teacher, tiny_corpus, tmp_path):
    d = Distiller(_job(teacher, tiny_corpus, tmp_path, regime="onpolicy", prompt_len=16, student_fraction=1.0,
                       refresh_every=2))
    d.prepare(10)
    tokens, mask = d.batch(0)
    assert tokens.shape == (8, 33) and mask.shape == (8, 32)
    assert not mask[:, :15].any() and mask[:, 15].all()  # position 15 predicts the first sampled token
    assert torch.equal(tokens[:, :16], d.corpus.batch(0)[:, :16])


def test_cot_batches_mask_rationale_and_answer(teacher, tiny_corpus, tmp_path):
    d = Distiller(_job(teacher, tiny_corpus, tmp_path, regime="cot", cot_problems=8, cot_rationales="gold",
                       seq_len=512))
    d.prepare(10)
    tokens, r_mask, a_mask = d.batch(3)
    assert r_mask.any() and a_mask.any() and not (r_mask & a_mask).any()
    text = d.tok.decode(tokens[0, 1:][r_mask[0]].tolist(), skip_special_tokens=False)
    assert "Answer:" in text and "Question" not in text


def test_cot_answer_tasks_never_follow_their_own_rationale():
    from cinq.train.cot import cot_batch
    ids = {"pad": 0}
    # Example k: prompt [10k+1], rationale [10k+2, 10k+3], answer prompt [10k+4], answer [10k+5].
    examples = [{"prompt": [10 * k + 1], "rationale": [10 * k + 2, 10 * k + 3], "answer_prompt": [10 * k + 4],
                 "answer": [10 * k + 5]} for k in range(1, 4)]
    for step in range(20):
        tokens, _, _ = cot_batch(examples, ids, batch_size=2, seq_len=19, seed=0, step=step)
        for row in tokens.tolist():
            for a, b in zip(row[2::5], row[3::5]):  # last rationale token, then the answer prompt after it
                if a and b:
                    assert a // 10 != b // 10, row


def test_bad_jobs_raise(teacher, tiny_corpus, tmp_path):
    with pytest.raises(InvalidParameterError, match="regime"):
        _job(teacher, tiny_corpus, tmp_path, regime="dpo")
    with pytest.raises(InvalidParameterError, match="student_fraction"):
        _job(teacher, tiny_corpus, tmp_path, student_fraction=2.0)
    with pytest.raises(InvalidParameterError, match="neither a preset"):
        Distiller(_job(teacher, tiny_corpus, tmp_path, student=str(tmp_path / "nonexistent")))
    from cinq.model.config import ModelConfig
    from cinq.model.saver import init_random_model, save_model
    other = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 999, **STUDENT})
    save_model(init_random_model(other), tmp_path / "other")
    with pytest.raises(InvalidParameterError, match="vocab_size"):
        Distiller(_job(teacher, tiny_corpus, tmp_path, student=str(tmp_path / "other")))


def test_generated_data_is_reused_only_for_the_settings_that_made_it(teacher, tiny_corpus, tmp_path):
    """The CoT examples are cached in the run folder; a rerun reuses them, a changed count or teacher does not."""
    import shutil

    from cinq.model.loader import load_model as load
    from cinq.model.saver import save_model

    def examples(job_teacher, n):
        d = Distiller(_job(job_teacher, tiny_corpus, tmp_path / "run", regime="cot", cot_problems=n,
                           cot_rationales="gold", seq_len=512))
        d.prepare(10)
        return d.cot_examples, sorted(p.name for p in (tmp_path / "run").glob("cot_examples-*.json"))

    first, files = examples(teacher, 4)
    assert len(first) == 4 and len(files) == 1
    again, files_again = examples(teacher, 4)
    assert again == first and files_again == files  # reused, nothing new written
    more, files_more = examples(teacher, 6)
    assert len(more) == 6 and len(files_more) == 2  # another count: generated anew
    other = tmp_path / "other-teacher"
    shutil.copytree(teacher, other)
    model = load(other, dtype="float32")
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    save_model(model, other)
    _, files_other = examples(other, 4)
    assert len(files_other) == 3  # same count, other weights: generated anew


def test_generated_cache_keys():
    from cinq.train.generated_cache import keyed_path, settings_key
    assert settings_key({"a": 1, "b": [2]}) == settings_key({"b": [2], "a": 1})
    assert settings_key({"a": 1}) != settings_key({"a": 2})
    assert keyed_path("d", "x", ".npy", {"a": 1}).name == f"x-{settings_key({'a': 1})}.npy"
