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
    """Random but sane quantized blocks (any bits are valid codes; the fp16 scales are set small)."""
    per, size = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q5_0": (32, 22)}[kind]
    raw = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if kind == "Q4_K":  # d, dmin first
        raw[..., 0:2], raw[..., 2:4] = scale, scale
    elif kind == "Q5_0":  # d first
        raw[..., 0:2] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
    else:  # d last
        raw[..., -2:] = scale
    return raw.reshape(rows, -1)


H, F, HEADS, KV, VOCAB = 256, 512, 4, 2, 300


def _quantized_file(path: Path, arch: str, kinds: dict[str, str]) -> Path:
    """A one-layer ``arch`` GGUF file whose linears are random blocks of ``kinds`` (GGUF role -> type; Q8_0
    quantized from random values), the rest float32."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1), w.add_context_length(256), w.add_embedding_length(H), w.add_feed_forward_length(F)
    w.add_head_count(HEADS), w.add_head_count_kv(KV), w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5), w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default")
    # byte-level tokens and one merge whose result is a token (an engine loads the tokenizer)
    tokens = [chr(0x100 + i) for i in range(VOCAB - 1)] + [chr(0x100) + chr(0x101)]
    w.add_token_list(tokens), w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"{chr(0x100)} {chr(0x101)}"]), w.add_eos_token_id(1)
    dense = {"token_embd.weight": (VOCAB, H), "output_norm.weight": (H,), "blk.0.attn_norm.weight": (H,),
             "blk.0.ffn_norm.weight": (H,)}
    shapes = {"attn_q": (H, H), "attn_k": (H // 2, H), "attn_v": (H // 2, H), "attn_output": (H, H),
              "ffn_gate": (F, H), "ffn_up": (F, H), "ffn_down": (H, F)}
    for name, shape in dense.items():
        w.add_tensor(name, (rng.standard_normal(shape) * (0.05 if len(shape) == 2 else 1)).astype(np.float32))
    for role, (rows, cols) in shapes.items():
        kind = kinds[role]
        if kind == "Q8_0":
            values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
            blocks = quantize(values, GGMLQuantizationType.Q8_0)
        else:
            blocks = _k_blocks(rng, rows, cols, kind)
        w.add_tensor(f"blk.0.{role}.weight", blocks, raw_dtype=GGMLQuantizationType[kind])
    if arch == "qwen2":
        for proj, rows in (("q", H), ("k", H // 2), ("v", H // 2)):
            w.add_tensor(f"blk.0.attn_{proj}.bias", rng.standard_normal(rows).astype(np.float32) * 0.1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def _logits_diff(path: Path) -> float:
    """Max |cinq - transformers| of float32 logits on one prompt, both reading ``path``."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM
    ours = load_model(path, dtype="float32")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 42, 99, 7, 250, 11]])
    with torch.no_grad():
        return (ours.compute_logits(ours(ids)) - theirs(ids).logits).abs().max().item()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_k_quants_dequantize_at_load_to_transformers_logits(arch: str, tmp_path: Path):
    """Q4_K (served from its blocks) and Q6_K (dequantized at load with the gguf package) against transformers'
    own dequantization of the same file; llama's q/k rows come back in rotate-half order, qwen2's biases load.
    In bf16 the Q4_K linears (o, gate / up) are GGUFLinear; q beside Q6_K k / v, and Q6_K down, are dense."""
    from cinq.layers.quantization.gguf_linear import GGUFLinear
    kinds = {"attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
             "ffn_up": "Q4_K", "ffn_down": "Q6_K"}
    path = _quantized_file(tmp_path / "k.gguf", arch, kinds)
    diff = _logits_diff(path)
    assert diff < 1e-4, diff
    layer = load_model(path, dtype="bfloat16").model.layers[0]
    for linear, served in ((layer.self_attn.o_proj, "Q4_K"), (layer.mlp.gate_up_proj, "Q4_K"),
                           (layer.self_attn.qkv_proj, None), (layer.mlp.down_proj, None)):
        assert getattr(linear, "type_name", None) == served and isinstance(linear, GGUFLinear) == bool(served)


def test_q5_0_is_served_as_q8_0_blocks_of_the_same_values(tmp_path: Path):
    """Q5_0 projections (q / k beside a Q8_0 v, gate / up) load as Q8_0 blocks: GGUFLinear, the Q8_0 kernels in
    bf16, the load line says so; in float32 the values are the file's (transformers' logits)."""
    from cinq.layers.quantization.gguf_linear import GGUFLinear
    from cinq.model.config import ModelConfig
    kinds = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q6_K", "ffn_gate": "Q5_0",
             "ffn_up": "Q5_0", "ffn_down": "Q5_0"}
    path = _quantized_file(tmp_path / "q5.gguf", "llama", kinds)
    assert _logits_diff(path) < 1e-4
    model = load_model(path, dtype="bfloat16")
    layer = model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(linear, GGUFLinear) and linear.type_name == "Q8_0"
    assert not isinstance(layer.self_attn.o_proj, GGUFLinear)  # Q6_K: dequantized at load
    summary = ModelConfig.from_pretrained(path).quantization_config["summary"]
    assert "5 Q5_0 served as Q8_0 blocks" in summary and "1 Q8_0 served natively" in summary


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
