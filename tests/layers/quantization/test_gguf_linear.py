"""GGUF Q8_0 / Q4_0 / Q4_1 blocks: decoded values equal the gguf package's reference dequantization (float32, bit
for bit but for the sign of zero), and ``GGUFLinear`` computes x W^T with them, merged shards included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cinq.layers.quantization.gguf_blocks import NATIVE_TYPES, decode_blocks, q5_0_as_q8_0
from cinq.layers.quantization.gguf_linear import GGUFLinear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards

gguf_quants = pytest.importorskip("gguf.quants")
from gguf.constants import GGMLQuantizationType  # noqa: E402


def _blocks(w: np.ndarray, kind: str) -> np.ndarray:
    return gguf_quants.quantize(w.astype(np.float32), GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", NATIVE_TYPES)
def test_decoded_values_equal_the_reference_dequantization(kind: str):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((13, 96)).astype(np.float32) * rng.uniform(0.01, 2.0, (13, 1)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block: scale 0
    w[5, 32:64] = 1.0  # a constant block: Q4_1's minimum carries it
    q = _blocks(w, kind)
    ref = gguf_quants.dequantize(q, GGMLQuantizationType[kind])
    mine = decode_blocks(torch.from_numpy(q.copy()), kind).dequantize().numpy()
    assert mine.dtype == np.float32 and np.array_equal(mine, ref)  # equal values (+0.0 == -0.0)
    nonzero = mine != 0
    assert np.array_equal(mine.view(np.uint32)[nonzero], ref.view(np.uint32)[nonzero])


def test_q5_0_blocks_rewritten_as_q8_0_keep_their_values():
    # every fifth bit set and clear (bit 31 too: the high word read as a signed int), every nibble
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, (9, 4, 22), dtype=np.uint8)
    raw[..., 0:2] = np.frombuffer(np.float16(0.0123).tobytes(), np.uint8)
    raw[0, 0, 2:6], raw[1, 0, 2:6] = 0xFF, 0x00
    raw = raw.reshape(9, -1)
    as_q8 = q5_0_as_q8_0(torch.from_numpy(raw.copy()))
    assert as_q8.shape == (9, 4 * 34)
    ref = gguf_quants.dequantize(raw, GGMLQuantizationType.Q5_0)
    assert np.array_equal(decode_blocks(as_q8, "Q8_0").dequantize().numpy(), ref)


def test_a_wrong_nibble_order_is_caught():
    """The decoder's own check: swapping the halves of each byte (values j and j + 16) changes the values."""
    w = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    q = _blocks(w, "Q4_0")
    swapped = q.copy()
    swapped[:, 2:18] = (q[:, 2:18] >> 4) | ((q[:, 2:18] & 0x0F) << 4)
    ref = gguf_quants.dequantize(q, GGMLQuantizationType.Q4_0)
    assert not np.array_equal(decode_blocks(torch.from_numpy(swapped), "Q4_0").dequantize().numpy(), ref)


@pytest.mark.parametrize("kind", NATIVE_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_linear_merged_shards_compute_x_w_transposed(kind: str, dtype: torch.dtype):
    rng = np.random.default_rng(3)
    sizes = {"q": 64, "k": 32, "v": 32}
    shards = OutputShards(tuple(sizes), tuple(sizes.values()))
    layer = GGUFLinear(128, 128, False, kind, "model.layers.0.self_attn.qkv_proj", compute_dtype=dtype,
                       output_shards=shards)
    refs = []
    for shard, n in sizes.items():
        q = _blocks(rng.standard_normal((n, 128)).astype(np.float32) * 0.1, kind)
        refs.append(gguf_quants.dequantize(q, GGMLQuantizationType[kind]))
        layer.weight_loader("weight", CheckpointTensor.in_memory(f"{shard}_proj.weight", torch.from_numpy(q.copy())),
                            shard)
    layer.process_weights_after_loading()
    x = torch.from_numpy(rng.standard_normal((5, 128)).astype(np.float32))
    want = x @ torch.from_numpy(np.concatenate(refs)).T
    got = layer(x.to(dtype)).float()
    tol = 1e-5 if dtype == torch.float32 else 0.02 * want.abs().max().item()
    assert (got - want).abs().max().item() <= tol


@pytest.mark.parametrize("kind", NATIVE_TYPES)
def test_kernel_tensors_from_raw_blocks_equal_packing_the_decoded_blocks(kind: str):
    from cinq.layers.quantization import native
    from cinq.layers.quantization.gguf_linear import kernel_tensors
    w = np.random.default_rng(4).standard_normal((6, 128)).astype(np.float32)
    raw = torch.from_numpy(_blocks(w, kind).copy())
    codes = decode_blocks(raw, kind)
    packed = native.pack_int8_grouped(codes.codes, codes.scales, 32) if kind == "Q8_0" else \
        native.pack_int4_affine(codes.codes, codes.scales, codes.offsets, 32)
    mine = kernel_tensors(raw, kind)
    assert mine.keys() == packed.keys() and all(torch.equal(mine[k], packed[k]) for k in mine)
    ref = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType[kind])
    back = native.dequantize_int8_grouped(mine, 32) if kind == "Q8_0" else native.dequantize_int4_affine(mine, 32)
    back = back.numpy()
    assert np.array_equal(back, ref)  # the values the kernel computes with: bit for bit but the sign of zero
    assert np.array_equal(back.view(np.uint32)[back != 0], ref.view(np.uint32)[ref != 0])


@pytest.mark.parametrize("kind", NATIVE_TYPES)
def test_int8_activation_tensors_stream_the_file_bytes_and_compute_its_values(kind: str):
    """``i8_kernel_tensors``: exactly the file's bytes (codes + fp16 scales, + Q4_1's fp16 minimums), and the
    int8-activation kernel on them computes (int8 x) @ W^T with W the reference dequantization."""
    from cinq.layers.quantization import int8_activations as i8
    from cinq.layers.quantization.gguf_linear import gguf_mm, i8_kernel_tensors, prepare_blocks
    if i8.i8_module() is None:
        pytest.skip("native int8-activation kernels unavailable here")
    w = np.random.default_rng(5).standard_normal((70, 128)).astype(np.float32)
    raw = torch.from_numpy(_blocks(w, kind).copy())
    t = i8_kernel_tensors(raw, kind)
    assert sum(v.numel() * v.element_size() for v in t.values()) == raw.numel()
    i8.set_int8_activations(True)
    try:
        p = prepare_blocks(raw, kind, torch.bfloat16)
    finally:
        i8.set_int8_activations(None)
    assert p.kind == f"gguf_{kind.lower()}_i8"
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    q, s = i8.quantize_activations_i8(x)
    xd = (q.double().view(3, 4, 32) * s.double().unsqueeze(-1)).view(3, 128)
    ref = xd @ torch.from_numpy(gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType[kind])).double().t()
    got = gguf_mm(p.kind, p.tensors, p.arg, x).double()
    assert bool(((got - ref).abs() <= 2 ** -8 * ref.abs() + 1e-5 * float(ref.abs().max())).all())


def _q4_k_blocks(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q4_K super-blocks (any bits are valid codes and 6-bit scales; d and dmin set small)."""
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    raw[..., 0:2] = np.frombuffer(np.float16(0.0031).tobytes(), np.uint8)
    raw[..., 2:4] = np.frombuffer(np.float16(0.0017).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def test_q4_k_blocks_decode_to_the_reference_and_compute_x_w_transposed():
    """Q4_K's float32 affine form per 32 values is the gguf package's dequantization exactly; the int8-activation
    kernel on its repacked codes computes (int8 x) @ W^T, in bf16 as in float32 (dequantized once)."""
    from cinq.layers.quantization import int8_activations as i8
    from cinq.layers.quantization.gguf_linear import gguf_mm, prepare_blocks
    raw = torch.from_numpy(_q4_k_blocks(48, 512, 3))
    ref = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType.Q4_K)
    assert np.array_equal(decode_blocks(raw, "Q4_K").dequantize().numpy(), ref)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    exact = prepare_blocks(raw, "Q4_K", torch.float32)
    assert torch.equal(gguf_mm(exact.kind, exact.tensors, exact.arg, x), x @ torch.from_numpy(ref).t())
    if i8.i8_module() is None:
        pytest.skip("native int8-activation kernels unavailable here")
    i8.set_int8_activations(True)
    try:
        p = prepare_blocks(raw, "Q4_K", torch.bfloat16)
    finally:
        i8.set_int8_activations(None)
    assert p.kind == "gguf_q4_k_i8"
    xb = x.bfloat16()
    q, s = i8.quantize_activations_i8(xb)
    xd = (q.double().view(3, 16, 32) * s.double().unsqueeze(-1)).view(3, 512)
    want = xd @ torch.from_numpy(ref).double().t()
    got = gguf_mm(p.kind, p.tensors, p.arg, xb).double()
    assert bool(((got - want).abs() <= 2 ** -8 * want.abs() + 1e-5 * float(want.abs().max())).all())


@pytest.mark.parametrize("rows_per_block", [None, 16])  # None: one block; 16: three, the last one short
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_prefill_sized_inputs_run_a_gemm_on_the_exact_block_values(kind: str, rows_per_block, monkeypatch):
    """From ``DEQUANT_ROWS`` rows (Q8_0: ``Q8_DEQUANT_ROWS``) a layer dequantizes its blocks per call (the reference
    dequantization, bit for bit), a block of output rows at a time, and runs a GEMM on unrounded activations: float32
    where the bf16 GEMM is emulated, else bf16 on the values rounded once to bf16; fewer rows keep the
    int8-activation kernel."""
    from cinq.kernels import prefill_gemm
    from cinq.kernels.cpu_native import bf16_gemm_is_emulated
    from cinq.layers.quantization import int8_activations as i8
    if rows_per_block is not None:
        monkeypatch.setattr(prefill_gemm, "BLOCK_BYTES", 4 * 96 * rows_per_block)
    from cinq.layers.quantization.gguf_linear import (
        DEQUANT_ROWS,
        Q8_DEQUANT_ROWS,
        dequantize_i8_int4,
        dequantize_i8_int8,
        gguf_mm,
        prepare_blocks,
    )
    if i8.i8_module() is None:
        pytest.skip("native int8-activation kernels unavailable here")
    rows = Q8_DEQUANT_ROWS if kind == "Q8_0" else DEQUANT_ROWS
    if rows > 4096:
        pytest.skip("Q8_0 keeps its kernel at any rows where the bf16 GEMM is emulated")
    w = np.random.default_rng(7).standard_normal((40, 96)).astype(np.float32)
    raw = torch.from_numpy(_blocks(w, kind).copy())
    i8.set_int8_activations(True)
    try:
        p = prepare_blocks(raw, kind, torch.bfloat16)
    finally:
        i8.set_int8_activations(None)
    ref_w = torch.from_numpy(gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType[kind]))
    mine = dequantize_i8_int8(p.tensors) if kind == "Q8_0" else dequantize_i8_int4(p.tensors, p.kind)
    assert torch.equal(mine, ref_w)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).bfloat16()
    gemm_w = ref_w if bf16_gemm_is_emulated() else ref_w.bfloat16().float()
    ref = x.float() @ gemm_w.t()
    got = gguf_mm(p.kind, p.tensors, p.arg, x)
    if rows_per_block is None and bf16_gemm_is_emulated():  # one float32 GEMM, as the reference's
        assert torch.equal(got, ref.bfloat16())
    else:  # a GEMM may order its float32 sums differently: one bf16 rounding of the float32 product
        bound = 2 ** -8 * ref.abs() + 1e-5 * (x.float().abs() @ gemm_w.abs().t())
        assert bool(((got.float() - ref).abs() <= bound).all())
    few = x[:rows - 1]
    assert not torch.equal(gguf_mm(p.kind, p.tensors, p.arg, few), ref[:rows - 1].bfloat16())  # int8 activations
