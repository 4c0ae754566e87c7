"""EAGLE-3 heads in vLLM's / SpecForge's layout with a reduced draft vocabulary: the draft logits live only on
the draft tokens, the paged forward equals the training one, cinq's folders round-trip, and a folder written by
an independent writer (plain safetensors + json, SpecForge's tensor names) loads and computes what its weights
say."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.kernels.metadata import AttentionMetadata
from cinq.spec.eagle import load_eagle_head, save_eagle_head
from cinq.spec.eagle3 import Eagle3Head, new_eagle3_head
from cinq.spec.eagle_unroll import unroll
from tests.spec.random_target import random_target

DRAFT = torch.tensor([0, 3, 4, 10, 20, 33, 50, 96])  # 8 of the random target's 97 tokens


def test_draft_logits_cover_only_the_draft_vocabulary() -> None:
    target = random_target()
    head = new_eagle3_head(target, DRAFT, seed=1)
    assert isinstance(head, Eagle3Head) and head.draft_vocab_size == 8
    # the LM head starts from the target's rows of those tokens
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[DRAFT])
    normed = torch.randn(5, 64)
    full = head.compute_logits(normed)
    assert full.shape == (5, 97)
    outside = torch.ones(97, dtype=torch.bool)
    outside[DRAFT] = False
    assert torch.isinf(full[:, outside]).all() and torch.isfinite(full[:, DRAFT]).all()
    assert torch.allclose(full[:, DRAFT], head.draft_logits(normed))
    assert set(full.argmax(-1).tolist()) <= set(DRAFT.tolist())


@pytest.mark.parametrize("bad", [torch.tensor([1, 1, 2]), torch.tensor([0, 97]), torch.tensor([], dtype=torch.long)])
def test_a_bad_draft_vocabulary_is_refused(bad: torch.Tensor) -> None:
    with pytest.raises(InvalidParameterError) as e:
        new_eagle3_head(random_target(), bad)
    assert e.value.param == "draft_vocab_size"


def test_paged_forward_equals_the_training_forward() -> None:
    target = random_target()
    head = new_eagle3_head(target, DRAFT, seed=3)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    ids = torch.randint(0, 97, (10,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, states = target.forward_with_hidden_states(ids[None])
        feats = head.fuse([states[i][0, :9] for i in head.feature_layers])
        plain = head(ids[1:][None], feats[None], torch.arange(9)[None], None)
        head.attention_layers()[0].kv_cache = torch.full((2, 4, 4, 2, 16), float("nan"))
        got = []
        for start, end in ((0, 6), (6, 7), (7, 9)):  # a chunked prefill, then decodes
            meta = AttentionMetadata.from_lens([end - start], [end], [[2, 0, 3]], 4)
            got.append(head(ids[1 + start:1 + end], feats[start:end], torch.arange(start, end), meta))
    for which in (0, 1):
        assert torch.allclose(torch.cat([g[which] for g in got]), plain[which][0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_in_vllms_layout(dtype: torch.dtype, tmp_path) -> None:
    target = random_target()
    head = new_eagle3_head(target, DRAFT, seed=1).to(dtype)
    save_eagle_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 8
    assert cfg["target_hidden_size"] == 64 and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(head.feature_layers)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert tuple(f.get_slice("fc.weight").get_shape()) == (64, 3 * 64)
        assert tuple(f.get_slice("layers.0.self_attn.q_proj.weight").get_shape()) == (64, 2 * 64)
        assert tuple(f.get_slice("lm_head.weight").get_shape()) == (8, 64)
        assert torch.equal(f.get_tensor("d2t") + torch.arange(8), DRAFT)
        assert f.get_tensor("t2d").sum() == 8
    served = random_target().to(dtype)
    loaded = load_eagle_head(tmp_path, served, dtype, "cpu", "sdpa")
    assert isinstance(loaded, Eagle3Head) and torch.equal(loaded.draft_ids, DRAFT)
    mine, theirs = head.state_dict(), loaded.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _write_specforge_folder(path, target, draft: torch.Tensor, layers: list[int], gen: torch.Generator
                            ) -> dict[str, torch.Tensor]:
    """An EAGLE-3 folder as SpecForge writes one (``midlayer.*``, d2t offsets, t2d mask, an embedding copy, no
    cinq keys), with random weights; returns the tensors."""
    h, v, n, inter = 64, 97, len(draft), 96

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft] = True
    tensors = {
        "fc.weight": w(h, 3 * h), "midlayer.input_layernorm.weight": 1 + w(h), "midlayer.hidden_norm.weight": 1 + w(h),
        "midlayer.self_attn.q_proj.weight": w(4 * 16, 2 * h), "midlayer.self_attn.k_proj.weight": w(2 * 16, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(2 * 16, 2 * h), "midlayer.self_attn.o_proj.weight": w(h, 4 * 16),
        "midlayer.post_attention_layernorm.weight": 1 + w(h), "midlayer.mlp.gate_proj.weight": w(inter, h),
        "midlayer.mlp.up_proj.weight": w(inter, h), "midlayer.mlp.down_proj.weight": w(h, inter),
        "norm.weight": 1 + w(h), "lm_head.weight": w(n, h), "d2t": draft - torch.arange(n), "t2d": t2d,
        "embed_tokens.weight": target.model.embed_tokens.weight.clone(),
    }
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 128, "rope_theta": 10000.0,
        "vocab_size": v, "draft_vocab_size": n, "target_hidden_size": h, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}))
    return tensors


def _reference_step(t: dict[str, torch.Tensor], embeds: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """vLLM's EAGLE-3 step written out from the tensors (one position, so attention is the value itself)."""
    e = _rms(embeds, t["midlayer.input_layernorm.weight"])
    f = _rms(feature, t["midlayer.hidden_norm.weight"])
    x = torch.cat([e, f], -1)
    v = x @ t["midlayer.self_attn.v_proj.weight"].T  # softmax over one key is 1: attention returns v
    attn = v.view(2, 16).repeat_interleave(2, 0).flatten() @ t["midlayer.self_attn.o_proj.weight"].T
    residual = feature + attn
    m = _rms(residual, t["midlayer.post_attention_layernorm.weight"])
    mlp = (F.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T)) \
        @ t["midlayer.mlp.down_proj.weight"].T
    return _rms(mlp + residual, t["norm.weight"]) @ t["lm_head.weight"].T


def test_a_folder_from_an_independent_writer_loads_and_computes_its_weights(tmp_path) -> None:
    target = random_target()
    draft = torch.tensor([1, 2, 5, 8, 13, 21, 34, 55, 89])
    tensors = _write_specforge_folder(tmp_path, target, draft, [0, 1, 2], torch.Generator().manual_seed(4))
    head = load_eagle_head(tmp_path, target, torch.float32, "cpu", "sdpa")
    assert isinstance(head, Eagle3Head) and head.feature_layers == (0, 1, 2)
    assert torch.equal(head.draft_ids, draft)
    ids = torch.tensor([[7, 11]])
    with torch.no_grad():
        _, states = target.forward_with_hidden_states(ids)
        feature = head.fuse([states[i][0, :1] for i in head.feature_layers])
        assert torch.allclose(feature, torch.cat([states[i][0, :1] for i in (0, 1, 2)], -1) @ tensors["fc.weight"].T)
        _, normed = head(ids[:, 1:], feature[None], torch.tensor([[0]]), None)
        logits = head.compute_logits(normed)[0, 0]
        expect = _reference_step(tensors, target.model.embed_tokens.weight[11], feature[0])
    assert torch.allclose(logits[draft], expect, atol=1e-4, rtol=1e-4)
    assert int(logits.argmax()) == int(draft[expect.argmax()])


def test_a_folder_for_another_target_is_refused(tmp_path) -> None:
    _write_specforge_folder(tmp_path, random_target(), DRAFT, [0, 1, 2], torch.Generator().manual_seed(0))
    with pytest.raises(InvalidParameterError) as e:
        load_eagle_head(tmp_path, random_target(vocab_size=101), torch.float32, "cpu", "sdpa")
    assert "vocab_size" in str(e.value)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["draft_vocab_size"] = 7  # d2t holds 8
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="d2t"):
        load_eagle_head(tmp_path, random_target(), torch.float32, "cpu", "sdpa")


def test_training_time_test_unrolls_the_vllm_layout() -> None:
    target = random_target()
    head = new_eagle3_head(target, DRAFT, seed=2)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    _, states = target.forward_with_hidden_states(ids)
    feats = head.fuse([states[i] for i in head.feature_layers])[:, :-1]
    steps = unroll(head, ids[:, 1:], feats, 3)
    assert len(steps) == 3 and all(n.shape == (2, 8, 64) for _, n in steps)
    # step 0 is the teacher-forced forward
    assert torch.allclose(steps[0][1], head(ids[:, 1:], feats, torch.arange(8).expand(2, 8), None)[1], atol=1e-5)
    loss = sum(head.draft_logits(n).logsumexp(-1).mean() for _, n in steps)
    loss.backward()
    assert head.fc.weight.grad is not None and head.lm_head.weight.grad is not None



def _head_calls(tiny_llama, folder, method: str, monkeypatch: pytest.MonkeyPatch, fused: bool,
                tree: bool = False) -> tuple[list, object]:
    """Every call of the head in a bf16 engine (3 greedy requests, k = 3, prompt lookup first; or EAGLE-2's
    dynamic tree, whose levels attend with tree masks): its inputs' row count, decode-like sequences and
    outputs."""
    from cinq import LLM, SamplingParams
    from cinq.model import decode_layers
    monkeypatch.setenv(decode_layers.ENV, "1" if fused else "0")
    drafting = {"tree_topk": 2, "tree_depth": 3} if tree else {"prompt_lookup_max": 3}
    llm = LLM(str(tiny_llama), dtype="bfloat16", max_num_seqs=3, num_kv_blocks=64, seed=0,
              speculative_config={"method": method, "model": str(folder), "num_speculative_tokens": 3,
                                  **drafting})
    head = llm.engine.executor.proposer.head
    calls, real = [], head.forward

    def forward(token_ids, feature, positions, meta):  # noqa: ANN001, ANN202
        out = real(token_ids, feature, positions, meta)
        calls.append((token_ids.shape[0], meta.num_decodes if meta is not None else -1, *out))
        return out

    head.forward = forward
    prompts = [list(range(5 + 7 * i, 12 + 10 * i)) for i in range(3)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    return calls, head


@pytest.mark.parametrize("layout, tree", [("vllm-eagle3", False), ("eagle3", False), ("eagle", False),
                                          ("vllm-eagle3", True)])
def test_the_heads_fused_layer_is_bit_identical_to_its_python_layer(tiny_llama, tmp_path, monkeypatch,
                                                                    layout: str, tree: bool) -> None:
    # In bf16 on the CPU a head's decoder layer runs as the fused decode program (cinq/model/decode_layers.py,
    # its first input norm skipped: the head norms and concatenates its inputs itself). Its outputs must equal
    # the Python layer's to the bit in every call: one-row draft steps, and catch-ups over the positions the
    # target kept, several rows each, ragged when requests accepted different numbers of drafts (decode-like
    # batches, so those take the program too).
    from cinq.kernels.cpu_native import native_module
    from cinq.model.loader import load_model
    from cinq.spec.eagle import new_eagle_head
    if native_module("decode_layers") is None:
        pytest.skip("no native CPU kernels here")
    torch.manual_seed(0)
    target = load_model(tiny_llama, torch.float32)
    if layout == "vllm-eagle3":
        head = new_eagle3_head(target, torch.arange(0, target.config.vocab_size, 2), seed=1)
    else:
        head = new_eagle_head(target, layout, seed=1)
    with torch.no_grad():  # confident guesses: some drafts are accepted, so catch-ups have several rows
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    folder = save_eagle_head(head, tmp_path / "head")
    method = "eagle" if layout == "eagle" else "eagle3"
    eager, eager_head = _head_calls(tiny_llama, folder, method, monkeypatch, fused=False, tree=tree)
    fused, fused_head = _head_calls(tiny_llama, folder, method, monkeypatch, fused=True, tree=tree)
    assert eager_head.decode_layer() is None
    program = fused_head.decode_layer()
    assert program is not None
    assert len(fused) == len(eager)
    for (rows, nd, prenorm, normed), (rows_e, nd_e, prenorm_e, normed_e) in zip(fused, eager):
        assert (rows, nd) == (rows_e, nd_e)
        assert torch.equal(prenorm, prenorm_e) and torch.equal(normed, normed_e)
    # the program ran every head call within its rows (32: the first catch-up, over a prompt, too) but a tree level
    # with rows per request that differ (its tree masks take one row count per request), which runs the Python
    # layer; up to 32 rows no step is padded to a bucket any more (shape_buckets.EXACT_ROWS), and the padding was
    # what made this test's tree levels uneven: now every call takes the program
    taken = sum(rows <= program.max_rows and not (tree and rows % nd) for rows, nd, *_ in fused)
    assert program.steps == taken == len(fused)


def test_the_heads_fused_layer_takes_ragged_catch_ups_bit_identically(tiny_llama) -> None:
    # A catch-up covers each request's positions since its last draft: rows per request differ (ragged) or agree
    # (several rows each). Both are decode-like batches the program takes; same bits as the Python layer, on the
    # same KV pages (a few of the engine test's random drafts are accepted, so it sees few such steps).
    from cinq.kernels.cpu_native import native_module
    from cinq.model.loader import load_model
    from cinq.spec.proposer import bind_paged_kv
    from cinq.step.batch_inputs import build_batch
    from cinq.step.scheduler_output import ScheduledSeq
    if native_module("decode_layers") is None:
        pytest.skip("no native CPU kernels here")
    torch.manual_seed(0)
    target = load_model(tiny_llama, torch.float32)
    head = new_eagle3_head(target, torch.arange(0, target.config.vocab_size, 2), seed=1).to(torch.bfloat16).eval()
    cfg = head.config
    bind_paged_kv(head.attention_layers(), cfg.num_key_value_heads, cfg.head_dim, 8, 16, torch.bfloat16,
                  torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)

    def step(rows: list[int], start: int, decode_like: bool) -> tuple[object, tuple[torch.Tensor, ...]]:
        seqs = [ScheduledSeq(f"r{i}", torch.randint(0, 97, (n,), generator=gen).tolist(), start, [i],
                             n if decode_like else 1) for i, n in enumerate(rows)]
        batch = build_batch(seqs, 16, [7], torch.device("cpu"))
        feature = torch.randn(batch.input_ids.shape[0], cfg.hidden_size, generator=gen).to(torch.bfloat16)
        with torch.inference_mode():
            head._decode_layers = False  # built at the next call: the program
            fused = head(batch.input_ids, feature, batch.positions, batch.meta)
            program = head._decode_layers
            head._decode_layers = None  # the Python layer
            eager = head(batch.input_ids, feature, batch.positions, batch.meta)
        for a, b in zip(fused, eager):
            assert torch.equal(a, b)
        return program, batch.meta

    step([8, 8, 8], 0, decode_like=False)  # the prompts' KV (a prefill batch: the Python layer both times)
    program, meta = step([3, 1, 2], 8, decode_like=True)
    assert meta.ragged_decodes and program.steps == program.ragged_steps == 1 and program.most_rows == 6
    # a head's program skips its first norm: a call without the residual (a stack's call) is refused
    x = torch.zeros(6, 2 * cfg.hidden_size, dtype=torch.bfloat16)
    assert program.run(x, torch.arange(8, 14), meta) is None and program.steps == 1
    program, meta = step([2, 2, 2], 11, decode_like=True)
    assert meta.num_decodes == 3 and meta.decode_query_len == 2 and program.steps == 1
    assert program.ragged_steps == 0


@pytest.mark.parametrize("tree", [{"tree_topk": 2, "tree_depth": 3},
                                  {"speculative_token_tree": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}])
def test_draft_vocabulary_trees_with_prompt_lookup_first_keep_greedy_output(tiny_llama, tmp_path, tree) -> None:
    """A head with a draft vocabulary ranks its tree nodes over those columns (cinq/spec/eagle_tree.py); with
    prompt lookup first, requests whose tokens repeat verify their copy as a chain in the same steps as the
    others' trees. Greedy output equals plain decoding's in float32, and both kinds of drafts ran."""
    from cinq import LLM, SamplingParams
    from cinq.model.loader import load_model
    target = load_model(tiny_llama, torch.float32)
    head = new_eagle3_head(target, torch.arange(0, target.config.vocab_size, 2), seed=1)
    with torch.no_grad():  # confident guesses: some drafts are accepted
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    folder = save_eagle_head(head, tmp_path / "head")
    prompts = ["abcabcabcabc", "hello hello hello", "xyz", "q", "the cat and the cat and"]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), dtype="float32").generate(prompts, params)]
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config={
        "method": "eagle3", "model": str(folder), "num_speculative_tokens": 6, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1, **tree})
    proposer, chains, trees = llm.engine.executor.proposer, [], []
    real = proposer.propose

    def spy(seqs, history, sampling):  # noqa: ANN001, ANN202
        out = real(seqs, history, sampling)
        trees.extend(out.parents)
        chains.extend(s.request_id for s in seqs if s.num_logit_rows > 1 and not s.num_draft_slots)  # copies
        return out

    proposer.propose = spy
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    assert trees and chains
    st = llm.engine.get_stats()
    assert st.spec_decode_num_accepted_tokens > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
