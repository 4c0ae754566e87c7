"""The main loop of a tensor-parallel worker process (ranks 1..N-1; rank 0 is the engine's own process).

A worker loads its shard (a ``UniProcExecutor`` over it: each tensor's slice read alone from the file), says it
is ready on its pipe (or sends its start-up error there), joins the process group, then runs what rank 0
broadcasts: allocate the KV cache, run a step (the same ``SchedulerOutput`` as rank 0, so its runner takes part
in every collective and keeps the same per-request state), or stop. Its step outputs are dropped: every rank
samples the same tokens from the same gathered logits, and rank 0's output is the engine's.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from cinq.config import EngineConfig
from cinq.distributed.parallel_state import TPShard, broadcast_command, init_process_groups, join_rendezvous
from cinq.engine.uniproc_executor import UniProcExecutor

INIT_CACHE = "init_cache"
STEP = "step"
STOP = "stop"


@dataclass(slots=True)
class WorkerArgs:
    """What a worker process starts from (pickled to the spawned process)."""

    config: EngineConfig
    seed: int
    shard: TPShard
    rendezvous_port: int  # of rank 0's rendezvous store on 127.0.0.1


def _exit_with_parent(parent: int) -> None:
    """End this worker when the engine's process is gone (killed outright, say): nothing else would."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def worker_main(args: WorkerArgs, ready: Connection) -> None:
    """Entry point of a spawned worker process."""
    # Ctrl-C reaches the whole process group; the engine decides what it means and stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="cinq-tp-parent-watch",
                     daemon=True).start()
    try:
        # On a CPU the ranks share the cores: each takes its part unless the engine was told a count.
        torch.set_num_threads(args.config.num_threads or max(1, (os.cpu_count() or 1) // args.shard.size))
        executor = UniProcExecutor(args.config, args.seed, args.shard)
    except BaseException as e:
        ready.send(f"{type(e).__name__}: {e}")
        raise
    ready.send(None)
    ready.close()
    control = init_process_groups(executor.device.type, args.shard,
                                  join_rendezvous(args.rendezvous_port, args.shard.size))
    try:
        while True:
            command, arg = broadcast_command(None, control)  # type: ignore[misc]
            if command == STEP:
                executor.execute_model(arg)
            elif command == INIT_CACHE:
                executor.initialize_cache(arg)
            elif command == STOP:
                break
            else:
                raise RuntimeError(f"tensor-parallel worker {args.shard.rank}: unknown command {command!r}")
    finally:
        executor.shutdown()
        dist.destroy_process_group()
