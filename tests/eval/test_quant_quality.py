"""The quality report: accuracy and perplexity per folder, deltas against the first row, markdown/JSON/plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cinq.eval.quant_quality import QualityReport, describe_folder, quality_report, simple_generate
from cinq.eval.tasks import arithmetic_problems, step_items
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


def test_accuracy_and_deltas_from_the_generated_answers(folders, tmp_path):
    base, q = folders
    problems = arithmetic_problems(4, seed=1, split="test")

    def oracle(path, prompts, max_new_tokens, dtype):
        # The float model answers every problem and step right; the quantized one gets the first problem's
        # answer and the first step item wrong.
        # A step item's prompt can equal a problem's prompt (first step): the length limit tells the calls apart.
        whole = max_new_tokens > 16
        answers = ({p.prompt(): p.target() for p in problems} if whole
                   else {it.prompt: it.expected + "\nmore" for it in step_items(problems)})
        outs = [answers[pr] for pr in prompts]
        if Path(path) == q:
            outs[0] = outs[0].rsplit("Answer:", 1)[0] + "Answer: -1" if whole else "1 + 1 = 3"
        return outs, 10.0
    report = quality_report({"float": base, "rtn-int4": q}, ppl_text=problems[0].text() * 3, ppl_source="t",
                            n_problems=4, seed=1, generate=oracle)
    assert [r.accuracy for r in report.rows] == [1.0, 0.75]
    n_steps = sum(len(p.steps) for p in problems)
    assert [r.n_steps for r in report.rows] == [n_steps, n_steps]
    assert [r.step_accuracy for r in report.rows] == [1.0, (n_steps - 1) / n_steps]
    assert report.rows[0].method == "float" and report.rows[1].method == "rtn (gptq)" and report.rows[1].bits == 4
    assert report.rows[1].weight_bytes < report.rows[0].weight_bytes
    assert all(r.perplexity is not None and r.perplexity > 1 for r in report.rows)
    assert report.rows[0].kl_vs_base == 0.0 and report.rows[0].top1_vs_base == 1.0
    assert report.rows[1].kl_vs_base > 0 and 0.5 < report.rows[1].top1_vs_base <= 1.0
    md = report.to_markdown()
    assert "-25.0 pt" in md and "75.0%" in md and "100.0%" in md
    files = report.save(tmp_path, "quality")
    assert {f.suffix for f in files} == {".md", ".json", ".png"}
    assert json.loads((tmp_path / "quality.json").read_text())["rows"][1]["accuracy"] == 0.75


def test_real_greedy_generation_without_the_engine(folders):
    base, _ = folders
    problems = arithmetic_problems(2, seed=2, split="test")
    texts, tps = simple_generate(base, [p.prompt() for p in problems], 6, "float32")
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts) and tps > 0


def test_compare_to_base_is_zero_for_the_same_model_and_positive_otherwise(folders):
    from cinq.eval.quant_quality import compare_to_base
    from cinq.model.loader import load_model
    base, q = folders
    a, b = load_model(base, dtype="float32"), load_model(q, dtype="float32")
    ids = build_byte_tokenizer().encode(arithmetic_problems(3, seed=4, split="test")[0].text()).ids * 4
    kl, top1 = compare_to_base(a, a, ids, context_len=64)
    assert abs(kl) < 1e-6 and top1 == 1.0
    kl_q, top1_q = compare_to_base(a, b, ids, context_len=64)
    assert kl_q > 1e-5 and top1_q <= 1.0


def test_describe_folder_counts_every_tensor_byte(folders):
    base, q = folders
    method, bits, nbytes = describe_folder(base)
    from safetensors.torch import load_file
    tensors = load_file(str(base / "model.safetensors"))
    assert method == "float" and bits is None
    assert nbytes == sum(t.numel() * t.element_size() for t in tensors.values())


def test_empty_fields_render_as_dashes():
    from cinq.eval.quant_quality import ModelQuality
    r = QualityReport([ModelQuality("a", "p", "float", None, 100, None, None, 0)])
    assert "| a | float | - | 0.00 | 1.00x | - | - | - | - | - | - | - | - | - |" in r.to_markdown()
