"""`cinq export --format gguf`: the file reads back (metadata, shapes, types, values), the rope layout is the one
llama.cpp's ``llama`` architecture expects, bad input is refused in one line; with llama-cpp-python installed
(an optional extra), llama.cpp's greedy tokens and logits on the exported file match cinq's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

gguf = pytest.importorskip("gguf")

from cinq.assets import resolve_model_path  # noqa: E402
from cinq.errors import InvalidParameterError, ModelLoadError  # noqa: E402
from cinq.export.gguf import export_gguf, gguf_tensor_name, permute_for_llama_rope  # noqa: E402

# relative L2 error of a dequantized matrix: bf16 rounding (2^-9 relative), q8_0 (~0.5% for Gaussian rows),
# q4_0 (~10%): a bound a few times each, far below what a wrong layout or a swapped tensor gives (~1.4)
REL_ERROR = {"bf16": 0.005, "q8_0": 0.02, "q4_0": 0.2}


def _fields(reader) -> dict[str, object]:
    out = {}
    for name, f in reader.fields.items():
        if not f.types:
            continue
        out[name] = f.contents()
    return out


@pytest.fixture(scope="module")
def tiny_exports(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {t: export_gguf(tiny_llama, out / f"tiny-{t}.gguf", t).path for t in ("bf16", "q8_0", "q4_0")}


def test_tensor_names_follow_llama_cpp():
    assert gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("lm_head.weight") == "output.weight"
    assert gguf_tensor_name("model.norm.weight") == "output_norm.weight"
    assert gguf_tensor_name("model.layers.11.self_attn.o_proj.weight") == "blk.11.attn_output.weight"
    assert gguf_tensor_name("model.layers.0.self_attn.q_proj.bias") == "blk.0.attn_q.bias"
    assert gguf_tensor_name("model.layers.2.mlp.down_proj.weight") == "blk.2.ffn_down.weight"
    assert gguf_tensor_name("model.layers.2.post_attention_layernorm.weight") == "blk.2.ffn_norm.weight"
    assert gguf_tensor_name("model.layers.2.mlp.experts.0.weight") is None


def _rope_rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _rope_adjacent_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def test_permuted_rows_under_adjacent_pair_rope_equal_rotate_half_rope():
    """q = W h rotated the Hugging Face way equals (P W) h rotated llama.cpp's way, up to the same row order P:
    attention scores (dot products of q and k, both permuted) are therefore unchanged."""
    heads, d, hidden = 3, 8, 16
    g = torch.Generator().manual_seed(0)
    w, h = torch.randn(heads * d, hidden, generator=g), torch.randn(5, hidden, generator=g)
    pos = torch.arange(5, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    cos, sin = angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]
    hf = _rope_rotate_half((h @ w.T).view(5, heads, d), cos, sin)
    cpp = _rope_adjacent_pairs((h @ permute_for_llama_rope(w, heads).T).view(5, heads, d), cos, sin)
    perm = permute_for_llama_rope(torch.arange(d)[:, None].float(), 1).long().flatten()
    torch.testing.assert_close(cpp, hf[..., perm])
    k = torch.randn(heads * d, hidden, generator=g)
    kh, kc = (_rope_rotate_half((h @ k.T).view(5, heads, d), cos, sin),
              _rope_adjacent_pairs((h @ permute_for_llama_rope(k, heads).T).view(5, heads, d), cos, sin))
    torch.testing.assert_close(cpp @ kc.transpose(-1, -2), hf @ kh.transpose(-1, -2), rtol=1e-4, atol=1e-4)
    # and not the identity: without the permutation the adjacent-pair rotation gives other scores
    plain = _rope_adjacent_pairs((h @ w.T).view(5, heads, d), cos, sin)
    assert not torch.allclose(plain @ kc.transpose(-1, -2), hf @ kh.transpose(-1, -2), atol=1e-2)


@pytest.mark.parametrize("outtype", ["bf16", "q8_0", "q4_0"])
def test_export_reads_back(tiny_llama: Path, tiny_exports: dict[str, Path], outtype: str):
    reader = gguf.GGUFReader(tiny_exports[outtype])
    cfg = json.loads((tiny_llama / "config.json").read_text())
    kv = _fields(reader)
    assert kv["general.architecture"] == "llama"
    assert kv["llama.block_count"] == cfg["num_hidden_layers"]
    assert kv["llama.embedding_length"] == cfg["hidden_size"]
    assert kv["llama.feed_forward_length"] == cfg["intermediate_size"]
    assert kv["llama.attention.head_count"] == cfg["num_attention_heads"]
    assert kv["llama.attention.head_count_kv"] == cfg["num_key_value_heads"]
    assert kv["llama.rope.dimension_count"] == cfg["hidden_size"] // cfg["num_attention_heads"]
    assert kv["llama.context_length"] == cfg["max_position_embeddings"]
    assert kv["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg["rms_norm_eps"])
    assert kv["llama.rope.freq_base"] == pytest.approx(cfg.get("rope_theta", 10000.0))
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"]
    assert kv["tokenizer.ggml.bos_token_id"] == cfg["bos_token_id"]
    assert kv["tokenizer.ggml.add_bos_token"] is True

    source = load_file(str(tiny_llama / "model.safetensors"))
    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(source) - (1 if cfg.get("tie_word_embeddings") else 0)
    for hf_name, values in source.items():
        name = gguf_tensor_name(hf_name)
        if name == "output.weight" and cfg.get("tie_word_embeddings"):
            continue
        t = tensors[name]
        assert list(t.shape)[::-1] == list(values.shape), name  # GGUF lists the fastest dimension first
        want = {"bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q8_0" if name in ("token_embd.weight", "output.weight")
                else "Q4_0"}[outtype] if values.ndim == 2 else "F32"
        assert t.tensor_type.name == want, name
        got = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))).reshape(values.shape)
        proj = hf_name.split(".")[-2]
        expected = permute_for_llama_rope(values.float(), heads[proj]) if proj in heads else values.float()
        err = (got - expected).norm() / expected.norm()
        assert err < (REL_ERROR[outtype] if values.ndim == 2 else 1e-6), (name, float(err))


def test_cinq_tiny_tokenizer_metadata(tmp_path: Path):
    """cinq-tiny's tokenizer splits digits one by one before GPT-2's regex: llama.cpp's "starcoder" splitting;
    its embeddings are tied, so no output tensor is written."""
    folder = resolve_model_path("cinq-tiny", "model")
    res = export_gguf(folder, tmp_path / "tiny.gguf", "q8_0")
    kv = _fields(gguf.GGUFReader(res.path))
    raw = json.loads((folder / "tokenizer.json").read_text())
    assert kv["tokenizer.ggml.pre"] == "starcoder"
    assert len(kv["tokenizer.ggml.merges"]) == len(raw["model"]["merges"])
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    for text, token_id in list(raw["model"]["vocab"].items())[::97]:
        assert tokens[token_id] == text
    for added in raw["added_tokens"]:
        assert tokens[added["id"]] == added["content"] and types[added["id"]] == gguf.TokenType.CONTROL
    assert kv["tokenizer.ggml.eos_token_id"] == raw["added_tokens"][6]["id"]  # <|end|>
    assert "output.weight" not in res.tensor_types and "token_embd.weight" in res.tensor_types


@pytest.mark.parametrize("pre, expected", [
    ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, "gpt-2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                             "use_regex": True}]},
     "starcoder"),
    ({"type": "Whitespace"}, None),
    ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}, None),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False},
                                            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                             "use_regex": True}]},
     None),
])
def test_pre_tokenizer_maps_to_llama_cpp_splitting_or_is_refused(tiny_llama: Path, tmp_path: Path, pre, expected):
    from cinq.export.gguf_vocab import read_gguf_vocab
    folder = shutil.copytree(tiny_llama, tmp_path / "m")
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["pre_tokenizer"] = pre
    raw["model"]["merges"] = [["a", "b"]]  # with merges, the splitting decides the ids
    raw["model"]["vocab"]["ab"] = len(raw["model"]["vocab"]) + len(raw["added_tokens"])
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    cfg = json.loads((folder / "config.json").read_text())
    if expected is None:
        with pytest.raises(ModelLoadError, match="pre_tokenizer") as e:
            read_gguf_vocab(folder, cfg["vocab_size"] + 1, [])
        assert e.value.param == "pre_tokenizer"
    else:
        vocab = read_gguf_vocab(folder, cfg["vocab_size"] + 8, [])
        assert vocab.pre == expected and vocab.merges == ["a b"] and vocab.num_padding_tokens == 7
        assert vocab.tokens[-1] == f"[PAD{cfg['vocab_size'] + 7}]" and vocab.token_types[-1] == gguf.TokenType.UNUSED


def _copy_with_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_refusals_name_the_field(tiny_llama: Path, tmp_path: Path):
    quantized = _copy_with_config(tiny_llama, tmp_path / "q", quantization_config={
        "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False})
    with pytest.raises(ModelLoadError, match="quantized checkpoint") as e:
        export_gguf(quantized, tmp_path / "q.gguf")
    assert e.value.param == "quantization_config"
    scaled = _copy_with_config(tiny_llama, tmp_path / "s", rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ModelLoadError, match="rope_scaling"):
        export_gguf(scaled, tmp_path / "s.gguf")
    with pytest.raises(InvalidParameterError, match="outtype") as e:
        export_gguf(tiny_llama, tmp_path / "x.gguf", "q5_k")
    assert e.value.param == "outtype"
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*partial"))


def test_cli_export_and_one_line_errors(tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    from cinq.cli import main
    out = tmp_path / "m.gguf"
    assert main(["export", str(tiny_llama), "--format", "gguf", "--outtype", "q4_0", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and gguf.GGUFReader(out).tensors
    assert main(["export", str(tiny_llama), "--outtype", "q5", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--outtype" in err
    assert main(["export", str(tiny_llama), "--format", "onnx", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--format" in err


# --- llama.cpp parity (llama-cpp-python is an optional extra: these run where it is installed) ---

PARITY_TOKENS = 32


@pytest.fixture(scope="module")
def cinq_tiny_prompt() -> list[int]:
    from cinq.model.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(resolve_model_path("cinq-tiny", "model"))
    return tok.encode("The quick brown fox jumps over the lazy dog. In the beginning God created")


def _cinq_greedy(folder: Path, prompt: list[int], n: int) -> tuple[list[int], list[dict[int, float]]]:
    from cinq import LLM, SamplingParams
    llm = LLM(str(folder), dtype="bfloat16", seed=0, kv_cache_memory=0.05)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=5))
    comp = out[0].outputs[0]
    return comp.token_ids, [{t: lp.logprob for t, lp in pos.items()} for pos in comp.logprobs]


def _llama_cpp_greedy(path: Path, prompt: list[int], n: int):
    pytest.importorskip("llama_cpp")
    from cinq.export.llama_cpp import LlamaCppGreedy
    return LlamaCppGreedy(path, threads=2, n_ctx=256).generate(prompt, n, keep_logits=True)


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - row.max() - np.log(np.exp(row - row.max()).sum())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_llama_cpp_greedy_equals_cinq_on_tiny_random_models(tiny_models, arch: str, tmp_path: Path):
    """GQA, rope permutation (llama), qkv bias (qwen2), q/k norm and head_dim != hidden / heads (qwen3)."""
    pytest.importorskip("llama_cpp")
    folder = tiny_models(arch)
    prompt = list(range(40, 72))
    ours, logprobs = _cinq_greedy(folder, prompt, PARITY_TOKENS)
    theirs = _llama_cpp_greedy(export_gguf(folder, tmp_path / "m.gguf", "bf16").path, prompt, PARITY_TOKENS)
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs.token_ids)) if a != b), None)
    if first is not None:
        # random weights make near-ties (bf16 rounding differs between the two runtimes): a difference is only
        # allowed where cinq itself scores llama.cpp's choice within 0.05 nats of its own, and ends the comparison
        margin = logprobs[first][ours[first]] - logprobs[first].get(theirs.token_ids[first], -np.inf)
        assert first >= PARITY_TOKENS // 2 and margin < 0.05, (first, margin)


def test_llama_cpp_greedy_and_logits_match_cinq_tiny_bf16(cinq_tiny_prompt: list[int], tmp_path: Path):
    pytest.importorskip("llama_cpp")
    folder = resolve_model_path("cinq-tiny", "model")
    ours, logprobs = _cinq_greedy(folder, cinq_tiny_prompt, PARITY_TOKENS)
    theirs = _llama_cpp_greedy(export_gguf(folder, tmp_path / "t.gguf", "bf16").path, cinq_tiny_prompt,
                               PARITY_TOKENS)
    assert theirs.token_ids == ours
    # the top-5 log-probabilities cinq reports at each step, against llama.cpp's at the same token ids
    worst = max(abs(float(_log_softmax(row)[t]) - lp) for row, pos in zip(theirs.logits, logprobs)
                for t, lp in pos.items())
    assert worst < 0.1, worst


def test_llama_cpp_q8_0_and_q4_0_agreement_is_measured(cinq_tiny_prompt: list[int], tmp_path: Path,
                                                       record_property: pytest.RecordProperty):
    """Quantized files compute other numbers than cinq's bf16, so greedy agreement (the tokens equal before the
    first difference, and at equal positions, of PARITY_TOKENS) is recorded, not required: on this prompt cinq's
    two best first tokens are 0.09 nats apart and q4_0 (like cinq's own RTN 4-bit, group 32) swaps them. What is
    required: after the prompt, llama.cpp's log-probabilities of cinq's top 5 stay within the quantization's
    noise (measured: 0.07 nats for q8_0, 0.18 for q4_0; a wrong layout is off by whole nats)."""
    pytest.importorskip("llama_cpp")
    folder = resolve_model_path("cinq-tiny", "model")
    ours, logprobs = _cinq_greedy(folder, cinq_tiny_prompt, PARITY_TOKENS)
    for outtype, bound in (("q8_0", 0.15), ("q4_0", 0.5)):
        run = _llama_cpp_greedy(export_gguf(folder, tmp_path / f"{outtype}.gguf", outtype).path,
                                cinq_tiny_prompt, PARITY_TOKENS)
        theirs = run.token_ids
        prefix = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        equal = sum(a == b for a, b in zip(ours, theirs))
        record_property(f"{outtype}_agreement", f"prefix {prefix}, positions {equal} of {len(ours)}")
        print(f"llama.cpp {outtype} vs cinq bf16 on cinq-tiny: greedy prefix {prefix}, equal positions {equal} "
              f"of {len(ours)}")
        first = _log_softmax(run.logits[0])
        worst = max(abs(float(first[t]) - lp) for t, lp in logprobs[0].items())
        assert len(theirs) == PARITY_TOKENS and worst < bound, (outtype, worst)


TEXTS = ["Once upon a time", "The year 1984 had 366 days, 52 weeks and 2 days.", "  two  spaces\n\nand lines\n",
         "def f(x):\n    return x ** 2  # square", "Ünïcödé: café, naïve, 東京, emoji 🙂", "3+4=7; 12*12=144",
         "it's what we'd've said, isn't it?", "nul\x00\x00bytes", ""]


@pytest.mark.parametrize("model", ["cinq-tiny", "byte"])
def test_text_tokenization_agrees_with_llama_cpp(tiny_llama: Path, tmp_path: Path, model: str):
    """Text -> ids through llama.cpp's "starcoder" splitting and the exported merges gives cinq's ids, BOS
    included (and for cinq's merge-free byte tokenizer, through "gpt-2" and the placeholder merge). Where they part: a special token's text inside a prompt (``<|end|>``) is one special token for
    cinq (the tokenizers library) and for llama.cpp only when asked to parse specials."""
    pytest.importorskip("llama_cpp")
    from cinq.export.llama_cpp import LlamaCppGreedy
    from cinq.model.tokenizer import Tokenizer
    folder = resolve_model_path("cinq-tiny", "model") if model == "cinq-tiny" else tiny_llama  # byte tokenizer
    tok = Tokenizer.from_pretrained(folder)
    llm = LlamaCppGreedy(export_gguf(folder, tmp_path / "t.gguf", "q8_0").path, threads=1, n_ctx=64).llm
    for text in TEXTS:
        assert llm.tokenize(text.encode("utf-8"), add_bos=True, special=False) == tok.encode(text), text
    marked = "hi<|end|>there"
    assert llm.tokenize(marked.encode(), add_bos=True, special=True) == tok.encode(marked)
    assert llm.tokenize(marked.encode(), add_bos=True, special=False) != tok.encode(marked)
