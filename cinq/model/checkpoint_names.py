"""Checkpoint names <-> the model's parameters, through the model's ``stacked_params_mapping``.

A checkpoint tensor ``<module>.<param>`` belongs either to the model module of that name (shard None), or,
when a mapping entry (merged suffix, checkpoint suffix, shard id) matches the module's name, to one shard of
the merged module (``...self_attn.q_proj.weight`` -> shard "q" of ``...self_attn.qkv_proj.weight``). The
loader resolves names one way, the saver (and anything that must write Hugging Face names) the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cinq.layers.weight_loader import ShardId, split_shards

Mapping = tuple[tuple[str, str, ShardId], ...]


@dataclass(slots=True, frozen=True)
class Target:
    """Where one checkpoint tensor goes: parameter/buffer ``param`` of module ``module``, shard ``shard_id``."""

    module: str
    param: str
    shard_id: ShardId | None = None


def mapping_of(model: nn.Module) -> Mapping:
    return getattr(model, "stacked_params_mapping", ())


def resolve(modules: dict[str, nn.Module], mapping: Mapping, name: str) -> Target | None:
    """The target of checkpoint tensor ``name`` in a model whose modules are ``modules``; None: no place.
    A module may name its tensors with dots (bitsandbytes' ``weight.absmax``): its ``checkpoint_params`` maps
    buffer names to them."""
    module, _, param = name.rpartition(".")
    target = _resolve(modules, mapping, module, param)
    parts = name.split(".")
    for cut in range(2, min(4, len(parts)) + 1):  # '<module>.weight.absmax', '...weight.quant_state.<kind>'
        if target is not None:
            break
        target = _resolve(modules, mapping, ".".join(parts[:-cut]), ".".join(parts[-cut:]), dotted=True)
    return target


def _resolve(modules: dict[str, nn.Module], mapping: Mapping, module: str, param: str,
             dotted: bool = False) -> Target | None:
    def place(m: nn.Module) -> str | None:
        if not dotted:
            return param
        inverse = {v: k for k, v in getattr(m, "checkpoint_params", {}).items()}
        return inverse.get(param)

    if module in modules and not _is_merged(modules[module]):
        own = place(modules[module])
        return None if own is None else Target(module, own)
    for merged, ckpt, shard_id in mapping:
        if module.endswith(ckpt):
            candidate = module[: -len(ckpt)] + merged
            if candidate in modules and _is_merged(modules[candidate]):
                own = place(modules[candidate])
                return None if own is None else Target(candidate, own, shard_id)
    return None


def _ckpt_param(module: nn.Module | None, param: str) -> str:
    """The checkpoint name of ``module``'s tensor ``param`` after the module's name."""
    return getattr(module, "checkpoint_params", {}).get(param, param)


def _is_merged(module: nn.Module) -> bool:
    return getattr(module, "output_shards", None) is not None


def checkpoint_name(mapping: Mapping, target: Target) -> str:
    """The checkpoint tensor name of ``target`` (inverse of ``resolve``)."""
    if target.shard_id is None:
        return f"{target.module}.{target.param}"
    for merged, ckpt, shard_id in mapping:
        if shard_id == target.shard_id and target.module.endswith(merged):
            return f"{target.module[: -len(merged)]}{ckpt}.{target.param}"
    raise KeyError(f"{target.module}: no checkpoint name for shard {target.shard_id!r} in the mapping")


def expected_checkpoint_names(model: nn.Module, skip: set[str] | None = None) -> dict[str, Target]:
    """Every checkpoint tensor the model needs, by name (what its state_dict holds; ``skip``: model tensor names
    left out, e.g. a tied LM head)."""
    mapping = mapping_of(model)
    modules = dict(model.named_modules())
    out: dict[str, Target] = {}
    for full in model.state_dict(keep_vars=True):
        if skip and full in skip:
            continue
        module_name, _, param = full.rpartition(".")
        shards = getattr(modules[module_name], "output_shards", None)
        ckpt = _ckpt_param(modules[module_name], param)
        for shard_id in (None,) if shards is None else shards.ids:
            target = Target(module_name, param, shard_id)
            out[checkpoint_name(mapping, Target(module_name, ckpt, shard_id))] = target
    return out


def checkpoint_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``state`` (default: the model's state_dict) under checkpoint names: merged parameters split into their
    shards' tensors (views), in the model's order."""
    state = model.state_dict() if state is None else state
    modules = dict(model.named_modules())
    mapping = mapping_of(model)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module_name, _, param = name.rpartition(".")
        module = modules.get(module_name)
        shards = getattr(module, "output_shards", None)
        if shards is None:
            out[f"{module_name}.{_ckpt_param(module, param)}" if module_name else name] = tensor
            continue
        for shard_id, part in split_shards(tensor, module.param_layout(param), shards).items():
            out[checkpoint_name(mapping, Target(module_name, _ckpt_param(module, param), shard_id))] = part
    return out
