"""Which shard of the model this process builds, and the collectives the sharded layers call.

Layers learn their rank and the group size once, at construction, from ``current_shard()`` (set by
``building_shard`` around the model's construction, as ``torch.device("meta")`` is): a model built outside it is
the whole model, exactly as before, and never calls a collective. Sharded layers (size > 1) call ``all_reduce`` /
``all_gather_last_dim`` on torch.distributed's default group, which the tensor-parallel executor (rank 0, the
engine's process) and its workers (ranks 1..N-1) initialise: gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(slots=True, frozen=True)
class TPShard:
    """This process's place in a tensor-parallel group: ``rank`` of ``size`` (size 1: the whole model)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.size):
            raise ValueError(f"tensor-parallel rank {self.rank} is outside [0, {self.size})")


# per thread (and task): a model built on one thread never sees another thread's shard
_building: ContextVar[TPShard] = ContextVar("cinq_building_shard", default=TPShard())


@contextlib.contextmanager
def building_shard(shard: TPShard | None) -> Iterator[None]:
    """Layers constructed inside build ``shard``'s part of the model (None: the whole model)."""
    token = _building.set(shard or TPShard())
    try:
        yield
    finally:
        _building.reset(token)


def current_shard() -> TPShard:
    """The shard layers being constructed now belong to."""
    return _building.get()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the group in place (row-parallel outputs, vocab-parallel embedding rows)."""
    dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor, size: int) -> torch.Tensor:
    """Every rank's ``x`` side by side along the last dimension, in rank order (vocab-parallel logits)."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=-1)


def all_reduce_output_hook(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    """Forward hook of a row-parallel linear: its partial sums become the full output (one all-reduce). Only
    sharded layers carry it, so the single-device path runs no extra op."""
    return all_reduce(output)


# How long a collective of the forward pass may wait for a peer before it fails (a rank that died fails it at
# once: its sockets close). Commands wait much longer: an idle engine sends none.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
_COMMAND_TIMEOUT = timedelta(days=30)


def serve_rendezvous(world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the OS picks and that stays bound until the store is dropped.
    Picking a free port and binding it only once the workers had loaded let another process take it meanwhile
    (EADDRINUSE in CI)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=COLLECTIVE_TIMEOUT,
                         wait_for_workers=False)


def join_rendezvous(port: int, world_size: int) -> dist.TCPStore:
    """A worker's client of rank 0's rendezvous store (``serve_rendezvous``)."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=COLLECTIVE_TIMEOUT)


def init_process_groups(device_type: str, shard: TPShard, store: dist.Store,
                        timeout: timedelta = COLLECTIVE_TIMEOUT) -> dist.ProcessGroup:
    """Join the tensor-parallel group as ``shard.rank``: the default group carries the layers' collectives
    (NCCL on CUDA, gloo on CPU); the returned gloo group carries rank 0's commands (plain objects)."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, store=store, rank=shard.rank, world_size=shard.size, timeout=timeout)
    except BaseException:
        # torch names the default group from a process-wide counter that only destroying a live default group
        # resets: left advanced by a failed start, every later engine's rank 0 would wait on keys that fresh
        # workers never write (one failed start became a cascade of timeouts in CI).
        if not dist.is_initialized():
            dist.distributed_c10d._world.group_count = 0
        raise
    return dist.new_group(backend="gloo", timeout=_COMMAND_TIMEOUT)


def broadcast_command(command: object, group: dist.ProcessGroup) -> object:
    """Rank 0 sends ``command`` (plain data: a SchedulerOutput is torch-free); every other rank receives it."""
    box = [command]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
