"""The fused decode step (cinq/model/decode_layers.py): taken for bf16 decode steps of covered stacks, and
bit-identical to the Python layers (greedy tokens and their logprobs), per linear kind; off for what it does not
cover."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cinq.config import EngineConfig
from cinq.engine.engine import LLMEngine
from cinq.kernels.cpu_native import native_module
from cinq.model import decode_layers
from cinq.sampling_params import SamplingParams

PROMPTS = [list(range(5, 5 + n)) for n in (7, 19, 33)]

pytestmark = pytest.mark.skipif(native_module("decode_layers") is None, reason="no native CPU kernels here")


def generate(model: Path | str, monkeypatch: pytest.MonkeyPatch, fused: bool, max_tokens: int = 10,
             max_num_seqs: int = 3, prompts: list[list[int]] = PROMPTS, **kw) -> tuple[dict[str, tuple], LLMEngine]:
    """Greedy tokens and top-3 logprobs per request, with the fused step on or off."""
    monkeypatch.setenv(decode_layers.ENV, "1" if fused else "0")
    engine = LLMEngine(EngineConfig(model=str(model), dtype="bfloat16", num_kv_blocks=64, seed=0,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=64, **kw))
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                                           logprobs=3))
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                c = o.outputs[0]
                out[o.request_id] = (tuple(c.token_ids), repr(c.logprobs))
    return out, engine


def fused_of(engine: LLMEngine) -> decode_layers.DecodeLayers | None:
    return engine.executor.runner.model.model._decode_layers or None


def check_same(model: Path | str, monkeypatch: pytest.MonkeyPatch, **kw) -> decode_layers.DecodeLayers:
    eager, _ = generate(model, monkeypatch, fused=False, **kw)
    fused, engine = generate(model, monkeypatch, fused=True, **kw)
    program = fused_of(engine)
    assert program is not None and program.steps > 0  # the fused step ran
    assert fused == eager  # bit-identical: same tokens, same logprobs to the last digit
    return program


def test_dense_bf16_stack_is_bit_identical(tiny_llama, monkeypatch):
    check_same(tiny_llama, monkeypatch)


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_gguf_blocks_are_bit_identical(tiny_llama, tmp_path, monkeypatch, outtype):
    from cinq.export.gguf import export_gguf
    path = export_gguf(tiny_llama, tmp_path / f"m-{outtype}.gguf", outtype).path
    program = check_same(path, monkeypatch)
    assert program.max_rows >= 3  # all three requests decode in one fused step


def test_gguf_q4_k_and_q5_0_stacks_are_bit_identical(tmp_path, monkeypatch):
    # k-quant blocks served natively (Q4_K: float32 scale and offset per 32 values) and Q5_0 served as Q8_0
    from tests.model.gguf.test_model import _quantized_file
    for kind in ("Q4_K", "Q5_0"):
        path = _quantized_file(tmp_path / f"{kind}.gguf", "llama", dict.fromkeys(
            ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), kind))
        program = check_same(path, monkeypatch)
        assert program.max_rows >= 3


@pytest.mark.parametrize("bits, group", [(4, 32), (8, 32), (4, 64)])
def test_grouped_int_weights_are_bit_identical(tiny_llama, tmp_path, monkeypatch, bits, group):
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    out = tmp_path / "q"
    quantize_model(tiny_llama, out, QuantConfig(method="rtn", bits=bits, group_size=group), progress=False)
    check_same(out, monkeypatch)


def test_speculative_verify_rows_are_bit_identical(tiny_llama, monkeypatch):
    # n-gram drafts: verify steps of k + 1 rows per sequence go through the fused step too, and so do the ragged
    # ones (a request without a match beside one verifying drafts), which the Python layers attend with the same
    # kernel (sdpa.py's ragged tail)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    looping = [5, 6, 7, 8] * 4 + [5, 6]  # drafts from its first decode step on; the others only once they repeat
    program = check_same(tiny_llama, monkeypatch, max_tokens=16, speculative_config=spec,
                         prompts=[looping, *PROMPTS[1:]])
    assert 0 < program.ragged_steps < program.steps


def test_dense_verify_steps_past_one_pass_of_rows_run_fused_bit_identically(tiny_llama, monkeypatch):
    # 3 requests verifying 3 drafts: 12 rows, past the 8 rows of one pass of the skinny kernel's tiles (it runs
    # more in passes of 8, or on AVX2 one call per 8). Where the bf16 GEMM is emulated the Python layers run the
    # native kernel up to small_m_rows() and on chunks of it past that, and so does the program
    # (set_dense_chunk_rows)
    from cinq.kernels.cpu_native import bf16_gemm_is_emulated
    if not bf16_gemm_is_emulated():
        pytest.skip("the bf16 GEMM is native here: the Python layers take oneDNN past small_m_rows()")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    prompts = [list(range(5 + 7 * i, 12 + 10 * i)) for i in range(3)]  # the tiny model soon loops: all draft
    program = check_same(tiny_llama, monkeypatch, max_tokens=24, speculative_config=spec, prompts=prompts)
    assert program.most_rows > 8


def test_eagle3_steps_capture_the_feature_layers_inputs_bit_identically(tiny_llama, tmp_path, monkeypatch):
    # EAGLE-3 reads three layers' inputs every step (also with speculation off): the fused step returns those
    # three only, the same tensors the Python layers keep (the tokens alone could not tell: any draft is exact)
    from cinq.model.loader import load_model
    from cinq.spec.eagle import new_eagle_head, save_eagle_head
    from cinq.spec.eagle_proposer import EagleProposer
    torch.manual_seed(0)
    head = new_eagle_head(load_model(tiny_llama, torch.float32), "eagle3", seed=1)
    spec = {"method": "eagle3", "model": str(save_eagle_head(head, tmp_path / "head")), "num_speculative_tokens": 3}
    kept: list[list[torch.Tensor]] = []
    commit = EagleProposer.commit

    def recording_commit(self, view):  # noqa: ANN001, ANN202
        kept.append([t.clone() for t in view.layer_states])
        return commit(self, view)

    monkeypatch.setattr(EagleProposer, "commit", recording_commit)
    eager, _ = generate(tiny_llama, monkeypatch, fused=False, max_tokens=12, speculative_config=spec)
    eager_states, kept[:] = list(kept), []
    fused, engine = generate(tiny_llama, monkeypatch, fused=True, max_tokens=12, speculative_config=spec)
    assert fused_of(engine).steps > 0 and fused == eager
    assert len(kept) == len(eager_states) and all(len(step) == 3 for step in kept)
    assert all(torch.equal(a, b) for got, want in zip(kept, eager_states) for a, b in zip(got, want))


def test_off_switch_and_float32_take_the_python_layers(tiny_llama, monkeypatch):
    _, engine = generate(tiny_llama, monkeypatch, fused=False)
    assert fused_of(engine) is None
    monkeypatch.setenv(decode_layers.ENV, "1")
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", num_kv_blocks=64, seed=0))
    engine.add_request("r", PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    program = fused_of(engine)
    assert program is None or program.steps == 0


@contextlib.contextmanager
def two_threads(setting: str) -> Iterator[Any]:
    """2 torch threads and the decode_layers module's ``set_<setting>`` at 1 (every call splits), restored after."""
    mod = native_module("decode_layers")
    before, threads = getattr(mod, setting)(), torch.get_num_threads()
    torch.set_num_threads(2)
    getattr(mod, f"set_{setting}")(1)
    try:
        yield mod
    finally:
        getattr(mod, f"set_{setting}")(before)
        torch.set_num_threads(threads)


def test_linears_split_across_threads_are_bit_identical(tiny_llama, tmp_path, monkeypatch):
    # every linear split into one range of output rows per thread (the team path), GGUF and dense
    from cinq.export.gguf import export_gguf
    with two_threads("min_split_bytes"):
        for model in (tiny_llama, export_gguf(tiny_llama, tmp_path / "m.gguf", "q4_0").path):
            program = check_same(model, monkeypatch)
            assert program.program.split_calls() > 0


def test_split_linears_written_in_place_match_the_concatenated_parts(tiny_llama, tmp_path, monkeypatch):
    # int8-activation linears split across the team write their columns of one output (the _out ops); with that
    # off, the parts are concatenated as before: both bit-identical to the Python layers
    from cinq.export.gguf import export_gguf
    model = export_gguf(tiny_llama, tmp_path / "m.gguf", "q4_0").path
    mod = native_module("decode_layers")
    with two_threads("min_split_bytes"):
        try:
            for in_place in (False, True):
                mod.set_write_parts_in_place(in_place)
                assert check_same(model, monkeypatch).program.split_calls() > 0
        finally:
            mod.set_write_parts_in_place(True)


@pytest.mark.parametrize("max_num_seqs, spec, splits", [
    (3, None, True),  # three sequences: whole sequences per thread
    (3, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, True),  # verify rows (ql > 1)
    (1, None, True),  # one sequence: its 2 kv heads, one per thread (head_dim 16: the widening path)
])
def test_attention_split_across_threads_is_bit_identical(tiny_llama, monkeypatch, max_num_seqs, spec, splits):
    with two_threads("min_attention_split_bytes"):
        program = check_same(tiny_llama, monkeypatch, max_tokens=16, max_num_seqs=max_num_seqs,
                             **({"speculative_config": spec} if spec else {}))
        assert (program.program.split_attention_calls() > 0) == splits


def test_one_sequence_splits_its_query_heads_where_attention_reads_bf16_pages(tiny_models, monkeypatch):
    # head_dim 64: at batch 1 each thread takes a range of query heads (the kv head's group of 3 cut in two) on an
    # AVX512-BF16 CPU, bit-identical to the whole call; elsewhere (whole kv heads only) its one kv head stays whole
    from cinq.plan.cpu import vector_isa
    with two_threads("min_attention_split_bytes"):
        program = check_same(tiny_models("llama_d64"), monkeypatch, max_tokens=16, max_num_seqs=1)
        assert (program.program.split_attention_calls() > 0) == (vector_isa() in ("AVX512-BF16", "AMX"))


def test_paged_decode_heads_write_what_the_whole_call_returns():
    # query heads in any cut (bf16 path) or whole kv heads write exactly what the whole call returns
    from cinq.plan.cpu import vector_isa
    assert native_module("paged_decode") is not None
    torch.manual_seed(0)
    nd, ql, hq, hkv, d, bs = 2, 2, 6, 2, 64, 4
    cache = torch.randn(2, 12, bs, hkv, d).to(torch.bfloat16)
    tables = torch.arange(12, dtype=torch.int32).view(nd, 6).flip(1).contiguous()
    lens = torch.tensor([9, 21], dtype=torch.int32)
    q = torch.randn(nd * ql, hq, d).to(torch.bfloat16)
    no_tree = torch.empty(0, dtype=torch.bool)
    whole = torch.ops.cinq.paged_decode(q, cache, tables, lens, 0.125, ql, no_tree)
    cuts = ((0, 1), (1, 4), (4, 6)) if vector_isa() in ("AVX512-BF16", "AMX") else ((0, 3), (3, 6))
    out = torch.full_like(q, float("nan"))
    for a, b in cuts:
        torch.ops.cinq.paged_decode_heads(q, cache, tables, lens, 0.125, ql, no_tree, out, a, b)
    assert torch.equal(out, whole)
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.cinq.paged_decode_heads(q, cache, tables, lens, 0.125, ql, no_tree, out, 4, 7)
    with pytest.raises(RuntimeError, match="whole kv heads"):
        torch.ops.cinq.paged_decode_heads(q.float(), cache, tables, lens, 0.125, ql, no_tree, out.float(), 0, 1)


def test_paged_decode_seqs_write_what_the_whole_call_returns():
    # sequences run in any cut write exactly what the whole call returns; a range outside the call is refused
    assert native_module("paged_decode") is not None  # registers torch.ops.cinq.paged_decode*
    torch.manual_seed(0)
    nd, ql, hq, hkv, d, bs = 3, 2, 6, 2, 16, 4
    cache = torch.randn(2, 12, bs, hkv, d).to(torch.bfloat16)
    tables = torch.arange(12, dtype=torch.int32).view(nd, 4).flip(1).contiguous()
    lens = torch.tensor([9, 11, 16], dtype=torch.int32)
    q = torch.randn(nd * ql, hq, d).to(torch.bfloat16)
    no_tree = torch.empty(0, dtype=torch.bool)
    whole = torch.ops.cinq.paged_decode(q, cache, tables, lens, 0.25, ql, no_tree)
    out = torch.full_like(q, float("nan"))
    for begin, end in ((0, 1), (1, 1), (1, 3)):
        torch.ops.cinq.paged_decode_seqs(q, cache, tables, lens, 0.25, ql, no_tree, out, begin, end)
    assert torch.equal(out, whole)
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.cinq.paged_decode_seqs(q, cache, tables, lens, 0.25, ql, no_tree, out, 2, 4)


def test_a_wrong_kernel_argument_is_caught(tiny_llama, tmp_path, monkeypatch):
    # the comparison is sharp: Q4_0's code offset dropped (8 -> 0) in the fused step's specs must fail it
    from cinq.export.gguf import export_gguf
    real = decode_layers._linear_spec

    def broken(mod, linear):
        spec = real(mod, linear)
        if spec is None or mod is None or getattr(linear, "kind", "") != "gguf_q4_0_i8":
            return spec
        t = linear._buffers
        return mod.Linear(mod.INT4_I8, [t["codes"], t["scales"], torch.empty(0, dtype=torch.float16)], [32, 0]), \
            spec[1]
    path = export_gguf(tiny_llama, tmp_path / "m.gguf", "q4_0").path
    eager, _ = generate(path, monkeypatch, fused=False)
    monkeypatch.setattr(decode_layers, "_linear_spec", broken)
    fused, engine = generate(path, monkeypatch, fused=True)
    assert fused_of(engine) is not None and fused_of(engine).steps > 0
    assert fused != eager


def test_forward_hooks_keep_the_python_layers(tiny_llama, monkeypatch):
    from cinq.model.loader import load_model
    model = load_model(tiny_llama, "bfloat16")
    model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert decode_layers.build_decode_layers(model.model) is None


def test_the_real_smollm2_file_is_bit_identical(monkeypatch):
    from cinq.real_models import REAL_MODELS
    smol = REAL_MODELS["smollm2-135m-instruct"]
    if smol.path() is None:
        pytest.skip(f"needs the real model: {smol.install_hint}")
    check_same(smol.path(), monkeypatch, max_tokens=8)


def _gemma3_folder(tmp_path: Path) -> Path:
    from cinq.model.config import ModelConfig
    from cinq.model.byte_tokenizer import save_byte_tokenizer
    from cinq.model.saver import init_random_model, save_model
    from tests.model.test_gemma3 import CFG
    model = init_random_model(ModelConfig.from_dict(CFG), seed=3, std=0.1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.3)
    path = save_model(model, tmp_path / "gemma3")
    save_byte_tokenizer(path)
    return path


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}])
def test_gemma3_stack_is_bit_identical_past_its_window(monkeypatch, tmp_path, spec):
    # Gemma 3's own program: sandwich and q/k norms, a window of 8 on the local layers (the prompts run past it)
    # with their own KV group's tables, GeGLU; greedy tokens and logprobs equal to the Python layers', verify
    # steps of n-gram drafts included
    path = _gemma3_folder(tmp_path)
    looping = [[5, 6, 7, 8] * 4 + [5, 6], [9, 10, 11] * 5 + [9], [12, 13] * 8]  # each drafts from its first step
    program = check_same(path, monkeypatch, max_tokens=16, speculative_config=spec,
                         prompts=looping if spec else PROMPTS)
    assert isinstance(program, decode_layers.GemmaDecodeLayers) and program.num_groups == 2
    # all three requests in one fused step; with drafts, verify steps of one row count each (ragged ones: Python)
    assert program.most_rows > 3 if spec else program.most_rows == 3
    with two_threads("min_attention_split_bytes"):  # each layer's sequences split across the team
        program = check_same(path, monkeypatch, max_tokens=16, speculative_config=spec,
                             prompts=looping if spec else PROMPTS)
        assert program.program.split_attention_calls() > 0


def test_gemma3_decodes_17_sequences_in_its_program(monkeypatch, tmp_path):
    # a step of 17 one-token decodes is not padded to a row bucket (shape_buckets.EXACT_ROWS): a padding sequence of
    # 3 tokens made it ragged, and Gemma's program, one row count per sequence, left every such step to Python
    prompts = [[5 + i % 7, 6, 7, 8 + i % 3] * 2 for i in range(17)]
    program = check_same(_gemma3_folder(tmp_path), monkeypatch, max_tokens=4, prompts=prompts, max_num_seqs=17)
    assert program.most_rows == 17


def test_qwen3_q_k_norms_are_bit_identical(tiny_models, monkeypatch):
    # each head's q and k normed (Llama's norm) before the rotary, in the program as in LlamaAttention
    program = check_same(tiny_models("qwen3"), monkeypatch)
    assert program.max_rows >= 3
