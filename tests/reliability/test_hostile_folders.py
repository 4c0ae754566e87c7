"""Hostile model folders: each one is a ``ModelLoadError`` naming the file and what is wrong, and from the CLI
(`cinq generate`, `cinq serve`) one clear line and exit code 2 — never unpickling, never a hang, never an
out-of-memory. Every folder is a copy of the tiny test model with one file spoiled; files stay tiny (the
"huge" ones are sparse)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cinq.errors import ModelLoadError
from cinq.model.loader import load_model
from cinq.model.tokenizer import Tokenizer

WEIGHTS = "model.safetensors"


class _TouchOnLoad:
    """Unpickling this creates ``path``: the proof that a loader unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps({"model.embed_tokens.weight": _TouchOnLoad(marker)}, protocol=4)


def _header_file(path: Path, header: object, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _edit_json(file: Path, **changes: object) -> None:
    cfg = json.loads(file.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            cfg.pop(key)
        else:
            cfg[key] = value
    file.write_text(json.dumps(cfg))


_DELETE = object()


def _sparse(file: Path, size: int = 1 << 36) -> None:
    """A 64 GiB file that takes no disk: reading it whole would exhaust memory."""
    file.unlink(missing_ok=True)
    with open(file, "wb") as f:
        f.truncate(size)


def _fifo(file: Path) -> None:
    """A named pipe with no writer: opening it for reading blocks forever."""
    file.unlink(missing_ok=True)
    os.mkfifo(file)


# ---- the spoiled folders: name -> (spoil(folder), file named in the error, what the error says) ------------

def _truncated(p: Path) -> None:
    data = (p / WEIGHTS).read_bytes()
    (p / WEIGHTS).write_bytes(data[: len(data) // 2])


def _truncated_in_header(p: Path) -> None:
    data = (p / WEIGHTS).read_bytes()
    (p / WEIGHTS).write_bytes(data[:40])


def _torch_zip(p: Path) -> None:
    torch.save({"model.embed_tokens.weight": torch.zeros(2)}, p / WEIGHTS)


def _terabytes(p: Path) -> None:
    _header_file(p / WEIGHTS, {"model.embed_tokens.weight": {
        "dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 4_000_000_000_000]}}, b"\0" * 16)


def _huge_header_length(p: Path) -> None:
    (p / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 62) + b"{}")


def _header_above_cap(p: Path) -> None:
    # A 256 MiB header length inside a 512 MiB (sparse) file: within the file, past safetensors' 100 MiB cap.
    _sparse(p / WEIGHTS, 1 << 29)
    with open(p / WEIGHTS, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 28))


def _header_not_json(p: Path) -> None:
    (p / WEIGHTS).write_bytes(struct.pack("<Q", 7) + b"\xff\xfe{oops")


def _offsets_disagree_with_shape(p: Path) -> None:
    _header_file(p / WEIGHTS, {"model.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}},
                 b"\0" * 8)


def _unknown_dtype(p: Path) -> None:
    _header_file(p / WEIGHTS, {"model.norm.weight": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}},
                 b"\0" * 16)


def _index_escapes_folder(p: Path) -> None:
    outside = p.parent / "outside.safetensors"
    save_file({"model.norm.weight": torch.ones(64)}, outside)
    (p / WEIGHTS).unlink()
    names = load_file(outside)
    (p / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "../outside.safetensors" for name in names}}))


def _index_not_json(p: Path) -> None:
    (p / "model.safetensors.index.json").write_text("{\"weight_map\": {")


def _memory(p: Path) -> None:
    # Every field within its plausibility limit, together ~1.5 PB of weights: refused before any allocation.
    _edit_json(p / "config.json", hidden_size=65536, intermediate_size=1 << 20, num_hidden_layers=1024,
               num_attention_heads=512, num_key_value_heads=512, head_dim=128, vocab_size=1 << 22)


def _config(**changes: object) -> Callable[[Path], None]:
    return lambda p: _edit_json(p / "config.json", **changes)


def _write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def spoil(p: Path) -> None:
        (p / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return spoil


CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "torch-zip-named-safetensors": (_torch_zip, WEIGHTS, r"zip archive .*never unpickles"),
    "empty-safetensors": (_write(WEIGHTS, b""), WEIGHTS, r"0 bytes, too short"),
    "truncated-safetensors": (_truncated, WEIGHTS, r"holds only \d+ bytes of data.*truncated"),
    "truncated-in-header": (_truncated_in_header, WEIGHTS, r"header length \d+ bytes exceeds the file"),
    "header-claims-terabytes": (_terabytes, WEIGHTS, r"ends at byte 4000000000000 .*holds only 16 bytes"),
    "huge-header-length": (_huge_header_length, WEIGHTS, r"header length 4611686018427387904 bytes"),
    "header-above-100-mib": (_header_above_cap, WEIGHTS, r"header of 268435456 bytes is above .*100 MiB"),
    "header-not-json": (_header_not_json, WEIGHTS, r"header is not valid JSON"),
    "offsets-disagree-with-shape": (_offsets_disagree_with_shape, WEIGHTS, r"shape \[4\] of F32 is 16 bytes.*8"),
    "unknown-dtype": (_unknown_dtype, WEIGHTS, r"unknown dtype 'F128'"),
    "index-escapes-folder": (_index_escapes_folder, "model.safetensors.index.json", r"outside the model folder"),
    "index-not-json": (_index_not_json, "model.safetensors.index.json", r"invalid JSON"),
    "config-hidden-size-1e9": (_config(hidden_size=10**9), "config.json",
                               r"'hidden_size' is 1000000000, above the limit 65536"),
    "config-layers-1e6": (_config(num_hidden_layers=10**6), "config.json",
                          r"'num_hidden_layers' is 1000000, above the limit 1024"),
    "config-vocab-negative": (_config(vocab_size=-5), "config.json", r"'vocab_size' must be a positive integer"),
    "config-vocab-string": (_config(vocab_size="32000"), "config.json",
                            r"'vocab_size' must be a positive integer, got '32000'"),
    "config-vocab-bool": (_config(vocab_size=True), "config.json", r"'vocab_size' must be a positive integer"),
    "config-missing-hidden-size": (_config(hidden_size=_DELETE), "config.json", r"'hidden_size' is missing"),
    "config-missing-architecture": (_config(architectures=_DELETE, model_type=_DELETE), "config.json",
                                    r"no supported 'architectures' or 'model_type'"),
    "config-context-1e12": (_config(max_position_embeddings=10**12), "config.json",
                            r"'max_position_embeddings' is 1000000000000, above the limit"),
    "config-head-dim-negative": (_config(head_dim=-4), "config.json", r"'head_dim' must be a positive integer"),
    "config-eps-text": (_config(rms_norm_eps="tiny"), "config.json", r"'rms_norm_eps' must be a positive number"),
    "config-eos-text": (_config(eos_token_id="</s>"), "config.json", r"'eos_token_id' must be"),
    "config-quantization-garbage": (_config(quantization_config={"quant_method": "gptq", "bits": "four"}),
                                    "config.json", r"quantization_config"),
    "config-not-an-object": (_write("config.json", "[1, 2]"), "config.json", r"must hold a JSON object, got list"),
    "config-truncated": (_write("config.json", "{\"architectures\": [\"Llama"), "config.json", r"invalid JSON"),
    "config-not-utf8": (_write("config.json", b"\xff\xfe\x00{"), "config.json", r"invalid JSON|not UTF-8"),
    "config-too-big-for-memory": (_memory, "config.json", r"needs [\d.]+ [GTP]iB .*only [\d.]+ [GMT]iB .*available"),
    "generation-config-corrupt": (_write("generation_config.json", "{eos"), "generation_config.json",
                                  r"invalid JSON"),
    "tokenizer-json-truncated": (_write("tokenizer.json", "{\"version\": \"1.0\", \"model\": {"), "tokenizer.json",
                                 r"cannot be read by the tokenizers library"),
    "tokenizer-json-wrong-schema": (_write("tokenizer.json", "{\"model\": 5}"), "tokenizer.json",
                                    r"cannot be read by the tokenizers library"),
    "tokenizer-json-binary": (_write("tokenizer.json", os.urandom(256)), "tokenizer.json",
                              r"cannot be read by the tokenizers library"),
    "tokenizer-config-corrupt": (_write("tokenizer_config.json", "{\"bos_token\": "), "tokenizer_config.json",
                                 r"invalid JSON"),
    "tokenizer-config-a-list": (_write("tokenizer_config.json", "[]"), "tokenizer_config.json",
                                r"must hold a JSON object, got list"),
    "tokenizer-config-bos-int": (lambda p: _edit_json(p / "tokenizer_config.json", bos_token=5),
                                 "tokenizer_config.json", r"'bos_token' must be a string or an AddedToken"),
    "tokenizer-config-template-int": (lambda p: _edit_json(p / "tokenizer_config.json", chat_template=7),
                                      "tokenizer_config.json", r"'chat_template' must be"),
    "tokenizer-config-template-list-bad": (
        lambda p: _edit_json(p / "tokenizer_config.json", chat_template=[{"nom": "default"}]),
        "tokenizer_config.json", r"'chat_template' must be"),
}

# Cases that would hang or exhaust memory in this process if the loader were wrong: only ever run them in a
# subprocess with a timeout.
RISKY: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "fifo-config": (lambda p: _fifo(p / "config.json"), "config.json", r"not a regular file"),
    "fifo-safetensors": (lambda p: _fifo(p / WEIGHTS), WEIGHTS, r"not a regular file"),
    "fifo-tokenizer": (lambda p: _fifo(p / "tokenizer.json"), "tokenizer.json", r"not a regular file"),
    "dev-zero-config": (lambda p: ((p / "config.json").unlink(), (p / "config.json").symlink_to("/dev/zero")),
                        "config.json", r"not a regular file"),
    "folder-named-safetensors": (lambda p: ((p / WEIGHTS).unlink(), (p / WEIGHTS).mkdir()), WEIGHTS,
                                 r"not a regular file"),
    "sparse-64gib-config": (lambda p: _sparse(p / "config.json"), "config.json",
                            r"68719476736 bytes, above the 16 MiB limit"),
    "sparse-64gib-tokenizer-config": (lambda p: _sparse(p / "tokenizer_config.json"), "tokenizer_config.json",
                                      r"68719476736 bytes, above the 64 MiB limit"),
}


def spoiled(tiny_llama: Path, tmp_path: Path, case: str) -> tuple[Path, str, str]:
    """A copy of the tiny model with ``case`` applied: (folder, the file the error must name, its regex)."""
    spoil, file, pattern = {**CASES, **RISKY}[case]
    folder = Path(shutil.copytree(tiny_llama, tmp_path / "m"))
    spoil(folder)
    return folder, file, pattern


def load_all(path: Path) -> None:
    """What an engine loads from a folder: config and weights, then the tokenizer."""
    load_model(path, "float32")
    Tokenizer.from_pretrained(path)


def cinq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cinq.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def assert_clear_cli_error(r: subprocess.CompletedProcess, command: str, folder: Path, file: str,
                           pattern: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith(f"cinq {command}: error: ")), None)
    assert line is not None, r.stderr[-2000:]
    assert file in line and re.search(pattern, line), line


# ---- in process: the error type, the file and what is wrong -------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_folder_is_a_model_load_error_naming_the_file(case, tiny_llama, tmp_path):
    folder, file, pattern = spoiled(tiny_llama, tmp_path, case)
    with pytest.raises(ModelLoadError, match=pattern) as e:
        load_all(folder)
    assert file in str(e.value)


def test_the_spoiled_folders_differ_from_a_good_one(tiny_llama):
    load_all(tiny_llama)  # the copy each case starts from loads: what fails is the spoiled file


def test_pickle_named_safetensors_is_refused_without_unpickling(tiny_llama, tmp_path, run_cli):
    live = tmp_path / "live-marker"
    pickle.loads(_pickle_bytes(live))  # the payload is live: unpickling it does create its marker
    assert live.exists()
    marker = tmp_path / "marker"
    folder = Path(shutil.copytree(tiny_llama, tmp_path / "m"))
    (folder / WEIGHTS).write_bytes(_pickle_bytes(marker))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: not a safetensors file: it is a pickle"):
        load_all(folder)
    assert not marker.exists()
    r = run_cli("generate", str(folder), "-p", "x", "--max-tokens", "1")
    assert_clear_cli_error(r, "generate", folder, WEIGHTS, r"pickle.*never unpickles")
    assert not marker.exists()


def test_refuses_what_does_not_fit_in_memory_before_allocating(tiny_llama, tmp_path, monkeypatch):
    import cinq.model.memory as memory
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 100 << 10)
    with pytest.raises(ModelLoadError, match=r"needs [\d.]+ KiB \(float32 weights [\d.]+ KiB.*only 100.0 KiB"):
        load_model(tiny_llama, "float32")


# ---- the CLI: one line naming the file, exit code 2, bounded by a timeout ----------------------------------

CLI_CASES = sorted(RISKY) + ["truncated-safetensors", "header-claims-terabytes", "config-hidden-size-1e9",
                             "config-too-big-for-memory", "tokenizer-json-truncated", "config-missing-hidden-size"]


@pytest.mark.parametrize("case", CLI_CASES)
def test_cinq_generate_on_a_hostile_folder_is_one_clear_line(case, tiny_llama, tmp_path, run_cli):
    folder, file, pattern = spoiled(tiny_llama, tmp_path, case)
    argv = ("generate", str(folder), "-p", "x", "--max-tokens", "1")
    # the risky folders (a hang, a 64 GiB read) only ever in a process of their own and its timeout
    r = cinq(*argv, timeout=120) if case in RISKY else run_cli(*argv)
    assert_clear_cli_error(r, "generate", folder, file, pattern)


@pytest.mark.parametrize("case", ["truncated-safetensors", "config-layers-1e6", "tokenizer-config-corrupt",
                                  "fifo-safetensors"])
def test_cinq_serve_on_a_hostile_folder_exits_before_listening(case, tiny_llama, tmp_path):
    folder, file, pattern = spoiled(tiny_llama, tmp_path, case)
    # a process of its own even for safe folders: were one accepted, serve would listen instead of exiting
    r = cinq("serve", str(folder), "--port", "0", timeout=120)
    assert_clear_cli_error(r, "serve", folder, file, pattern)
    assert "listening on" not in r.stdout
