"""Per-folder quality rows: accuracy (with SEs) and perplexity, KL / top-1 against the first folder, bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.eval.quant_quality import EvalSettings, checkpoint_bytes, compare_to_base, describe_folder, quality_report
from cinq.tasks import TASKS, arithmetic_problems, step_items
from cinq.eval.text_scores import base_scores, score_text
from cinq.model.byte_tokenizer import build_byte_tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny model trained for a few seconds on arithmetic text, and its RTN 4-bit copy."""
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    from tests.quant.conftest import tiny_config, train_tiny, write_folder
    base = write_folder(train_tiny(tiny_config(), steps=60), tmp_path_factory.mktemp("base"))
    q = tmp_path_factory.mktemp("rtn")
    quantize_model(base, q, QuantConfig("rtn", 4, 32), None, progress=False)
    return base, q


def oracle(problems, wrong_folder: Path):
    """A generator factory: every answer and step right, except the first problem's answer and its first step
    for ``wrong_folder``."""
    def factory(path: Path):
        def generate(prompts, max_new_tokens, stop):
            whole = stop == ("\nQuestion",)
            answers = ({p.prompt(): p.target() + "\n" for p in problems} if whole
                       else {it.prompt: it.expected for it in step_items(problems)})
            outs = [answers[pr] for pr in prompts]
            if Path(path) == wrong_folder:
                outs[0] = outs[0].rsplit("Answer:", 1)[0] + "Answer: -1" if whole else "1 + 1 = 3"
            return outs, 10.0
        return generate
    return factory


def test_accuracy_ses_and_deltas(folders, tmp_path):
    base, q = folders
    problems = arithmetic_problems(4, seed=1, split="test")
    report = quality_report({"float": base, "rtn-int4": q}, ppl_text=problems[0].text() * 3, ppl_source="t",
                            n_problems=4, seed=1, generator=oracle(problems, q))
    assert [r.accuracy for r in report.rows] == [1.0, 0.75]
    assert report.rows[1].accuracy_se == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
    assert report.rows[1].correct == [0, 1, 1, 1]
    n_steps = sum(len(p.steps) for p in problems)
    assert [r.n_steps for r in report.rows] == [n_steps, n_steps]
    assert [r.step_accuracy for r in report.rows] == [1.0, (n_steps - 1) / n_steps]
    assert report.rows[1].step_hits[0] == len(problems[0].steps) - 1 and report.rows[0].step_accuracy_se == 0.0
    assert report.rows[0].method == "float" and report.rows[1].method == "rtn (gptq)" and report.rows[1].bits == 4
    assert report.rows[1].group_size == 32 and report.rows[0].group_size is None
    assert report.rows[1].weight_bytes < report.rows[0].weight_bytes
    assert 0 < report.rows[1].linear_bytes < report.rows[0].linear_bytes
    assert all(r.perplexity is not None and r.perplexity > 1 for r in report.rows)
    assert report.rows[0].kl_vs_base == 0.0 and report.rows[0].top1_vs_base == 1.0
    assert report.rows[1].kl_vs_base > 0 and 0.5 < report.rows[1].top1_vs_base <= 1.0
    md = report.to_markdown()
    assert "-25.0 pt ± 25.0" in md and "75.0% ± 21.7" in md and "100.0% ± 0.0" in md
    assert {f.suffix for f in report.save(tmp_path, "quality")} == {".md", ".json", ".png"}


def test_engine_row_has_decode_speed_and_kernels(folders):
    base, q = folders
    report = quality_report({"float": base, "q": q}, n_problems=2, seed=2, decode_tokens=4)
    for r in report.rows:
        assert r.decode_tokens_per_s is not None and r.decode_tokens_per_s > 0 and r.kernels
        assert r.accuracy is not None and r.gen_tokens_per_s > 0 and len(r.correct) == 2
    assert report.rows[0].kernels == ["dense"] and "dense" not in report.rows[1].kernels


def test_one_pass_scores_match_perplexity_and_the_kl_definition(folders):
    from cinq.eval.perplexity import perplexity
    from cinq.model.loader import load_model
    base, q = folders
    a, b = load_model(base, dtype="float32"), load_model(q, dtype="float32")
    ids = build_byte_tokenizer().encode(arithmetic_problems(3, seed=4, split="test")[0].text()).ids * 4
    same = score_text(a, ids, 64, base_scores(a, ids, 64, kl_tokens=100))
    assert same.perplexity == pytest.approx(perplexity(a, ids, 64), rel=1e-5)
    assert abs(same.kl) < 1e-6 and same.top1 == 1.0
    scores = score_text(b, ids, 64, base_scores(a, ids, 64, kl_tokens=100))
    assert scores.perplexity == pytest.approx(perplexity(b, ids, 64), rel=1e-5)
    # KL(base || model) by hand on the first 100 predictions (first window: tokens 0..63 predict 1..63).
    with torch.inference_mode():
        t = torch.tensor(ids)
        la = torch.cat([a.compute_logits(a(t[None, :64]))[0, :-1], a.compute_logits(a(t[None, 63:127]))[0, :-1]])
        lb = torch.cat([b.compute_logits(b(t[None, :64]))[0, :-1], b.compute_logits(b(t[None, 63:127]))[0, :-1]])
    pa, pb = la.float().log_softmax(-1)[:100], lb.float().log_softmax(-1)[:100]
    kl = float((pa.exp() * (pa - pb)).sum(-1).mean())
    assert scores.kl == pytest.approx(kl, rel=1e-4) and scores.kl > 1e-6
    assert scores.top1 == pytest.approx(float((pa.argmax(-1) == pb.argmax(-1)).float().mean()))
    kl2, top1 = compare_to_base(a, b, ids, context_len=64, max_tokens=100)
    assert kl2 == pytest.approx(kl, rel=1e-4) and top1 == pytest.approx(scores.top1)


def test_describe_folder_counts_every_tensor_byte(folders):
    base, q = folders
    method, bits, nbytes = describe_folder(base)
    from safetensors.torch import load_file
    tensors = load_file(str(base / "model.safetensors"))
    assert method == "float" and bits is None
    assert nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    linear, total = checkpoint_bytes(q)
    qt = load_file(str(q / "model.safetensors"))
    assert total == sum(t.numel() * t.element_size() for t in qt.values())
    assert linear == sum(t.numel() * t.element_size() for k, t in qt.items() if "_proj." in k)


def test_eval_settings_round_trip():
    s = EvalSettings(task="arithmetic-easy", n_problems=7)
    assert s.to_dict()["n_problems"] == 7 and s.task in TASKS


def test_empty_fields_render_as_dashes():
    from cinq.eval.quality_report import ModelQuality, QualityReport
    r = QualityReport([ModelQuality("a", "p", "float", None, 100, None, None, 0)])
    assert "| a | float | - | - | 0.00 | 1.00x | 0.00 | - | - | - | - | - | - | - | - | - | - | baseline |" \
        in r.to_markdown()


def test_dequantized_kernels_keep_the_function_and_key_only_when_on(folders):
    from cinq.eval.quant_quality import evaluate_model
    _, q = folders
    assert "dequantize" not in EvalSettings().to_dict()  # earlier studies' cache keys unchanged
    assert EvalSettings(dequantize=True).to_dict()["dequantize"] is True
    text = "Anna has 5 apples. Then Anna buys 3 more. " * 30
    kernel = evaluate_model(q, text, EvalSettings(n_problems=2, dtype="float32", decode_tokens=4), "k")
    dense = evaluate_model(q, text, EvalSettings(n_problems=2, dtype="float32", decode_tokens=4, dequantize=True),
                           "d")
    assert dense.perplexity == pytest.approx(kernel.perplexity, rel=1e-4)
    assert dense.kernels == ["dequantized_at_load"] and "dequantized_at_load" not in kernel.kernels
    assert dense.correct == kernel.correct
