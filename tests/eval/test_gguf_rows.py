"""A GGUF file as a row of `cinq eval` (the reference row of a study on a GGUF model): its method, bits and
block size, its bytes as stored, its cache hash, and its perplexity equal to its dense export's."""

from __future__ import annotations

from pathlib import Path

import pytest

from cinq.eval.quant_quality import EvalSettings, checkpoint_bytes, describe_folder, evaluate_model
from cinq.cache import content_hash


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from cinq.assets import resolve_model_path
    from cinq.export.gguf import export_gguf
    folder = Path(resolve_model_path("cinq-tiny", field="model"))
    return folder, export_gguf(folder, tmp_path_factory.mktemp("gguf") / "tiny-q4_0.gguf", "q4_0").path


def test_gguf_row_describes_the_file_as_stored(tiny_q4: tuple[Path, Path]):
    folder, gguf = tiny_q4
    method, bits, nbytes = describe_folder(gguf)
    assert (method, bits) == ("gguf (Q4_0)", 4)
    linear, total = checkpoint_bytes(gguf)
    dense_linear, _ = checkpoint_bytes(folder)
    # Q4_0 stores 18 bytes per 32 values: 4.5 bits against the folder's 16 (float32 folders: 32).
    assert linear / dense_linear == pytest.approx(4.5 / (8 * _bytes_per_value(folder)), rel=0.01)
    assert total == nbytes and total > linear
    assert content_hash(gguf) != content_hash(folder) and content_hash(gguf) == content_hash(gguf)


def test_gguf_row_scores_perplexity(tiny_q4: tuple[Path, Path]):
    _, gguf = tiny_q4
    settings = EvalSettings(task="arithmetic-easy", n_problems=0, dtype="float32", decode_tokens=0)
    row = evaluate_model(gguf, "Anna has 5 apples. Then Anna buys 3 more. " * 20, settings, "q4")
    assert row.method == "gguf (Q4_0)" and row.group_size == 32 and 1.0 < row.perplexity < 1e4


def _bytes_per_value(folder: Path) -> int:
    import json
    return 4 if json.loads((folder / "config.json").read_text()).get("torch_dtype") == "float32" else 2
