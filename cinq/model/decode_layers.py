"""The decoder stack's decode step in one native call (cinq/kernels/cpu/decode_layers.cpp), for Llama-family stacks
on the CPU in bf16.

At batch 1 a SmolLM2-sized step spent about as long in Python between kernels as in them: each layer makes ~14
Python-level calls (module calls, shape checks, the kernel wrappers) of 5-15 us on a 2-core CPU. ``DecodeLayers``
runs the same kernels (the ``torch.ops.cinq`` ops the eager layers call through their extensions) in the same order
on the same tensors from C++, so its output is bit-identical to the eager layers' (tests/model/test_decode_layers.py
checks this per linear kind). It covers decode steps (every sequence decode-like, speculative verify rows
included, with one row count or ragged: ``AttentionMetadata.ragged_decodes``) of at most ``max_rows`` rows, and layers whose every linear is one of: dense bf16 without autograd, GGUF
Q4_0 / Q4_1 / Q4_K / Q8_0 with int8 activations, cinq's grouped int4 / int8 (no act-order permutation) without bias; it
also returns every layer's input when asked (EAGLE-3's features), so a speculating step is fused too.
Qwen3's q/k norms are covered too. Anything else (prefill chunks, other linears, windows in a Llama stack) runs the Python layers, as
does every step with ``CINQ_FUSED_DECODE=0`` (A/B measurements, debugging). Gemma 3 stacks have a program of their
own (``GemmaDecodeLayers``: sandwich and q/k norms, a window and a KV cache group per layer, GeGLU), for decode
steps of one row count per sequence.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from cinq.kernels.cpu_native import bf16_gemm_is_emulated, native_module, small_m_rows
from cinq.kernels.metadata import AttentionMetadata

log = logging.getLogger(__name__)
ENV = "CINQ_FUSED_DECODE"
_NO_TREE = torch.empty(0, dtype=torch.bool, device="cpu")
_NO_BIAS = torch.empty(0, dtype=torch.float32, device="cpu")
_NO_RESIDUAL = torch.empty(0, dtype=torch.bfloat16, device="cpu")
_NO_STARTS = torch.empty(0, dtype=torch.int32, device="cpu")


def enabled() -> bool:
    """False when ``CINQ_FUSED_DECODE=0`` (read per model build)."""
    return os.environ.get(ENV, "1").strip() != "0"


class DecodeLayers:
    """A built program for one decoder stack: ``run(hidden, positions, meta)`` -> (hidden, residual) when the step
    qualifies, else None (the caller runs its Python layers)."""

    def __init__(self, program: Any, max_rows: int, layers: list[Any], cos_sin: torch.Tensor,
                 normed_input: bool = False) -> None:
        self.program = program
        self.normed_input = normed_input  # run only with a residual, its first input norm skipped (a head)
        self.max_rows = max_rows
        self.cos_sin = cos_sin
        self._first_cache = layers[0].self_attn.attn.kv_cache
        self._first_layer = layers[0]
        self.steps = 0  # decode steps run fused (tests check that the path is taken)
        self.ragged_steps = 0  # of which with ragged rows per sequence
        self.most_rows = 0  # the most rows a fused step took

    def stale(self) -> bool:
        """True when the runner bound new KV caches since the build (the program holds the old ones)."""
        return self._first_layer.self_attn.attn.kv_cache is not self._first_cache

    def run(self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            capture: tuple[int, ...] = (), residual: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None:
        """(hidden, residual, the inputs of the layers ``capture`` names, ascending) after the stack, or None: run
        the Python layers. With ``residual``, ``hidden`` is the first layer's input already normed (an EAGLE-3 head's
        [normed embedding, normed feature]) and ``residual`` its residual: the first input norm is skipped."""
        rows = hidden.shape[0]
        if self.normed_input != (residual is not None):  # a head's program skips its first norm; a stack's does not
            return None
        ragged = meta.num_decodes != meta.num_seqs
        if (hidden.dim() != 2 or rows > self.max_rows or hidden.dtype != torch.bfloat16
                or (ragged and (not meta.ragged_decodes or meta.tree_mask is not None))
                or meta.sliding_window is not None
                or meta.group_block_tables is not None or torch.is_grad_enabled() or torch.compiler.is_compiling()
                or (residual is not None and (capture or residual.dtype != torch.bfloat16
                                              or not residual.is_contiguous() or not hidden.is_contiguous()))):
            return None
        tree = _NO_TREE
        if meta.tree_mask is not None:  # as cpu_native.paged_decode_native passes it
            tm = meta.tree_mask
            tree = (tm[:meta.num_decodes] if tm.dim() == 3 else tm).to(torch.bool).contiguous()
        self.steps += 1
        self.ragged_steps += ragged
        self.most_rows = max(self.most_rows, rows)
        return self.program.run(hidden, _NO_RESIDUAL if residual is None else residual, positions, self.cos_sin,
                                meta.slot_mapping, _int32(meta.block_tables), _int32(meta.seq_lens),
                                meta.decode_query_len, tree, list(capture),
                                _int32(meta.query_start_loc) if ragged else _NO_STARTS, residual is not None)


class GemmaDecodeLayers(DecodeLayers):
    """The program for a Gemma 3 stack: ``run_gemma(hidden, positions, meta)`` -> the residual stream after the
    last layer, or None (the Python layers run). Its layers read their KV group's slots and tables and their own
    window (decode_layers.cpp ``run_gemma``)."""

    def __init__(self, program: Any, max_rows: int, layers: list[Any], num_groups: int) -> None:
        super().__init__(program, max_rows, layers, _NO_TREE)
        self.num_groups = num_groups

    def run_gemma(self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
                  ) -> torch.Tensor | None:
        """The stack's output for a decode step with one row count per sequence (no tree), else None."""
        if (hidden.dim() != 2 or hidden.shape[0] > self.max_rows or hidden.dtype != torch.bfloat16
                or meta.num_decodes != meta.num_seqs or meta.tree_mask is not None or torch.is_grad_enabled()
                or torch.compiler.is_compiling()):
            return None
        groups = range(self.num_groups)
        # as the Attention layer picks them: a group's own tables where the step has them, else the step's
        tables = [meta.group_block_tables[g] if g and meta.group_block_tables is not None else meta.block_tables
                  for g in groups]
        slots = [meta.group_slot_mapping[g] if g and meta.group_block_tables is not None else meta.slot_mapping
                 for g in groups]
        self.steps += 1
        self.most_rows = max(self.most_rows, hidden.shape[0])
        return self.program.run_gemma(hidden, positions, slots, [_int32(t) for t in tables], _int32(meta.seq_lens),
                                      meta.decode_query_len)


def build_gemma_decode_layers(model: Any) -> GemmaDecodeLayers | None:
    """The fused program for a Gemma 3 stack (``Gemma3Model``), or None where a layer is not covered (as
    ``build_decode_layers``). Its norms' float32 scales (1 + w) are taken now: build after the weights load."""
    layers = list(model.layers)
    if not enabled() or not layers or any(_gemma_layer_specs(None, layer) is None for layer in layers):
        return None
    mod, program = _new_program(layers[0])
    if program is None:
        return None
    max_rows = 1 << 30
    for layer in layers:
        linears, rows = _gemma_layer_specs(mod, layer)
        max_rows = min(max_rows, rows)
        a = layer.self_attn
        try:
            program.add_gemma_layer(
                layer.input_layernorm.scale(), layer.post_attention_layernorm.scale(),
                layer.pre_feedforward_layernorm.scale(), layer.post_feedforward_layernorm.scale(), a.q_norm.scale(),
                a.k_norm.scale(), a.attn.kv_cache, a.rotary_emb.cos_sin(a.attn.kv_cache.device, torch.bfloat16),
                a.attn.sliding_window or 0, a.attn.kv_group, *linears)
        except RuntimeError as e:  # a layout the program refuses (its checks name it): the Python layers run
            log.info("fused decode step not used: %s", str(e).splitlines()[0])
            return None
    if bf16_gemm_is_emulated():
        program.set_dense_chunk_rows(small_m_rows())
    return GemmaDecodeLayers(program, max_rows, layers, 1 + max(layer.self_attn.attn.kv_group for layer in layers))


def _new_program(first: Any) -> tuple[Any, Any]:
    """(the extension, an empty program shaped like ``first``'s layer), or (None, None) without the extension."""
    mod = native_module("decode_layers")
    if mod is None:
        return None, None
    from cinq.kernels import custom_ops  # noqa: F401  (loads the extensions that register torch.ops.cinq.*)
    attn = first.self_attn
    return mod, mod.DecodeLayers(attn.num_heads, attn.num_kv_heads, attn.head_dim, first.mlp.intermediate_size,
                                 float(first.post_attention_layernorm.eps), float(attn.attn.scale))


def _gemma_layer_specs(mod: Any, layer: Any) -> tuple[list[Any], int] | None:
    """A Gemma 3 layer's four linears as the program's Linear specs and the most rows they take, or None."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or type(layer).__name__ != "Gemma3DecoderLayer":
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
             layer.post_feedforward_layernorm, attn.q_norm, attn.k_norm)
    if (getattr(attn, "qkv_proj", None) is None or getattr(mlp, "gate_up_proj", None) is None
            or attn.attn.kv_cache is None or attn.attn.backend.name != "sdpa" or mlp.act != "gelu_pytorch_tanh"
            or _has_hooks(layer) or attn.attn.kv_cache.dtype != torch.bfloat16 or not attn.attn.kv_cache.is_cpu
            or any(type(n).__name__ != "GemmaRMSNorm" for n in norms)):
        return None
    return _four_linears(mod, attn, mlp)


def set_fused_decode(model: torch.nn.Module, on: bool) -> int:
    """Turn the fused step of every decoder stack in ``model`` on (built again at the next step) or off (the Python
    layers, e.g. for per-layer instrumentation, whose hooks the program would skip); returns the fused steps run so
    far."""
    steps = 0
    for m in model.modules():
        if hasattr(m, "_decode_layers"):
            if isinstance(m._decode_layers, DecodeLayers):
                steps += m._decode_layers.steps
            m._decode_layers = False if on else None
    return steps


def build_decode_layers(model: Any, normed_input: bool = False) -> DecodeLayers | None:
    """The fused program for ``model`` (a LlamaModel-like stack: ``layers`` of LlamaDecoderLayer), or None when a
    layer is not covered, the kernels are unavailable, or ``CINQ_FUSED_DECODE=0``. Call after the KV caches are
    bound. ``normed_input``: the program is only run on normed first inputs (``DecodeLayers.run`` with a
    residual: an EAGLE head's layer), so the first layer's input norm may also be the identity."""
    layers = list(model.layers)
    # cheap checks before the extension
    if not enabled() or not layers or _layer_specs(None, layers[0], normed_input) is None:
        return None
    mod, program = _new_program(layers[0])
    if program is None:
        return None
    first, attn = layers[0], layers[0].self_attn
    max_rows = 1 << 30
    for i, layer in enumerate(layers):
        specs = _layer_specs(mod, layer, normed_input and i == 0)
        if specs is None:
            return None
        linears, rows = specs
        max_rows = min(max_rows, rows)
        in_norm = getattr(layer.input_layernorm, "weight", None)
        try:
            a = layer.self_attn
            qk = (a.q_norm.weight.detach(), a.k_norm.weight.detach()) if a.q_norm is not None else \
                (_NO_RESIDUAL, _NO_RESIDUAL)
            program.add_layer(_NO_RESIDUAL if in_norm is None else in_norm.detach(),
                              layer.post_attention_layernorm.weight.detach(), a.attn.kv_cache, *linears, *qk)
        except RuntimeError as e:  # a layout the program refuses (its checks name it): the Python layers run
            log.info("fused decode step not used: %s", str(e).splitlines()[0])
            return None
    if bf16_gemm_is_emulated():  # as the Python layers: past small_m_rows(), the kernel on chunks of them
        program.set_dense_chunk_rows(small_m_rows())
    cos_sin = attn.rotary_emb.cos_sin(first.post_attention_layernorm.weight.device, torch.bfloat16)
    return DecodeLayers(program, max_rows, layers, cos_sin, normed_input)


def _layer_specs(mod: Any, layer: Any, normed_input: bool = False) -> tuple[list[Any], int] | None:
    """The layer's four linears as the program's Linear specs and the most rows they take, or None.
    ``normed_input``: the program skips this layer's input norm, which may then be the identity."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or type(layer).__name__ != "LlamaDecoderLayer":
        return None
    in_norm = type(layer.input_layernorm).__name__
    if (getattr(attn, "qkv_proj", None) is None or getattr(mlp, "gate_up_proj", None) is None
            or (attn.q_norm is not None and not _bf16_norms(attn.q_norm, attn.k_norm))
            or attn.attn.sliding_window is not None or attn.attn.kv_cache is None
            or attn.attn.backend.name != "sdpa" or mlp.act != "silu" or _has_hooks(layer)
            or attn.attn.kv_cache.dtype != torch.bfloat16 or not attn.attn.kv_cache.is_cpu
            or layer.post_attention_layernorm.weight.dtype != torch.bfloat16
            or not (in_norm == "RMSNorm" or (normed_input and in_norm == "Identity"))
            or type(layer.post_attention_layernorm).__name__ != "RMSNorm"):
        return None
    return _four_linears(mod, attn, mlp)


def _bf16_norms(*norms: Any) -> bool:
    """True when every norm is Llama's RMSNorm with a bf16 weight (the native kernel's domain)."""
    return all(type(n).__name__ == "RMSNorm" and n.weight.dtype == torch.bfloat16 for n in norms)


def _four_linears(mod: Any, attn: Any, mlp: Any) -> tuple[list[Any], int] | None:
    """A layer's qkv, o, gate_up and down as the program's Linear specs and the most rows all take, or None."""
    specs, rows = [], 1 << 30
    for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
        spec = _linear_spec(mod, linear)
        if spec is None:
            return None
        specs.append(spec[0])
        rows = min(rows, spec[1])
    return specs, rows


def _linear_spec(mod: Any, linear: Any) -> tuple[Any, int] | None:
    """(the program's Linear, the most rows the eager layer sends to the same kernel) for one linear, or None.
    With ``mod`` None only whether the linear is covered is decided (the Linear is None)."""
    if mod is None:
        mod = _CoverageOnly()
    from cinq.layers.linear import DenseLinear
    from cinq.layers.quantization.gguf_linear import DEQUANT_ROWS, Q8_DEQUANT_ROWS, GGUFLinear
    from cinq.layers.quantization.int8_activations import uses_int8_activations
    from cinq.layers.quantization.linear import QuantizedLinear
    from cinq.layers.quantization.native import I8_DEQUANT_ROWS, INT4_NATIVE_MAX_ROWS, NATIVE_MAX_ROWS
    from cinq.kernels.prefill_gemm import DENSE_MIN_ROWS

    if getattr(linear, "split", None) is not None:  # tensor parallelism: its collectives are not in the program
        return None
    if type(linear) is DenseLinear:
        w = linear.weight
        if w.dtype != torch.bfloat16 or not w.is_contiguous() or not w.is_cpu or small_m_rows() < 1:
            return None
        b = linear.bias
        if b is not None:
            if b.dtype not in (torch.bfloat16, torch.float32) or not b.is_contiguous():
                return None
            b = b.detach()
        # where the bf16 GEMM is emulated the Python layers chunk up to the float32 path's first row count, and
        # so does the program (a verify of 2+ drafts at batch 4 passes 8 rows: the Python layers took it at 2-3x
        # the cost of a plain step); elsewhere they switch to oneDNN past small_m_rows(), and the program stops
        rows = DENSE_MIN_ROWS - 1 if bf16_gemm_is_emulated() else small_m_rows()
        return mod.Linear(mod.DENSE, [w.detach(), _NO_BIAS if b is None else b], []), rows
    if not isinstance(linear, QuantizedLinear) or linear.bias is not None:
        return None
    t, kind, group = linear._buffers, linear.kind, linear.group
    half = torch.empty(0, dtype=torch.float16)
    if type(linear) is GGUFLinear:
        if kind == "gguf_q8_0_i8":
            return mod.Linear(mod.INT8_I8, [t["codes"], t["scales"], t.get("mins", half)], [group]), Q8_DEQUANT_ROWS - 1
        if kind in ("gguf_q4_0_i8", "gguf_q4_1_i8", "gguf_q4_k_i8"):
            return (mod.Linear(mod.INT4_I8, [t["codes"], t["scales"], t.get("mins", half)],
                               [group, 8 if kind == "gguf_q4_0_i8" else 0]), DEQUANT_ROWS - 1)
        return None
    if kind not in ("int4_native", "int8_native") or "perm" in t:
        return None
    f32 = torch.empty(0)
    mins = t.get("mins", torch.empty(0, dtype=t["scales"].dtype))
    # as native._grouped_linear routes them: the int8-activation kernel (uses_int8_activations) below
    # I8_DEQUANT_ROWS, else the int16-activation one up to its own rows
    int4 = kind == "int4_native"
    if uses_int8_activations(group, 4 if int4 else 8):
        spec = mod.Linear(mod.INT4_I8, [t["codes"], t["scales"], mins], [group, 0]) if int4 else \
            mod.Linear(mod.INT8_I8, [t["codes"], t["scales"], mins], [group])
        return spec, I8_DEQUANT_ROWS - 1
    spec = mod.Linear(mod.INT4_AFFINE, [t["codes"], t["scales"], t["mins"]], [group]) if int4 \
        else mod.Linear(mod.INT8_GROUPED, [t["codes"], t["scales"], t.get("mins", f32)], [group])
    return spec, INT4_NATIVE_MAX_ROWS if int4 else NATIVE_MAX_ROWS


class _CoverageOnly:
    """Stands in for the extension while only coverage is checked: its Linear builds nothing."""

    DENSE = INT4_I8 = INT8_I8 = INT4_AFFINE = INT8_GROUPED = 0

    @staticmethod
    def Linear(*_: Any) -> None:  # noqa: N802  (the extension's class name)
        return None


def _has_hooks(layer: torch.nn.Module) -> bool:
    """True when a module of ``layer`` has forward hooks (instrumentation, collectives): the program skips them."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules())


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()
