"""The compiled decode step (compilation_config): taken for plain decode steps of a compile size (padded up to
it), eager for everything else, and the same greedy tokens as eager."""

from __future__ import annotations

import pytest
import torch

from cinq.config import EngineConfig
from cinq.engine.engine import LLMEngine
from cinq.sampling_params import SamplingParams

PROMPTS = [list(range(5, 5 + n)) for n in (7, 19, 33)]  # three lengths: prefills of 1-3 chunks, then decodes


def generate(model, compilation: dict | None, dtype: str = "bfloat16", max_tokens: int = 12, **kw):
    engine = LLMEngine(EngineConfig(model=str(model), dtype=dtype, num_kv_blocks=64, seed=0, max_num_seqs=4,
                                    max_num_batched_tokens=32, compilation_config=compilation, **kw))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    return tokens, engine.executor.runner.compiled


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


# bf16: the native kernels as C++-registered ops; float32: the PyTorch paths. Backend "eager" runs the model's own
# code over the persistent buffers (the path a CUDA graph captures); "aot_eager" traces it into one graph.
@pytest.mark.parametrize("backend, dtype", [("aot_eager", "bfloat16"), ("aot_eager", "float32"),
                                            ("eager", "float32")])
def test_step_over_persistent_buffers_is_taken_padded_and_gives_the_eager_tokens(tiny_llama, backend, dtype):
    eager, none = generate(tiny_llama, None, dtype)
    assert none is None
    # sizes 1 and 4: steps of 3 decodes pad to 4, steps of 2 too; batch 1 runs its own size
    tokens, compiled = generate(tiny_llama, {"mode": 3, "backend": backend, "compile_sizes": [1, 4]}, dtype)
    assert sorted(compiled.compile_times_s) == [1, 4] and not compiled.failed
    assert sorted(compiled.buffers) == [1, 4]  # the inputs every step of a size was written into
    assert compiled.steps >= 11  # every decode step of the last prompt (its first token came with its prefill)
    assert tokens == eager
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # one graph per size: no recompiles


def test_the_warm_up_step_runs_the_python_layers(tiny_llama, monkeypatch):
    # the fused eager step reads one rope table for the whole stack: had it run the warm-up step, the other layers'
    # tables would be traced empty and built by the compiled graph (sin and cos of every position) on every step
    from cinq.model import decode_layers
    runs = []
    real = decode_layers.DecodeLayers.run
    monkeypatch.setattr(decode_layers.DecodeLayers, "run", lambda self, *a, **k: runs.append(1) or real(self, *a, **k))
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_kv_blocks=64, seed=0,
                                    compilation_config={"mode": 3, "backend": "aot_eager", "compile_sizes": [1]}))
    assert list(engine.executor.runner.compiled.compile_times_s) == [1] and not runs  # compiled at start-up
    tables = [layer.self_attn.rotary_emb._cache for layer in engine.executor.runner.compiled.model.model.layers]
    assert all((torch.device("cpu"), torch.bfloat16) in t for t in tables)
    engine.add_request("r", PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # the prefill, eager: the fused step is built again for the steps that are not compiled
    assert engine.executor.runner.model.model._decode_layers is not None


def test_enforce_eager_and_sizes_past_max_num_seqs(tiny_llama):
    _, compiled = generate(tiny_llama, {"mode": 3, "backend": "eager"}, max_tokens=2, enforce_eager=True)
    assert compiled is None
    _, compiled = generate(tiny_llama, {"mode": 3, "backend": "eager", "compile_sizes": [2, 8, 16]}, max_tokens=2)
    assert compiled.config.compile_sizes == [2]  # max_num_seqs 4: larger sizes are never used


def test_steps_past_the_largest_size_run_eager(tiny_llama):
    tokens, compiled = generate(tiny_llama, {"mode": 3, "backend": "aot_eager", "compile_sizes": [1]})
    eager, _ = generate(tiny_llama, None)
    assert tokens == eager
    # only the last request's final decodes run alone; every step with 2-3 decodes was eager
    assert 0 < compiled.steps < 12


def test_a_size_that_fails_to_compile_runs_eager(tiny_llama, monkeypatch, caplog):
    # a compiler error (inductor's C++ build, a capture) at one size: logged, that size's steps run eager, the
    # other sizes stay compiled, and the tokens are eager's
    from cinq.engine.compiled_decode import CompiledDecode
    real = CompiledDecode._call

    def failing_call(self, size):
        if size == 4 and size not in self.compile_times_s:
            raise RuntimeError("simulated compiler error\nits long log")
        return real(self, size)

    eager, _ = generate(tiny_llama, None, "float32")
    monkeypatch.setattr(CompiledDecode, "_call", failing_call)
    with caplog.at_level("WARNING", logger="cinq.engine.compiled_decode"):
        tokens, compiled = generate(tiny_llama, {"mode": 3, "backend": "aot_eager", "compile_sizes": [1, 4]},
                                    "float32")
    assert compiled.failed == {4} and sorted(compiled.compile_times_s) == [1] and compiled.steps > 0
    assert tokens == eager
    assert "torch.compile of the decode step at batch size 4 failed (simulated compiler error); it runs eager" \
        in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("dtype, options", [("bfloat16", {}), ("float32", {}), ("bfloat16", {"cpp_wrapper": True})])
def test_inductor_step_gives_the_eager_tokens(tiny_llama, dtype, options):
    eager, _ = generate(tiny_llama, None, dtype, max_tokens=24)
    tokens, compiled = generate(tiny_llama, {"mode": 3, "backend": "inductor", "compile_sizes": [1, 4],
                                             "inductor_compile_config": options}, dtype, max_tokens=24)
    assert sorted(compiled.compile_times_s) == [1, 4] and compiled.steps > 0
    assert tokens == eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (scripts/gpu_check.sh runs this)")
def test_cuda_graph_step_gives_the_eager_tokens(tiny_llama):
    eager, _ = generate(tiny_llama, None, "float32", device="cuda")
    tokens, captured = generate(tiny_llama, {"mode": 3, "compile_sizes": [1, 4]}, "float32", device="cuda")
    assert captured.graphs and sorted(captured.compile_times_s) == [1, 4] and not captured.failed
    assert captured.steps >= 11
    assert tokens == eager


def test_inductor_cache_dir_is_under_the_cinq_cache_unless_the_user_chose_one(monkeypatch, tmp_path):
    from cinq.engine.compiled_decode import inductor_cache_dir

    monkeypatch.setenv("CINQ_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert inductor_cache_dir() == tmp_path / "inductor" / f"torch-{torch.__version__}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"
