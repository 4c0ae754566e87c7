"""DPAsyncLLM: N engine replicas as Ray actors behind one front end with the ``EngineClient`` interface
(engine/protocol.py), so that the server (``build_app``) serves it as it serves one engine.

Each request goes to the replica ``PrefixRouter`` chooses (prefix affinity, else the least-loaded, by requests
in flight from this front end) and its outputs stream back through a Ray streaming generator
(``EngineReplica.generate``). Faults: when a replica dies (Ray reports ``RayActorError`` on its streams), every
request it held that had not yet delivered an output to its consumer is re-sent to another live replica; one that
had is ended with ``ReplicaFailedError`` (the server turns it into an error event); nothing waits on a dead actor.
The dead replica is replaced by a fresh actor (same config) in the background. ``counters`` says how many
requests were retried, failed and completed, and how many replicas were restarted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from cinq.config import EngineConfig, ParallelConfig
from cinq.dp.counters import DPCounters
from cinq.dp.ray_calls import await_ref, connect_ray, next_item, replica_death_errors, unwrap
from cinq.dp.replica import ACCEPTED, EngineReplica, ReplicaInfo
from cinq.dp.request_stream import DPRequest, DPRequestStream, ReplicaSlot, abort_on
from cinq.dp.router import NoReplicaError, PrefixRouter, RouterConfig
from cinq.dp.stats import sum_stats, without_gauges
from cinq.engine.async_frontend import AsyncFrontend
from cinq.engine.async_engine import EngineDeadError, EngineOverloadedError
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5  # replica stats (and idle replicas' liveness) are polled this often
RESTART_ATTEMPTS = 5


class DPAsyncLLM(AsyncFrontend):
    """The ``EngineClient`` interface over ``data_parallel_size`` replicas (see the module docstring). Construction
    connects to Ray (``ray_address``; None: $RAY_ADDRESS, else a new local cluster, unless this process is
    already connected) and waits until every replica has loaded its engine. ``replica_num_cpus``: CPUs each
    replica reserves (default: ``config.num_threads``, else an equal share of the cluster's); a replica on a
    CUDA device also reserves ``tensor_parallel_size`` GPUs."""

    def __init__(self, config: EngineConfig, data_parallel_size: int, max_waiting_requests: int | None = None,
                 ray_address: str | None = None, router_config: RouterConfig | None = None,
                 replica_num_cpus: float | None = None, startup_timeout: float = 600.0) -> None:
        super().__init__()
        try:
            import ray
        except ImportError:
            raise InvalidParameterError("data parallelism runs on Ray, which is not installed: "
                                        "pip install 'cinq[ray]'", "data_parallel_size") from None
        ParallelConfig(tensor_parallel_size=config.tensor_parallel_size,
                       data_parallel_size=data_parallel_size)  # validates the size
        router_config = router_config or RouterConfig(block_size=config.block_size)
        if router_config.block_size != config.block_size:
            raise InvalidParameterError(
                f"the router's block_size ({router_config.block_size}) must be the engine's "
                f"({config.block_size}): its keys are prefix-cache blocks", "block_size")
        self.config = config
        self.max_waiting_requests = max_waiting_requests
        self.router = PrefixRouter(data_parallel_size, router_config)
        self.counters = DPCounters(data_parallel_size)
        self.startup_timeout = startup_timeout
        self._owns_ray = connect_ray(ray_address)
        try:
            self.replica_num_cpus = replica_num_cpus or self._default_cpus(data_parallel_size)
            self._check_resources(data_parallel_size)
        except BaseException:
            self._disconnect()
            raise
        self._actor_class = ray.remote(EngineReplica)
        self._retired = EngineStats()  # counters of replicas that died, so totals never go backwards
        self._retired_step_failures = 0
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._stopping = False
        handles = [self._new_actor() for _ in range(data_parallel_size)]
        try:
            infos = ray.get([h.ready.remote() for h in handles], timeout=startup_timeout)
        except BaseException as e:
            for h in handles:
                ray.kill(h, no_restart=True)
            self._disconnect()
            raise unwrap(e) from None  # e.g. the model's own load error, not Ray's wrapper around it
        self.info: ReplicaInfo = infos[0]  # every replica runs the same config: the first speaks for all
        self.tokenizer: Tokenizer = self.info.tokenizer  # what the server reads (EngineClient)
        self.replicas = [ReplicaSlot(i, h) for i, h in enumerate(handles)]

    # ---- life cycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start polling the replicas' stats; call from inside the event loop that will consume the outputs."""
        if self._started:
            return
        self._started, self._stopping = True, False
        self._spawn(self._poll())

    async def shutdown_async(self, timeout: float = 10.0) -> None:
        """Stop the replicas (each ends its engine loop) and, if this front end started Ray, Ray itself."""
        log.info("data-parallel front end stopping: %s", self.counters.summary())
        self._stop_tasks()
        refs = [r.handle.shutdown.remote() for r in self.replicas if r.alive]
        if refs:
            await asyncio.wait([asyncio.ensure_future(await_ref(ref)) for ref in refs], timeout=timeout)
        self._kill_all()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Kill the replicas without waiting for their engines (from any thread)."""
        self._stop_tasks()
        self._kill_all()

    def _stop_tasks(self) -> None:
        self._stopping, self._started = True, False
        for task in list(self._tasks):
            task.cancel()

    def _kill_all(self) -> None:
        import ray
        for r in self.replicas:
            r.alive = False
            try:
                ray.kill(r.handle, no_restart=True)
            except Exception:  # already gone
                pass
        self._disconnect()

    def _disconnect(self) -> None:
        if self._owns_ray:
            import ray
            ray.shutdown()
            self._owns_ray = False

    # ---- what the server reads (EngineClient) --------------------------------------------------------------------
    # dead_error stays None: a dead replica is replaced; the front end itself never reports one

    @property
    def stopping(self) -> bool:
        """Shutting down: a request whose replica dies now is not re-sent."""
        return self._stopping

    @property
    def is_running(self) -> bool:
        return self._started and not self._stopping and any(r.alive for r in self.replicas)

    # ---- requests -----------------------------------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          prompt_text: str | None = None, arrival_time: float | None = None,
                          language: str | None = None) -> DPRequestStream:
        """Route and send a request, and wait until its replica accepted it; raises the replica's validation
        error (a ``CinqError``) or ``EngineOverloadedError`` as ``AsyncLLM.add_request`` does."""
        if not self.is_running:
            raise EngineDeadError("the data-parallel front end is not running")
        token_ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        req = DPRequest(request_id, prompt, token_ids, params, prompt_text, arrival_time or time.time(), language)
        stream = DPRequestStream(self, req)
        await stream.submit()
        return stream

    async def send(self, req: DPRequest, exclude: set[int]) -> tuple[ReplicaSlot, int, Any]:
        """Send ``req`` to a replica and wait for its acceptance; a replica that dies first is marked dead and
        the request goes to another (``exclude`` collects the replicas that failed it)."""
        while True:
            if self._stopping:
                raise EngineDeadError("the data-parallel front end was shut down")
            dead = {r.index for r in self.replicas if not r.alive}
            try:
                decision = self.router.route(req.token_ids, [r.in_flight for r in self.replicas], exclude | dead)
            except NoReplicaError:
                raise EngineDeadError(f"no live data-parallel replica can take request {req.request_id} "
                                      f"({len(dead)} of {len(self.replicas)} restarting)") from None
            self.counters.decisions[decision.reason] += 1
            self.counters.routed[decision.replica] += 1
            replica = self.replicas[decision.replica]
            generation = replica.generation
            replica.in_flight += 1
            gen = replica.handle.generate.options(num_returns="streaming").remote(
                req.request_id, req.prompt, req.params, req.prompt_text, req.arrival_time, req.language)
            try:
                first = await next_item(gen)
            except replica_death_errors():
                replica.in_flight -= 1
                self.replica_died(replica, generation)
                exclude.add(replica.index)
                self.counters.retried += 1
                continue
            except BaseException as e:  # its validation error, overload, or our caller's cancellation
                replica.in_flight -= 1
                if isinstance(e, asyncio.CancelledError):
                    abort_on(replica, req.request_id)
                    raise
                error = unwrap(e)
                others = set(range(len(self.replicas))) - exclude - dead - {replica.index}
                if isinstance(error, EngineOverloadedError) and others:
                    exclude.add(replica.index)  # full here: another replica may still have room
                    continue
                raise error from None
            if first != ACCEPTED:
                raise RuntimeError(f"replica {replica.index} broke the stream protocol: {first!r}")
            return replica, generation, gen

    def request_finished(self, out: RequestOutput) -> None:
        """A stream delivered its finished output: count it and run the finished callbacks (metrics)."""
        self.counters.completed += 1
        self._request_finished(out)

    # ---- faults -------------------------------------------------------------------------------------------------
    def replica_died(self, replica: ReplicaSlot, generation: int) -> None:
        """Mark a replica dead (once per incarnation) and replace it in the background."""
        if replica.generation != generation or not replica.alive:
            return
        replica.alive = False
        self.router.forget_replica(replica.index)  # its successor starts with an empty prefix cache
        if replica.snapshot is not None:
            self._retired = sum_stats([self._retired, without_gauges(replica.snapshot.stats)])
            self._retired_step_failures += replica.snapshot.num_step_failures
            replica.snapshot = None
        log.warning("data-parallel replica %d died; restarting it", replica.index)
        if not self._stopping:
            self._spawn(self._restart(replica))

    async def _restart(self, replica: ReplicaSlot) -> None:
        import ray
        try:
            ray.kill(replica.handle, no_restart=True)
        except Exception:
            pass
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            handle = self._new_actor()
            try:
                await asyncio.wait_for(await_ref(handle.ready.remote()), self.startup_timeout)
            except Exception as e:
                log.error("restarting replica %d failed (attempt %d of %d): %s", replica.index, attempt,
                          RESTART_ATTEMPTS, e)
                ray.kill(handle, no_restart=True)
                await asyncio.sleep(min(2.0 ** attempt, 30.0))
                continue
            replica.handle, replica.generation, replica.alive = handle, replica.generation + 1, True
            self.counters.restarts += 1
            log.warning("data-parallel replica %d restarted", replica.index)
            return
        log.error("data-parallel replica %d could not be restarted; serving without it", replica.index)

    async def _poll(self) -> None:
        """Fetch every live replica's stats; a replica that died while idle is found here."""
        while True:
            for replica in self.replicas:
                if not replica.alive:
                    continue
                generation = replica.generation
                try:
                    replica.snapshot = await await_ref(replica.handle.snapshot.remote())
                except replica_death_errors():
                    self.replica_died(replica, generation)
                except Exception:
                    log.exception("could not read replica %d's stats", replica.index)
            await asyncio.sleep(POLL_INTERVAL_S)

    def _default_cpus(self, data_parallel_size: int) -> float:
        """CPUs per replica: ``num_threads`` when given, else an equal share of the cluster's. Ray sets a replica's
        OMP_NUM_THREADS (so torch's thread count) to this, so it is also how many threads each engine uses."""
        if self.config.num_threads is not None:
            return float(self.config.num_threads)
        import ray
        return float(max(1, int(ray.cluster_resources().get("CPU", 1.0) // data_parallel_size)))

    def _resources(self) -> dict[str, float]:
        """What one replica reserves in the Ray cluster."""
        needs = {"CPU": self.replica_num_cpus}
        if self.config.device.startswith("cuda"):
            needs["GPU"] = float(self.config.tensor_parallel_size)
        return needs

    def _check_resources(self, data_parallel_size: int) -> None:
        """Refuse a size the cluster cannot place at all (Ray would otherwise wait for resources forever)."""
        import ray
        have = ray.cluster_resources()
        for name, per_replica in self._resources().items():
            if per_replica * data_parallel_size > have.get(name, 0.0):
                raise InvalidParameterError(
                    f"data_parallel_size {data_parallel_size} needs {per_replica * data_parallel_size:g} {name} "
                    f"({per_replica:g} per replica) but the Ray cluster has {have.get(name, 0.0):g}",
                    "data_parallel_size")

    def _new_actor(self) -> Any:
        needs = self._resources()
        return self._actor_class.options(num_cpus=needs["CPU"], num_gpus=needs.get("GPU", 0), max_restarts=0).remote(
            self.config, self.max_waiting_requests)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- stats --------------------------------------------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        """All replicas' engine stats added up (counters of replicas that died included)."""
        return sum_stats([self._retired] + [r.snapshot.stats for r in self.replicas if r.snapshot is not None])

    def replica_stats(self) -> list[EngineStats | None]:
        """Each replica's latest stats (None: not read yet since it (re)started)."""
        return [r.snapshot.stats if r.snapshot is not None else None for r in self.replicas]

    @property
    def stats_time(self) -> float:
        times = [r.snapshot.stats_time for r in self.replicas if r.snapshot is not None]
        return max(times) if times else 0.0

    @property
    def num_step_failures(self) -> int:
        return self._retired_step_failures + sum(r.snapshot.num_step_failures for r in self.replicas
                                                 if r.snapshot is not None)

    @property
    def num_waiting(self) -> int:
        return self.get_stats().num_waiting
