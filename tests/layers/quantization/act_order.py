"""Act-order GPTQ weights as AutoGPTQ / GPTQModel write them when each projection is quantized with its own
Hessian order, and model folders made of them (each projection its own g_idx), with their dequantized twins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cinq.layers.quantization.format import QuantFormat
from cinq.layers.quantization.packing import gptq_pack, gptq_unpack
from cinq.layers.quantization.qweight import QuantizedWeight
from cinq.quant.rtn import rtn_quantize

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def act_order_rtn(w: torch.Tensor, group: int, seed: int, sym: bool = False) -> QuantizedWeight:
    """``w`` [N, K] quantized with its input channels taken in a random order (seeded), groups formed along that
    order: g_idx[c] = (position of channel c) // group, as desc_act files store it (never k // group)."""
    k = w.shape[1]
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))  # position -> channel
    qw = rtn_quantize(w[:, order], 4, group, sym, min_zero=1)  # sequential groups in the permuted order
    position = torch.argsort(order)  # channel -> position
    qw.qweight = qw.qweight[:, position].contiguous()
    qw.g_idx = qw.g_idx[position].contiguous()
    assert not qw.has_sequential_groups()
    return qw


def seeds(layer: int) -> dict[str, int]:
    """Each projection's permutation seed: layer 0 gives every projection its own; layer 1 lets q and k share
    one (v differs) and gate and up share one (the merged gate_up then agrees: the one-kernel path)."""
    own = {p: 100 * layer + i for i, p in enumerate(PROJECTIONS)}
    if layer == 1:
        own["k_proj"] = own["q_proj"]
        own["up_proj"] = own["gate_proj"]
    return own


def write_act_order_folders(dense: Path, out: Path, group: int = 32) -> tuple[Path, Path]:
    """(GPTQ v1 act-order folder, dense float32 folder of its dequantized weights) from the dense folder
    ``dense`` (a single model.safetensors): every decoder projection quantized with its own g_idx."""
    tensors = load_file(dense / "model.safetensors")
    config = json.loads((dense / "config.json").read_text())
    quant, ref = dict(tensors), dict(tensors)
    for name in sorted(tensors):
        prefix, _, param = name.rpartition(".")
        proj = prefix.rpartition(".")[2]
        if param != "weight" or proj not in PROJECTIONS:
            continue
        layer = int(prefix.split(".")[2])
        qw = act_order_rtn(tensors[name].float(), group, seeds(layer)[proj])
        packed = gptq_pack(qw, 1)
        del quant[name]
        quant.update({f"{prefix}.{k}": v for k, v in packed.items()})
        ref[name] = gptq_unpack(packed, 4, group, 1).dequantize(torch.float32)  # the file's fp16 scales
    folders = []
    fmt = QuantFormat(method="gptq", bits=4, group_size=group, sym=False, desc_act=True)
    for kind, state, qc in (("gptq", quant, fmt.to_hf()), ("dequantized", ref, None)):
        folder = out / kind
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
        cfg = dict(config, torch_dtype="float32")
        if qc is not None:
            cfg["quantization_config"] = qc
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        for side in dense.iterdir():
            if side.name.startswith("tokenizer") or side.name == "special_tokens_map.json":
                shutil.copyfile(side, folder / side.name)
        folders.append(folder)
    return folders[0], folders[1]
