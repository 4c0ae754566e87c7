"""The few Ray calls the data-parallel front end makes, in one place: connecting, telling an actor's death from
an error of the call, and awaiting refs and streaming generators. Ray is imported inside the functions: it is an
optional extra."""

from __future__ import annotations

import os
from typing import Any


def connect_ray(address: str | None) -> bool:
    """Connect to Ray (``address``, else $RAY_ADDRESS, else a new local cluster); True when this call started
    or joined it (so the front end disconnects at shutdown), False when the process was already connected."""
    import ray
    if ray.is_initialized():
        return False
    import cinq
    # The replicas import cinq from where this process does (a source checkout need not be installed), so that
    # both sides run the same code; on a node without that folder Python skips the entry and the node's
    # installed cinq is used. The model folder must exist at the same path on every node that hosts a replica.
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(cinq.__file__)))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (source_root, os.environ.get("PYTHONPATH")) if p)}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env={"env_vars": env})
    else:  # "local": a new cluster, even when `ray start` left one running on this machine
        ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": env})
    return True


def replica_death_errors() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean "the actor (its process or node) is gone", not "the call failed"."""
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError
    return RayActorError, WorkerCrashedError, NodeDiedError


def unwrap(e: BaseException) -> BaseException:
    """The replica's own exception (a CinqError, EngineOverloadedError, RequestFailedError) out of Ray's
    wrapper, so the server maps it as it maps AsyncLLM's."""
    from ray.exceptions import RayTaskError
    if isinstance(e, RayTaskError) and isinstance(e.cause, BaseException):
        return e.cause
    return e


async def next_item(gen: Any) -> Any:
    """The next value of a Ray streaming generator (its error raised here, as the actor raised it or died)."""
    ref = await gen.__anext__()
    return await ref


async def await_ref(ref: Any) -> Any:
    """A Ray ObjectRef as a coroutine (for asyncio.wait_for / ensure_future)."""
    return await ref
