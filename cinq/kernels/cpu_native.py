"""Native CPU kernels (``cinq/kernels/cpu/*.cpp``): built on first use with the system C++ compiler through
``torch.utils.cpp_extension``, cached in the cinq cache by source content, Python environment, torch version and
CPU (a build says so in the log, with its time; ``scripts/setup.sh`` builds them), and optional — when one cannot
be built the caller runs its PyTorch path (said once in the log). ``CINQ_NATIVE_KERNELS=0`` disables them all. A
kernel whose build has no fast path for this CPU (``has_fast_path()`` false: e.g. no AVX2 + FMA) is not used either:
its portable loop would be slower than PyTorch's. Builds use ``-march=native`` and ``-fopenmp``, so the cache is keyed by the
CPU's features.

* ``paged_decode.cpp``: decode attention read straight from the KV pages (no gathered copy of the contexts).
* ``small_m_gemm.cpp``: bf16 linear for 1-32 activation rows at memory bandwidth (decode at small batch, a
  speculative verify of up to 31 drafts): AMX tiles where the CPU and OS allow them, AVX512-BF16 vector tiles, or
  AVX2 + FMA (e.g. AMD Zen 3).
* ``grouped_int_linear.cpp``: int4 affine (GGUF Q4_0 / Q4_1, GPTQ / AWQ) and int8 grouped (GGUF Q8_0, per channel)
  linears with bf16 activations, AVX2 (used by ``cinq.layers.quantization.native`` / ``kernels``).
* ``int8_activation_linear.cpp``: the same int4 / int8 weights (fp16 or float32 scales) against activations
  quantized to int8 per 32 channels (llama.cpp's Q8_0), ``vpmaddubsw`` (``cinq.layers.quantization.int8_activations``).
* ``block_dequant.cpp``: int4 / int8 weight blocks (GGUF Q4_0 / Q4_1 / Q8_0, GPTQ / AWQ / RTN) to bf16 in one pass,
  for the bf16 GEMM that prompt-sized inputs take (``cinq.layers.quantization.native.bf16_weight_rows``).
* ``float_code_linear.cpp``: NF4 (bitsandbytes) and FP8 e4m3 weights decoded in registers, bf16 activations, AVX2 +
  F16C (``cinq.layers.quantization.native_float``).
* ``small_m.h``: what the decode-sized linears share: one contiguous range of output rows per thread, prefetch.
* ``rms_norm.cpp``: RMSNorm with the fused residual add, bf16 (``cinq.layers.norm``): one call per norm instead
  of ~10 ATen ops, which at batch 1 cost far more than the arithmetic.
* ``rotary.cpp``: rotary embedding of q and k in place, bf16 (``cinq.layers.rotary``), for the same reason.
* ``kv_write.cpp``: a step's new K/V rows into the paged cache (``cinq.kernels.backends``' PyTorch backends).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
_SOURCES = Path(__file__).with_name("cpu")
_lock = threading.Lock()
_modules: dict[str, Any] = {}
SMALL_M_MAX_ROWS = 32  # the most rows small_m_gemm.cpp takes; its fast_rows() may say fewer for this CPU
_small_m_rows: int | None = None  # small_m_rows(), once known
# "causal among the new rows": one shared tensor, nothing per call
_NO_TREE = torch.empty(0, dtype=torch.bool, device="cpu")
_NO_RESIDUAL = torch.empty(0, dtype=torch.bfloat16, device="cpu")  # rms_norm without a residual add
_NO_BIAS = torch.empty(0, dtype=torch.float32, device="cpu")  # small_m_linear without a bias
# -fopenmp: ``at::parallel_for`` is a header template that splits work only where the extension itself is compiled
# with OpenMP (``#ifdef _OPENMP``); without the flag every kernel ran on one thread whatever torch's thread count.
# Linked with -fopenmp, the extension asks for libgomp.so.1, which the loader resolves to the copy torch has
# already loaded: one OpenMP runtime, torch's pool and thread count.
# CINQ_REGISTER_OPS: the kernels that register their torch.ops.cinq op in C++ (custom_ops.py) do so in these
# builds only.
_CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-DCINQ_REGISTER_OPS"]
_LDFLAGS = ["-fopenmp"]


def native_module(name: str) -> Any | None:
    """The compiled extension for ``cpu/<name>.cpp``, building it on first call; None when disabled or
    unbuildable (e.g. no compiler), or without a fast path on this CPU."""
    if name in _modules:
        return _modules[name]
    with _lock:
        if name in _modules:
            return _modules[name]
        module = None
        if os.environ.get("CINQ_NATIVE_KERNELS", "1") != "0":
            try:
                module = _build_or_load(name)
                if not getattr(module, "has_fast_path", lambda: True)():
                    log.info("native CPU kernel %s has no fast path on this CPU; using the PyTorch path", name)
                    module = None
            except Exception as e:  # noqa: BLE001 - any build failure means: use the PyTorch path
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                log.warning("native CPU kernel %s unavailable (%s); using the PyTorch path", name, first)
        _modules[name] = module
    return module


def _build_or_load(name: str, sources: Path = _SOURCES, register_ops: bool = True,
                   extra_cflags: tuple[str, ...] = ()) -> Any:
    """Load ``cpu/<name>.cpp``'s extension from the cache, compiling it first when this source (by content), Python
    environment, torch version and CPU have no build yet. The source is compiled from a copy inside its build
    folder, so every checkout of the same source using one environment shares one build instead of recompiling
    for its own path."""
    import hashlib
    import time

    from torch.utils.cpp_extension import load

    from cinq.cache import cache_dir
    source = (sources / f"{name}.cpp").read_bytes()
    headers = _included_headers(source, sources)
    cflags = (_CFLAGS if register_ops else [f for f in _CFLAGS if f != "-DCINQ_REGISTER_OPS"]) + list(extra_cflags)
    # The build command holds this interpreter's include paths: two environments sharing one build folder would
    # each see the other's command and recompile every time, so the environment is part of the key.
    key = hashlib.sha256(source + b"".join(headers.values()) + sys.prefix.encode()
                         + " ".join(cflags + _LDFLAGS).encode()).hexdigest()[:12]
    build = cache_dir() / "torch_extensions" / f"torch-{torch.__version__}-{_cpu_key()}" / f"{name}-{key}"
    build.mkdir(parents=True, exist_ok=True)
    for file_name, data in [(f"{name}.cpp", source), *headers.items()]:
        copy = build / file_name
        if not copy.is_file() or copy.read_bytes() != data:
            copy.write_bytes(data)
    copy = build / f"{name}.cpp"
    clear_stale_lock(build)
    fresh = not any(build.glob("*.so"))
    if fresh:
        log.warning("building the native CPU kernel %s (once per machine and source version, ~1 min)", name)
    t0 = time.perf_counter()
    module = load(name=f"cinq_{name}_{key}", sources=[str(copy)], build_directory=str(build),
                  # copies: torch's load() appends its own flags to the lists it is given, which changed the next
                  # kernel's cache key in the same process (a rebuild whenever kernels loaded in another order)
                  extra_cflags=list(cflags), extra_ldflags=list(_LDFLAGS), verbose=False)
    if fresh:
        log.warning("built the native CPU kernel %s in %.0f s", name, time.perf_counter() - t0)
    return module


# A build takes 1-3 minutes on a 2-core machine; a lock file older than this is a killed build's.
STALE_LOCK_S = 900.0


def clear_stale_lock(build: Path, now: float | None = None) -> bool:
    """Remove ``build``'s lock file when it is older than STALE_LOCK_S; True when one was removed.

    torch's ``load()`` waits, without a limit, for a lock file another build holds; a build killed mid-way (Ctrl-C
    during the first start, a test run stopped) leaves its file, and every later start of any cinq process then
    hangs at this kernel's load."""
    import time
    lock = build / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False
    log.warning("removing %s, left %.0f s ago by a native kernel build that did not finish", lock, age)
    lock.unlink(missing_ok=True)
    return True


def module_from(name: str, sources: Path = _SOURCES, extra_cflags: tuple[str, ...] = ()) -> Any:
    """``cpu/<name>.cpp``'s extension built from another copy of the kernel sources (a folder holding that file
    and the headers it includes, e.g. an earlier commit's ``cinq/kernels/cpu``): what a benchmark times this
    checkout's kernel against in the same process. ``extra_cflags`` follow ``-march=native`` (``-mno-avx512f``:
    the code another CPU of the same family would run, which tests compare with this CPU's). Cached by content and
    flags as native_module's builds are; built without the torch.ops.cinq registrations, which a process holds once
    (this checkout's)."""
    return _build_or_load(name, sources, register_ops=False, extra_cflags=extra_cflags)


def _included_headers(source: bytes, sources: Path = _SOURCES) -> dict[str, bytes]:
    """The ``cpu/*.h`` files ``source`` includes (as ``"name.h"``), directly or through another: only they are part
    of its build key, so editing one header rebuilds the kernels that use it, not all of them."""
    available = {h.name: h.read_bytes() for h in sorted(sources.glob("*.h"))}
    found: dict[str, bytes] = {}
    pending = [source]
    while pending:
        text = pending.pop()
        for name, data in available.items():
            if name not in found and f'#include "{name}"'.encode() in text:
                found[name] = data
                pending.append(data)
    return dict(sorted(found.items()))


def _cpu_key() -> str:
    """A short hash of the CPU's feature flags: a -march=native build must not be loaded on another CPU."""
    import hashlib
    import platform
    flags = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return hashlib.sha256(flags.encode()).hexdigest()[:10]


def call_native(mod: Any, name: str, *args: Any) -> Any:
    """``mod.<name>(*args)``, the extension's function. While ``torch.compile`` traces, the same kernel as the torch
    custom op ``torch.ops.cinq.<name>`` (``cinq.kernels.custom_ops``, registered by whoever compiles): dynamo cannot
    trace a pybind call. Eager steps keep the direct call: a custom op's dispatch costs ~10 us a call."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.cinq, name)(*args)
    return getattr(mod, name)(*args)


def warm_native_kernels() -> None:
    """Build (or load from the cache) every native kernel now; the first build takes about a minute. Also settles
    ``small_m_rows()``, so that no step (nor a torch.compile trace, which cannot call the extension) probes it."""
    for source in sorted(_SOURCES.glob("*.cpp")):
        native_module(source.stem)
    small_m_rows()


def decode_attention_native(module: str, query: torch.Tensor, kv_cache: torch.Tensor,
                            call: Callable[[Any, torch.Tensor], torch.Tensor]) -> torch.Tensor | None:
    """What every native decode attention shares: None off the CPU, for a non-contiguous cache or without the
    ``module`` build; else ``call(module, q)`` with the query as float32 or bf16 (the kernels take a bf16 query
    themselves: at batch 1 every Python-side op here would cost more than the attention), returned in the query's
    dtype."""
    if query.device.type != "cpu" or not kv_cache.is_contiguous():
        return None
    mod = native_module(module)
    if mod is None:
        return None
    q = query if query.dtype in (torch.float32, torch.bfloat16) else query.float()
    out = call(mod, q)
    return out if q is query else out.to(query.dtype)


def paged_decode_native(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, scale: float, query_len: int = 1,
                        tree_mask: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor | None:
    """Decode attention [nd * query_len, Hq, D] (query dtype) straight from the pages, or None if the kernel is
    unavailable. Sequence s owns query rows s * query_len ...; row r sees keys up to seq_len - query_len + r,
    or with ``tree_mask`` (tree verification: bool [query_len, query_len] shared by all sequences, or
    [>= nd, query_len, query_len] with sequence s using ``tree_mask[s]``) the cached context and the new rows
    its tree row marks. ``block_tables`` [>= nd, max_blocks] and ``seq_lens`` [>= nd]: the first nd rows are
    read (by the kernel: no Python-side slice). ``window``: a sliding-window layer's window (a row at position p
    sees keys > p - window only)."""
    tree = _NO_TREE
    if tree_mask is not None:  # [nd, ql, ql]: the kernel steps ql * ql per sequence; [ql, ql]: all read it
        nd = query.shape[0] // query_len
        tree = (tree_mask[:nd] if tree_mask.dim() == 3 else tree_mask).to(torch.bool).contiguous()

    def call(mod: Any, q: torch.Tensor) -> torch.Tensor:
        if window is None:
            return call_native(mod, "paged_decode", q, kv_cache, _int32(block_tables), _int32(seq_lens),
                               float(scale), int(query_len), tree)
        return call_native(mod, "paged_decode_window", q, kv_cache, _int32(block_tables), _int32(seq_lens),
                           float(scale), int(query_len), tree, int(window))
    return decode_attention_native("paged_decode", query, kv_cache, call)


def paged_decode_varlen_native(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float, query_start_loc: torch.Tensor
                               ) -> torch.Tensor | None:
    """Decode attention with ragged rows, [T, Hq, D] (query dtype), straight from the pages, or None if the kernel is
    unavailable: sequence s owns query rows ``query_start_loc[s] ..< query_start_loc[s + 1]`` (at least one, at most
    its ``seq_lens[s]``), row r of its q seeing keys up to seq_len - q + r. No tree, no window. Each sequence comes
    out exactly as ``paged_decode_native`` computes it with its own row count."""
    return decode_attention_native("paged_decode", query, kv_cache, lambda mod, q: call_native(
        mod, "paged_decode_varlen", q, kv_cache, _int32(block_tables), _int32(seq_lens), float(scale),
        _int32(query_start_loc)))


def _int32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous int32, without an op when it already is."""
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def small_m_rows() -> int:
    """The most activation rows a bf16 linear sends to the native kernel on this CPU: SMALL_M_MAX_ROWS with AMX;
    with AVX512-BF16 alone the kernel's ``fast_rows()`` (past it oneDNN is faster); 0 without the kernel."""
    global _small_m_rows
    if _small_m_rows is None:
        mod = native_module("small_m_gemm")
        _small_m_rows = 0 if mod is None else min(SMALL_M_MAX_ROWS, int(mod.fast_rows()))
    return _small_m_rows


def small_m_linear_native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear`` for bf16 inputs with at most ``small_m_rows()`` rows on the CPU without autograd, or None when
    the shape, dtype or mode does not qualify (or the kernel is unavailable)."""
    # called for every linear of a decode step: every check and op here is paid ~20 times per step
    if (x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or not x.is_cpu or torch.is_grad_enabled()
            or not weight.is_contiguous()):
        return None
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if not 1 <= rows <= small_m_rows():
        return None
    mod = native_module("small_m_gemm")
    if mod is None:
        return None
    b = _NO_BIAS
    if bias is not None:  # the kernel takes a bf16 or float32 bias as it is: no cast per call
        b = bias if bias.dtype in (torch.bfloat16, torch.float32) else bias.float()
        b = b if b.is_contiguous() else b.contiguous()
    flat = x.dim() == 2 and x.is_contiguous()
    out = call_native(mod, "small_m_linear", x if flat else x.reshape(rows, k).contiguous(), weight, b)
    return out if flat else out.view(*x.shape[:-1], weight.shape[0])


def bf16_gemm_is_emulated() -> bool:
    """True where torch's bf16 GEMM has no bf16 instructions to use (AVX2 and below): oneDNN then converts inside
    the GEMM and runs ~13 GFLOP/s on a 2-core EPYC, 5-7x below its float32 GEMM at 32-256 rows."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT", "NO AVX")


def chunked_small_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear`` for bf16 inputs with more rows than ``small_m_rows()`` where the bf16 GEMM is emulated: the
    native kernel over chunks of ``small_m_rows()`` rows. Measured on AVX2 (2 cores): 2.9x torch's bf16 GEMM at
    16 rows, 5-5.7x at 64-256 rows, on a 2048 x 640 weight and on the 49,152 x 576 LM head (prefill and batched
    decode), each chunk streaming the weight from cache or memory once. None when it does not apply."""
    chunk = small_m_rows()
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if chunk == 0 or rows <= chunk or not bf16_gemm_is_emulated():
        return None
    x2 = x.reshape(rows, k)
    parts = [small_m_linear_native(x2[i:i + chunk], weight, bias) for i in range(0, rows, chunk)]
    if any(p is None for p in parts):
        return None
    return torch.cat(parts).view(*x.shape[:-1], weight.shape[0])  # type: ignore[arg-type]


def _bf16_inference(*tensors: torch.Tensor) -> bool:
    """True when every tensor is bf16 on the CPU and autograd is off (the native element-wise kernels' domain)."""
    if torch.is_grad_enabled():
        return False
    for t in tensors:
        if t.dtype != torch.bfloat16 or not t.is_cpu:
            return False
    return True


def rms_norm_native(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(norm(x + residual) * weight, x + residual)`` (without ``residual``: ``(norm(x) * weight, None)``) for
    bf16 CPU tensors without autograd, rounded as ``cinq.layers.norm``'s PyTorch path; None when the inputs do
    not qualify or the kernel is unavailable."""
    return _norm_call("rms_norm", x, residual, weight, eps) if _bf16_inference(weight) else None


def rms_norm_scaled_native(x: torch.Tensor, residual: torch.Tensor | None, scale: torch.Tensor, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """As ``rms_norm_native`` with a float32 ``scale`` applied before the one rounding to bf16 (Gemma's 1 + w,
    rounded as cinq/model/gemma3.py's PyTorch path); None when the inputs do not qualify or the kernel is
    unavailable."""
    if scale.dtype != torch.float32 or not scale.is_cpu:
        return None
    return _norm_call("rms_norm_scaled", x, residual, scale, eps)


def _norm_call(name: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
               ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """rms_norm.cpp's ``name`` on bf16 rows ``x`` (and ``residual``), or None where they do not qualify."""
    if not _bf16_inference(x) or (residual is not None and not _bf16_inference(residual)):
        return None
    mod = native_module("rms_norm")
    if mod is None:
        return None
    y, res = call_native(mod, name, x, _NO_RESIDUAL if residual is None else residual, weight, float(eps))
    return y, (None if residual is None else res)


def argmax_native(x: torch.Tensor) -> torch.Tensor | None:
    """``x.argmax(-1)`` (int64 [R]) for a contiguous float32 CPU tensor [R, V], through ``cpu/argmax.cpp``: the same
    indices (first maximum; first NaN where a row holds one); None when ``x`` does not qualify or the kernel is
    unavailable."""
    if (x.dtype != torch.float32 or not x.is_cpu or x.dim() != 2 or x.shape[1] == 0 or not x.is_contiguous()
            or x.requires_grad or torch.compiler.is_compiling()):
        return None
    mod = native_module("argmax")
    return None if mod is None else mod.argmax_rows(x)


def rotary_native(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> bool:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by ``cos_sin[positions]`` (bf16 CPU tensors, no autograd);
    False (nothing done) when the inputs do not qualify or the kernel is unavailable."""
    if (not _bf16_inference(q, k, cos_sin) or q.dim() != 3 or k.dim() != 3 or positions.dtype != torch.long
            or positions.dim() != 1 or q.stride(2) != 1 or k.stride(2) != 1):
        return False
    return _call_in_place("rotary", "rotary_", q, k, positions, cos_sin)


def write_kv_native(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
                    ) -> bool:
    """Store key / value [T, Hkv, D] into ``kv_cache`` at ``slot_mapping`` (exact copies); False (nothing done) when
    the inputs do not qualify (not CPU, a dtype cast needed, a token's heads not contiguous) or the kernel is
    unavailable."""
    if (not kv_cache.is_cpu or key.dtype != kv_cache.dtype or value.dtype != kv_cache.dtype or key.dim() != 3
            or key.stride(2) != 1 or value.stride(2) != 1 or key.stride(1) != key.shape[2]
            or value.stride(1) != value.shape[2] or slot_mapping.dtype != torch.long or not kv_cache.is_contiguous()):
        return False
    return _call_in_place("kv_write", "write_kv", key, value, kv_cache, slot_mapping)


def _call_in_place(module: str, name: str, *args: Any) -> bool:
    """Run ``cpu/<module>.cpp``'s in-place kernel ``name`` on ``args``; False (nothing done) without the kernel."""
    mod = native_module(module)
    if mod is None:
        return False
    call_native(mod, name, *args)
    return True
