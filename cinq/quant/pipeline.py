"""`cinq quantize`: dense model folder -> quantized model folder, one decoder block at a time.

Each block is read from the source safetensors, calibrated on the activations the previous blocks produced,
quantized by the chosen method, packed in the chosen format and handed to the shard writer; then it is dropped.
GPTQ feeds the next block from the quantized block (its errors are compensated downstream), AWQ and SmoothQuant
from the float one (their scales are exact float transformations; their search targets are float outputs).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cinq.errors import InvalidParameterError
from cinq.quant.calibration import (BLOCK_LINEARS, BlockState, CheckpointReader, block_linears, capture_inputs,
                                    run_block)
from cinq.layers.quantization.packing import awq_pack, gptq_pack, pack_unit
from cinq.layers.quantization.qweight import QuantizedWeight
from cinq.model.config import ModelConfig
from cinq.quant.config import QuantConfig
from cinq.quant.rtn import rtn_quantize
from cinq.quant.writer import ShardWriter, write_configs


@dataclass(slots=True)
class QuantizeResult:
    """What `cinq quantize` did: where, how long, how much memory, how big."""

    out_dir: Path
    method: str
    format: str
    seconds: float
    peak_rss_mib: float
    weight_bytes: int
    calib_tokens: int
    losses: dict[str, float] = field(default_factory=dict)


def check_shapes(c: ModelConfig, cfg: QuantConfig) -> None:
    """Refuse up front what the format cannot store for a model of config ``c``, naming the layer and the limit
    (InvalidParameterError)."""
    fmt = cfg.target
    shapes = {"self_attn.q_proj": (c.hidden_size, c.q_size), "self_attn.k_proj": (c.hidden_size, c.kv_size),
              "self_attn.v_proj": (c.hidden_size, c.kv_size), "self_attn.o_proj": (c.q_size, c.hidden_size),
              "mlp.gate_proj": (c.hidden_size, c.intermediate_size),
              "mlp.up_proj": (c.hidden_size, c.intermediate_size),
              "mlp.down_proj": (c.intermediate_size, c.hidden_size)}
    if fmt.lm_head:
        shapes["lm_head"] = (c.hidden_size, c.vocab_size)
    if fmt.format == "w8a8":
        return
    if fmt.method in ("nf4", "fp8"):
        for name, (k, n) in shapes.items():
            if fmt.method == "nf4" and (k * n) % fmt.group_size:
                raise InvalidParameterError(f"{name}: {n} x {k} values are not whole NF4 blocks of "
                                            f"{fmt.group_size}", "group_size")
        return
    per = pack_unit(cfg.bits)[0]  # values per whole packing unit (3 bits: 32 values in 3 words)
    for name, (k, n) in shapes.items():
        if n % per or (fmt.format in ("gptq", "gptq_v2") and k % per):
            raise InvalidParameterError(f"{name}: in/out features ({k}, {n}) must be multiples of {per} to pack "
                                        f"{cfg.bits}-bit weights into int32", "bits")
        if fmt.format == "awq" and fmt.group_size > 0 and k % fmt.group_size:
            raise InvalidParameterError(f"{name}: in_features {k} is not a multiple of group_size {cfg.group_size} "
                                        f"(AWQ files need whole groups; use --format gptq)", "group_size")


def _pack(cfg: QuantConfig, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    if cfg.format == "awq":
        return awq_pack(qw)
    return gptq_pack(qw, 2 if cfg.format == "gptq_v2" else 1)


def quantize_model(src: str | Path, dst: str | Path, cfg: QuantConfig, calib: torch.Tensor | None = None,
                   batch: int = 8, progress: bool = True, awq_search_windows: int = 8,
                   max_shard_bytes: int = 2 << 30, calib_dtype: torch.dtype = torch.bfloat16) -> QuantizeResult:
    """Quantize the dense model folder ``src`` into ``dst`` with ``cfg``; ``calib`` is [n, S] token windows
    (required by every method but RTN).

    Calibration forwards run in ``calib_dtype`` (bf16 by default: twice as fast on CPUs with AVX512-BF16, as
    AutoGPTQ/AutoAWQ calibrate in fp16 on GPUs); statistics, searches and the quantization itself are float32
    from float32 copies of the weights."""
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise InvalidParameterError("--out must differ from the source model folder", "out")
    from cinq.quant.float_codes import needs_calibration
    reader = CheckpointReader(src)
    from cinq.model.interface import check_supported
    from cinq.model.registry import ModelRegistry
    check_supported(ModelRegistry.model_class(reader.config.architecture), cfg.method, "method")
    check_shapes(reader.config, cfg)
    calibrated = needs_calibration(cfg)
    if calibrated and calib is None:
        raise InvalidParameterError(f"{cfg.method} needs calibration text (--calib FILE)", "calib")
    dense_dtype = reader.dtype()
    writer = ShardWriter(dst, max_shard_bytes)
    state = BlockState.from_tokens(reader, calib, calib_dtype) if calib is not None and calibrated else None
    losses: dict[str, float] = {}
    layers = range(reader.config.num_hidden_layers)
    bar = _progress(layers, f"{cfg.method} {cfg.bits}-bit", progress)
    for i in bar:
        prefix = f"model.layers.{i}"
        block = reader.block(i)
        if cfg.method in ("nf4", "fp8"):
            from cinq.quant.float_codes import float_code_block
            packed, state = float_code_block(block, state, cfg, batch, dense_dtype)
            block_losses = {}
        else:
            packed, state, block_losses = _quantize_block(block, state, cfg, batch, awq_search_windows,
                                                          calib_dtype)
        for local, tensors in packed.items():
            for key, t in tensors.items():
                writer.add(f"{prefix}.{local}.{key}", t)
        linear_names = set(block_linears(block))
        for name, p in block.named_parameters():
            owner = name.rsplit(".", 1)[0]
            if owner in linear_names:
                if name.endswith(".bias"):
                    bias_dtype = torch.float16 if cfg.format in ("gptq", "gptq_v2", "awq") else dense_dtype
                    writer.add(f"{prefix}.{name}", p.detach().to(bias_dtype))
                continue
            writer.add(f"{prefix}.{name}", p.detach().to(dense_dtype))  # norms (AWQ/SQ fold scales into them)
        losses.update({f"{prefix}.{k}": v for k, v in block_losses.items()})
        del block
    fmt = cfg.target
    for name in reader.names():
        if not name.startswith("model.layers.") and not (fmt.lm_head and name == "lm_head.weight"):
            writer.add(name, reader.tensor(name))
    if fmt.lm_head:
        # Round-to-nearest on the GPTQ grid for every method: the head's input (final norm output) is not
        # collected by the block-by-block calibration.
        head = reader.tensor("lm_head.weight" if reader.has("lm_head.weight") else "model.embed_tokens.weight")
        qw = rtn_quantize(head.float(), fmt.bits, fmt.group_size, fmt.sym, fmt.min_zero)
        for key, t in _pack(cfg, qw).items():
            writer.add(f"lm_head.{key}", t)
    writer.finish()
    write_configs(src, dst, reader.raw_config, cfg, dense_dtype)
    peak = peak_rss_mib()
    return QuantizeResult(dst, cfg.method, cfg.format or "", time.perf_counter() - start, peak, writer.total_bytes,
                          0 if calib is None or not calibrated else int(calib.numel()), losses)


def _quantize_block(block: torch.nn.Module, state: BlockState | None, cfg: QuantConfig, batch: int,
                    awq_search_windows: int, calib_dtype: torch.dtype
                    ) -> tuple[dict[str, dict[str, torch.Tensor]], BlockState | None, dict[str, float]]:
    """One float32 block: (packed tensors by linear name, next calibration state, per-linear losses). The block
    is left float32 with the method's changes (folded scales in the norms) for the writer."""
    lin = block_linears(block)
    firsts = [names[0] for names in BLOCK_LINEARS]
    fmt, recipe = cfg.target, cfg.recipe
    if cfg.method == "rtn":
        out = {n: _pack(cfg, rtn_quantize(m.weight.detach(), fmt.bits, fmt.group_size, fmt.sym, fmt.min_zero))
               for n, m in lin.items()}
        return out, None, {}
    assert state is not None
    master = {k: v.detach().clone() for k, v in block.state_dict().items()}
    block.to(calib_dtype)

    def restore_float32() -> None:
        block.float()
        block.load_state_dict(master)

    if cfg.method == "gptq":
        from cinq.model.llama import LlamaDecoderLayer
        from cinq.quant.gptq import gptq_block, gptq_block_staged
        masters = {n: master[f"{n}.weight"] for n in lin}
        # The next block reads the quantized block's outputs: GPTQ compensates downstream.
        if recipe.true_sequential and type(block) is LlamaDecoderLayer:
            weights, losses, nxt = gptq_block_staged(block, state, fmt.bits, fmt.group_size, fmt.sym, fmt.desc_act,
                                                     fmt.static_groups, recipe.damp_percent, recipe.lazy_batch_size,
                                                     batch, fmt.min_zero, masters)
        else:
            weights, losses = gptq_block(block, state, fmt.bits, fmt.group_size, fmt.sym, fmt.desc_act,
                                         fmt.static_groups, recipe.damp_percent, recipe.lazy_batch_size,
                                         recipe.true_sequential, batch, fmt.min_zero, masters)
            nxt = run_block(block, state, batch)
        restore_float32()
        return {n: _pack(cfg, qw) for n, qw in weights.items()}, nxt, losses
    if cfg.method == "awq":
        from cinq.quant.awq import AWQStats, awq_block
        stats = AWQStats(awq_search_windows)
        with capture_inputs(block, firsts, stats):
            nxt = run_block(block, state, batch)
        restore_float32()
        weights = awq_block(block, stats, state.positions, fmt.bits, fmt.group_size, fmt.sym, recipe.awq_grid,
                            recipe.awq_clip, fmt.min_zero)
        return {n: _pack(cfg, qw) for n, qw in weights.items()}, nxt, {}
    from cinq.quant.smoothquant import AbsMaxStats, smooth_block, w8a8_block
    stats = AbsMaxStats()
    with capture_inputs(block, firsts, stats):
        nxt = run_block(block, state, batch)
    restore_float32()
    after = smooth_block(block, stats, recipe.smooth_alpha)
    return w8a8_block(block, after, fmt.act_scheme == "static"), nxt, {}


def peak_rss_mib() -> float:
    """This process's peak resident memory. /proc's VmHWM is per address space (ru_maxrss would carry over the
    parent's peak through fork + exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _progress(it, desc: str, enabled: bool):
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:
        return it
    return tqdm(it, desc=desc, unit="block")
