"""One measurement of benchmarks/step_breakdown.py, run in a child process whose ``cinq`` is the code measured
(this checkout or the baseline's tree): the clean decode step, its kernel time under the profiler, the per-phase
CPU time of an instrumented run, and the ATen ops and host syncs of one step (the module docstring of
step_breakdown.py says what each is). ``cinq`` and ``torch`` are imported inside the functions: the child imports
this module before it puts the measured tree first on its path."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Callable

PHASES = ("schedule", "prepare_inputs", "embed", "input_norm", "qkv_proj", "qk_norm", "rope", "attention",
          "o_proj", "post_attn_norm", "mlp", "final_norm", "lm_head", "sampler", "scheduler_update",
          "output_processing")


_clock = time.process_time  # CPU seconds of this process (all its threads)


class _Timers:
    """Accumulated CPU time per phase, by wrapping callables and module hooks of one engine."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, obj: Any, attr: str, phase: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = _clock()
            try:
                return fn(*a, **kw)
            finally:
                if self.on:
                    self.ms[phase] += 1e3 * (_clock() - t0)
        setattr(obj, attr, timed)

    def hook(self, module: Any, phase: str) -> None:
        start: list[float] = []

        def pre(*_: Any) -> None:
            start.append(_clock())

        def post(*_: Any) -> None:
            t0 = start.pop()
            if self.on:
                self.ms[phase] += 1e3 * (_clock() - t0)
        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def _instrument(engine: Any) -> _Timers:
    import cinq.engine.runner as runner_mod

    t = _Timers()
    runner = engine.executor.runner
    t.wrap(engine.scheduler, "schedule", "schedule")
    t.wrap(engine.scheduler, "update", "scheduler_update")
    t.wrap(engine.output_processor, "process", "output_processing")
    t.wrap(runner_mod, "build_batch", "prepare_inputs")
    t.wrap(runner, "_compute_logits", "lm_head")
    t.wrap(runner, "_sample", "sampler")
    model = runner.model.model
    t.hook(model.embed_tokens, "embed")
    t.hook(model.norm, "final_norm")
    for layer in model.layers:
        attn = layer.self_attn
        t.hook(layer.input_layernorm, "input_norm")
        t.hook(layer.post_attention_layernorm, "post_attn_norm")
        t.hook(layer.mlp, "mlp")
        for name, phase in (("qkv_proj", "qkv_proj"), ("rotary_emb", "rope"), ("attn", "attention"),
                            ("o_proj", "o_proj"), ("q_norm", "qk_norm")):
            sub = getattr(attn, name, None)
            if sub is not None:
                t.hook(sub, phase)
    return t


class _Counter:
    """ATen ops (TorchDispatchMode) and host syncs of the steps run inside it."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = defaultdict(int)
        self.syncs = 0

    def run(self, fn: Callable[[], Any]) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                counter.ops[str(func.overloadpacket)] += 1
                if func.overloadpacket is torch.ops.aten._local_scalar_dense:
                    counter.syncs += 1
                return func(*args, **(kwargs or {}))

        tolist = torch.Tensor.tolist

        def counted_tolist(self_: torch.Tensor) -> Any:
            counter.syncs += 1
            return tolist(self_)
        torch.Tensor.tolist = counted_tolist  # tolist reads the data without an ATen op: count it here
        try:
            with Mode():
                fn()
        finally:
            torch.Tensor.tolist = tolist


def _engine(model: str, threads: int, prompt_len: int = 32, batch: int = 1, **engine_args: Any) -> Any:
    """An engine (``engine_args``: further EngineConfig fields) with ``batch`` greedy requests of ``prompt_len``
    prompt tokens each, past their prefill."""
    import torch

    from cinq.config import EngineConfig
    from cinq.engine.engine import LLMEngine
    from cinq.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    engine = LLMEngine(EngineConfig(model=model, dtype="bfloat16", kv_cache_memory=0.5, seed=0,
                                    max_num_seqs=max(4, batch), **engine_args))
    for i in range(batch):
        engine.add_request(f"b{i}", list(range(10 + i, 10 + i + prompt_len)),
                           SamplingParams(temperature=0, max_tokens=100_000 // 100, ignore_eos=True))
    while engine.scheduler.waiting or any(not r.output_token_ids for r in engine.scheduler.running):
        engine.step()  # prefill (in chunks when the prompts exceed a step's token budget)
    return engine


def kernel_ms(engine: Any, steps: int = 10) -> tuple[float, float]:
    """Wall ms per step inside the step's kernels (see the module docstring) and ATen + native op calls per step,
    from ``steps`` profiled steps."""
    ops, count = stepping_thread_ops(engine, steps)
    total_us = sum(e.self_cpu_time_total for e in ops if e.name.startswith("cinq::") or e.name[6:] not in _HOST_OPS)
    return total_us / 1e3 / steps, count / steps


def stepping_thread_ops(engine: Any, steps: int, record_shapes: bool = False) -> tuple[list[Any], int]:
    """The profiler's ATen and native-kernel events of the thread that ran ``steps`` engine steps, and the count of
    such events on every thread."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cinq.kernels.cpu_native as cpu_native
    from cinq.kernels import custom_ops  # noqa: F401  (torch.ops.cinq.*: the profiler sees the native kernels)

    # Every module that calls the native kernels (each imported call_native by name): one left out hid its kernels
    # from the profiler, and their time counted as host time (the int8-activation LM head: ~1.5 ms of a SmolLM2
    # step until 2026-12-07).
    real = cpu_native.call_native
    callers = [m for name, m in list(sys.modules.items())
               if name.startswith("cinq.") and getattr(m, "call_native", None) is real]
    for m in callers:
        m.call_native = lambda mod, name, *a: getattr(torch.ops.cinq, name)(*a)
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
            for _ in range(steps):
                engine.step()
    finally:
        for m in callers:
            m.call_native = real
    ops = [e for e in prof.events() if e.name.startswith(("cinq::", "aten::"))]
    # The calling thread's kernels only: at 2+ threads the fused step's team runs parts of a linear on other
    # threads at the same time, and summing their self time as well counted the same wall time twice (a 2-thread
    # host time came out negative). What the step waits for its team then counts as host time.
    # (the profiler numbers threads itself; the stepping thread is the one that ran nearly every op)
    per_thread: dict[int, int] = defaultdict(int)
    for e in ops:
        per_thread[e.thread] += 1
    main = max(per_thread, key=per_thread.__getitem__, default=0)
    return [e for e in ops if e.thread == main], len(ops)


# ATen ops that move no data (views, allocations, dispatch wrappers): host work, not kernel time
_HOST_OPS = frozenset(("empty", "empty_strided", "empty_like", "view", "select", "slice", "as_strided", "split",
                       "split_with_sizes", "reshape", "unsqueeze", "squeeze", "transpose", "t", "expand", "detach",
                       "detach_", "lift_fresh", "alias", "resolve_conj", "resolve_neg", "_unsafe_view", "to",
                       "contiguous", "chunk", "narrow", "permute", "flatten", "unbind", "numpy_T", "set_"))


def measure(model: str, threads: int, steps: int, repeats: int,
            compilation: dict[str, Any] | None = None, prompt_len: int = 32, batch: int = 1) -> dict[str, Any]:
    """One code version's numbers (runs in a child process whose ``cinq`` is the version measured)."""
    import torch

    import cinq

    engine = _engine(model, threads, prompt_len, batch,
                     **({"compilation_config": compilation} if compilation else {}))
    step_ms, cpu_ms = clean_steps(engine, steps, repeats)
    kernels, host, profiled_ops = (host_and_kernel_ms(engine) if hasattr(torch.ops, "cinq")
                                   else (float("nan"), float("nan"), 0.0))
    tokens = engine.scheduler.running[0].output_token_ids if engine.scheduler.running else []
    if compilation:  # hooks, timers and a dispatch mode inside the compiled graph would make it recompile
        return {"cinq": cinq.__file__, "threads": threads, "torch_threads": torch.get_num_threads(),
                "step_ms_median": statistics.median(step_ms), "step_ms_all": step_ms,
                "cpu_ms_median": statistics.median(cpu_ms), "cpu_ms_all": cpu_ms, "kernel_ms": kernels,
                "host_ms": host, "profiled_ops": profiled_ops,
                "instrumented_step_ms_median": float("nan"),
                "phases_ms": {p: float("nan") for p in (*PHASES, "other")},
                "aten_ops": -1, "host_syncs": -1, "top_ops": {}, "first_tokens": list(tokens[:64]),
                "loadavg": os.getloadavg(), "weight_mb": _weight_mb(engine)}
    counter = _Counter()
    counter.run(engine.step)
    # The clean steps above ran the fused decode step (cinq/model/decode_layers.py) where it applies; its layers
    # have no Python phases, so the phases below time the Python layers it replaces.
    try:
        from cinq.model.decode_layers import set_fused_decode
    except ImportError:  # a baseline from before the fused step
        fused_steps = 0
    else:
        fused_steps = set_fused_decode(engine.executor.runner.model, False)
    timers = _instrument(engine)
    per_repeat: list[dict[str, float]] = []
    instrumented_ms = []
    for _ in range(repeats):
        timers.ms.clear()
        timers.on = True
        t0 = _clock()
        for _ in range(steps):
            engine.step()
        instrumented_ms.append(1e3 * (_clock() - t0) / steps)
        timers.on = False
        per_repeat.append({k: v / steps for k, v in timers.ms.items()})
    phases = {p: statistics.median(r.get(p, 0.0) for r in per_repeat) for p in PHASES}
    phases["other"] = statistics.median(instrumented_ms) - sum(phases.values())  # engine / runner / layer glue
    tokens = engine.scheduler.running[0].output_token_ids if engine.scheduler.running else []
    return {"cinq": cinq.__file__, "threads": threads, "torch_threads": torch.get_num_threads(),
            "step_ms_median": statistics.median(step_ms), "step_ms_all": step_ms,
            "cpu_ms_median": statistics.median(cpu_ms), "cpu_ms_all": cpu_ms, "kernel_ms": kernels,
            "host_ms": host,
            "instrumented_step_ms_median": statistics.median(instrumented_ms), "phases_ms": phases,
            "aten_ops": sum(counter.ops.values()), "host_syncs": counter.syncs,
            "top_ops": dict(sorted(counter.ops.items(), key=lambda kv: -kv[1])[:12]),
            "first_tokens": list(tokens[:64]), "loadavg": os.getloadavg(), "weight_mb": _weight_mb(engine),
            "profiled_ops": profiled_ops, "fused_steps": fused_steps}


def _weight_mb(engine: Any) -> float:
    model = engine.executor.runner.model
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 1e6


def host_and_kernel_ms(engine: Any, pairs: int = 7, steps: int = 10) -> tuple[float, float, float]:
    """(kernel ms, host ms, profiled ops) per step: ``pairs`` times a clean run of ``steps`` steps right before a
    profiled one (kernel_ms); host = the clean wall minus the kernel time of the same pair, median over pairs. A
    clean run timed apart from the profiled one (minutes earlier, on this VM's drifting clocks) gave host times
    from -0.6 to +3.4 ms for one configuration."""
    kernels, hosts, ops = [], [], 0.0
    for _ in range(pairs):
        clean = clean_steps(engine, steps, 1, warmup=2)[0][0]
        k, ops = kernel_ms(engine, steps)
        kernels.append(k)
        hosts.append(clean - k)
    return statistics.median(kernels), statistics.median(hosts), ops


def clean_steps(engine: Any, steps: int, repeats: int, warmup: int = 20) -> tuple[list[float], list[float]]:
    """After ``warmup`` steps (shapes, caches, native kernels), ``repeats`` times the wall and process CPU ms per
    step over ``steps`` decode steps, without any instrumentation."""
    for _ in range(warmup):
        engine.step()
    step_ms, cpu_ms = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _clock()
        for _ in range(steps):
            engine.step()
        step_ms.append(1e3 * (time.perf_counter() - t0) / steps)
        cpu_ms.append(1e3 * (_clock() - c0) / steps)
    return step_ms, cpu_ms
