"""Round trip: what ``cinq export --format gguf`` writes, cinq reads back — float32 logits equal transformers'
GGUF loader on the same file (bf16, q8_0, q4_0: the 4- and 8-bit blocks served natively), the tokenizer's ids equal
the folder's own, and the dense folder ``cinq export --format hf`` writes from a GGUF file loads to the same
logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cinq.assets import resolve_model_path
from cinq.export.gguf import export_gguf
from cinq.export.hf_folder import gguf_to_folder
from cinq.model.loader import load_model
from cinq.model.tokenizer import Tokenizer

TEXTS = ["Once upon a time", "The year 1984 had 366 days.", "  two  spaces\n\nand lines\n",
         "def f(x):\n    return x ** 2", "Ünïcödé: café, naïve, 東京 🙂", "3+4=7; 12*12=144", "it's what we'd've said"]


@pytest.fixture(scope="module")
def exports(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rt")
    return {t: export_gguf(tiny_llama, out / f"m-{t}.gguf", t).path for t in ("bf16", "q8_0", "q4_0")}


@pytest.mark.parametrize("outtype", ["bf16", "q8_0", "q4_0"])
def test_exported_file_reads_back_to_transformers_logits(exports: dict[str, Path], outtype: str):
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM
    path = exports[outtype]
    ours = load_model(path, dtype="float32")
    kinds = {type(m).__name__ for m in ours.modules()}
    assert ("GGUFLinear" in kinds) == (outtype != "bf16")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 42, 99, 7, 250, 11, 64, 5, 31]])
    with torch.no_grad():
        diff = (ours.compute_logits(ours(ids)) - theirs(ids).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_exported_tokenizer_gives_the_folders_ids(tmp_path: Path):
    folder = resolve_model_path("cinq-tiny", "model")
    path = export_gguf(folder, tmp_path / "tiny.gguf", "q8_0").path
    mine, src = Tokenizer.from_pretrained(path), Tokenizer.from_pretrained(folder)
    for text in TEXTS:
        for special in (True, False):
            assert mine.encode(text, add_special_tokens=special) == src.encode(text, add_special_tokens=special) \
                or (special and src.add_bos_token and not mine.add_bos_token), text
    assert mine.chat_template == src.chat_template


def test_hf_folder_from_gguf_loads_to_the_same_logits(exports: dict[str, Path], tmp_path: Path):
    path = exports["q4_0"]
    folder = gguf_to_folder(path, tmp_path / "dense", dtype="float32")
    a, b = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(a.compute_logits(a(ids)), b.compute_logits(b(ids)))
    assert Tokenizer.from_pretrained(folder).encode("hello world") == Tokenizer.from_pretrained(path).encode(
        "hello world")


def _k_blocks(rng: np.random.Generator, rows: int, cols: int, kind: str) -> np.ndarray:
    """Random but sane k-quant blocks (any bits are valid codes; the fp16 super-block scales are set small)."""
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if kind == "Q4_K":  # d, dmin first
        raw[..., 0:2], raw[..., 2:4] = scale, scale
    else:  # d last
        raw[..., -2:] = scale
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_k_quants_dequantize_at_load_to_transformers_logits(arch: str, tmp_path: Path):
    """Q4_K and Q6_K (no cinq kernel: dequantized at load with the gguf package) against transformers' own
    dequantization of the same file; llama's q/k rows come back in rotate-half order, qwen2's biases load."""
    pytest.importorskip("accelerate")
    from gguf import GGMLQuantizationType, GGUFWriter
    from transformers import AutoModelForCausalLM
    rng = np.random.default_rng(0)
    h, f, heads, kv, vocab = 256, 512, 4, 2, 300
    path = tmp_path / "k.gguf"
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1), w.add_context_length(256), w.add_embedding_length(h), w.add_feed_forward_length(f)
    w.add_head_count(heads), w.add_head_count_kv(kv), w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5), w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default")
    w.add_token_list([chr(0x100 + i) for i in range(vocab)]), w.add_token_types([1] * vocab)
    w.add_token_merges([f"{chr(0x100)} {chr(0x101)}"]), w.add_eos_token_id(1)
    dense = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,), "blk.0.attn_norm.weight": (h,),
             "blk.0.ffn_norm.weight": (h,)}
    kq = {"blk.0.attn_q.weight": (h, h, "Q4_K"), "blk.0.attn_k.weight": (h // 2, h, "Q6_K"),
          "blk.0.attn_v.weight": (h // 2, h, "Q6_K"), "blk.0.attn_output.weight": (h, h, "Q4_K"),
          "blk.0.ffn_gate.weight": (f, h, "Q4_K"), "blk.0.ffn_up.weight": (f, h, "Q4_K"),
          "blk.0.ffn_down.weight": (h, f, "Q6_K")}
    for name, shape in dense.items():
        w.add_tensor(name, (rng.standard_normal(shape) * (0.05 if len(shape) == 2 else 1)).astype(np.float32))
    for name, (rows, cols, kind) in kq.items():
        w.add_tensor(name, _k_blocks(rng, rows, cols, kind), raw_dtype=GGMLQuantizationType[kind])
    if arch == "qwen2":
        for proj, rows in (("q", h), ("k", h // 2), ("v", h // 2)):
            w.add_tensor(f"blk.0.attn_{proj}.bias", rng.standard_normal(rows).astype(np.float32) * 0.1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours = load_model(path, dtype="float32")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 42, 99, 7, 250, 11]])
    with torch.no_grad():
        diff = (ours.compute_logits(ours(ids)) - theirs(ids).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_qwen3_export_reads_back_to_its_source(tiny_models, tmp_path: Path):
    """q/k norms and head_dim != hidden / heads through the GGUF round trip (transformers' GGUF loader cannot
    take such a file: it sizes heads as hidden / heads): the bf16 file against its source folder with the same
    matrices rounded to bf16 (the exporter keeps norms in float32)."""
    folder = tiny_models("qwen3")
    path = export_gguf(folder, tmp_path / "q3.gguf", "bf16").path
    ours, ref = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2:
                p.copy_(p.bfloat16().float())
    ids = torch.tensor([[3, 17, 42, 99, 7, 25, 11]])
    with torch.no_grad():
        assert (ours.compute_logits(ours(ids)) - ref.compute_logits(ref(ids))).abs().max().item() < 1e-4
