"""Hostile GGUF files: each one is a ``ModelLoadError`` of one line naming the file and the field, refused while
reading the header (before anything sized by a count is allocated), and from the CLI one line and exit code 2.
Every file is a tiny valid model written here byte by byte, with one thing spoiled."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from cinq.errors import ModelLoadError
from cinq.model.config import ModelConfig
from cinq.model.gguf.file import find_gguf_file, read_gguf
from cinq.model.loader import load_model
from cinq.model.tokenizer import Tokenizer

H, V, F = 32, 8, 64
TOKENS = ["a", "b", "c", "d", "Ġ", "ab", "<s>", "</s>"]


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, vtype: int, value: object) -> bytes:
    body = struct.pack("<I", vtype)
    if vtype == 8:
        return _str(key) + body + _str(value)
    if vtype == 9:
        etype, items = value
        enc = b"".join(_str(i) for i in items) if etype == 8 else b"".join(struct.pack("<i", i) for i in items)
        return _str(key) + body + struct.pack("<IQ", etype, len(items)) + enc
    fmt = {4: "<I", 6: "<f", 7: "<?"}[vtype]
    return _str(key) + body + struct.pack(fmt, value)


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = {"token_embd.weight": (V, H), "output_norm.weight": (H,), "blk.0.attn_norm.weight": (H,),
         "blk.0.ffn_norm.weight": (H,), "blk.0.attn_q.weight": (H, H), "blk.0.attn_k.weight": (16, H),
         "blk.0.attn_v.weight": (16, H), "blk.0.attn_output.weight": (H, H), "blk.0.ffn_gate.weight": (F, H),
         "blk.0.ffn_up.weight": (F, H), "blk.0.ffn_down.weight": (H, F)}
    return {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in t.items()}


def build(spoil: dict[str, object] | None = None) -> bytes:
    """A valid 1-layer llama GGUF (float32 tensors, an 8-token byte-level vocabulary), optionally spoiled:
    ``spoil`` overrides header fields (magic, version, n_tensors, n_kv), adds raw kv bytes, or edits a tensor's
    info (dims, type, offset) by name."""
    spoil = spoil or {}
    tokens = spoil.get("tokens", TOKENS)
    kvs = [_kv("general.architecture", 8, "llama"), _kv("llama.block_count", 4, 1),
           _kv("llama.embedding_length", 4, H), _kv("llama.feed_forward_length", 4, F),
           _kv("llama.attention.head_count", 4, 4), _kv("llama.attention.head_count_kv", 4, 2),
           _kv("llama.context_length", 4, 128), _kv("llama.rope.freq_base", 6, 10000.0),
           _kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5), _kv("tokenizer.ggml.model", 8, "gpt2"),
           _kv("tokenizer.ggml.tokens", 9, (8, tokens)), _kv("tokenizer.ggml.merges", 9, (8, ["a b"])),
           _kv("tokenizer.ggml.token_type", 9, (5, [1] * 6 + [3, 3][: len(tokens) - 6])),
           _kv("tokenizer.ggml.bos_token_id", 4, 6), _kv("tokenizer.ggml.eos_token_id", 4, 7)]
    kvs += spoil.get("extra_kv", [])
    tensors = _tensors()
    infos, data, offset = [], b"", 0
    for name, arr in tensors.items():
        edit = spoil.get(name, {})
        dims = edit.get("dims", tuple(reversed(arr.shape)))
        ttype, off = edit.get("type", 0), edit.get("offset", offset)
        infos.append(_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", ttype, off))
        raw = arr.tobytes()
        data += raw + b"\0" * (-len(raw) % 32)
        offset += len(raw) + (-len(raw) % 32)
    head = (spoil.get("magic", b"GGUF") + struct.pack("<I", spoil.get("version", 3))
            + struct.pack("<QQ", spoil.get("n_tensors", len(infos)), spoil.get("n_kv", len(kvs))))
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % 32) + data


CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "bad magic": (lambda: build({"magic": b"GGML"}), "magic"),
    "unknown version": (lambda: build({"version": 7}), "version"),
    "truncated header": (lambda: build()[:40], "truncated"),
    "absurd tensor count": (lambda: build({"n_tensors": 1 << 40}), "tensor_count"),
    "absurd kv count": (lambda: build({"n_kv": 1 << 40}), "kv_count"),
    "kv count past the file": (lambda: build({"n_kv": 60000}), "kv_count"),
    "string past the end": (lambda: build({"extra_kv": [struct.pack("<Q", 1 << 50) + b"x"]}), "string length"),
    "array count absurd": (lambda: build({"extra_kv": [_str("k") + struct.pack("<IIQ", 9, 4, 1 << 50)]}),
                           "array length"),
    "unknown value type": (lambda: build({"extra_kv": [_str("k") + struct.pack("<I", 99)]}), "value type"),
    "unknown tensor type": (lambda: build({"blk.0.attn_q.weight": {"type": 99}}), "ggml type 99"),
    "too many dims": (lambda: build({"output_norm.weight": {"dims": (1,) * 7}}), "n_dims"),
    "absurd dims": (lambda: build({"blk.0.attn_q.weight": {"dims": (1 << 30, 1 << 30)}}), "absurd"),
    "lying offset": (lambda: build({"blk.0.ffn_down.weight": {"offset": 1 << 40}}), "past the end"),
    "overlapping tensors": (lambda: build({"blk.0.ffn_up.weight": {"offset": 0}}), "overlap"),
    "truncated tensor data": (lambda: build()[:-600], "past the end"),
    "vocabulary shorter than the embedding": (lambda: build({"tokens": TOKENS[:6]}), "tokenizer.ggml.tokens"),
}


def _load_all(path: Path) -> None:
    Tokenizer.from_pretrained(path)
    ModelConfig.from_pretrained(path)
    load_model(path, dtype="float32")


def test_the_valid_file_loads_and_runs(tmp_path: Path):
    path = tmp_path / "m.gguf"
    path.write_bytes(build())
    assert find_gguf_file(tmp_path) == path and find_gguf_file(path) == path
    cfg = ModelConfig.from_pretrained(path)
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.vocab_size, cfg.tie_word_embeddings) == (H, 2, V, True)
    model = load_model(tmp_path, dtype="float32")
    assert model(torch.tensor([[0, 1, 2]])).shape == (1, 3, H)
    assert Tokenizer.from_pretrained(path).encode("ab", add_special_tokens=False) == [5]


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_gguf_is_one_line_naming_the_file_and_field(case: str, tmp_path: Path):
    make, field = CASES[case]
    path = tmp_path / "m.gguf"
    path.write_bytes(make())
    with pytest.raises(ModelLoadError) as e:
        _load_all(path)
    message = str(e.value)
    assert message.startswith(str(path)) and field in message and "\n" not in message, message


@pytest.mark.parametrize("case", ["lying offset", "absurd kv count", "vocabulary shorter than the embedding"])
def test_cinq_generate_on_a_hostile_gguf_is_one_line_and_exit_2(case: str, tmp_path: Path, run_cli):
    path = tmp_path / "m.gguf"
    path.write_bytes(CASES[case][0]())
    r = run_cli("generate", str(path), "-p", "hi", "--num-kv-blocks", "8")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert len(errors) == 1 and str(path) in errors[0] and CASES[case][1] in errors[0], r.stderr


def test_a_folder_with_two_gguf_files_names_them(tmp_path: Path):
    (tmp_path / "a.gguf").write_bytes(build())
    (tmp_path / "b.gguf").write_bytes(build())
    with pytest.raises(ModelLoadError, match="holds 2 .gguf files"):
        ModelConfig.from_pretrained(tmp_path)
