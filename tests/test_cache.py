"""The cinq cache folder, and that finding it does not pull in the models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cinq.cache import cache_dir


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CINQ_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("CINQ_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "cinq"


def test_native_kernels_import_neither_assets_nor_models():
    code = ("import sys, cinq.kernels.cpu_native, cinq.kernels.sdpa, cinq.kernels.backends, cinq.cache; "
            "print(sorted(m for m in sys.modules if m.startswith(('cinq.assets', 'cinq.model'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == "[]"


def test_content_hash_follows_the_weights_not_the_folder(tmp_path):
    from cinq.cache import content_hash
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")
    assert content_hash(a) == content_hash(b)  # where a model lies does not change its key
    (b / "model.safetensors").write_bytes(b"retrained")
    assert content_hash(a) != content_hash(b)
