"""The engines the batch-1 latency benchmark times, one interface each (``run(prompt, new_tokens) ->
TokenTimes``): cinq in a precision variant (bf16, RTN int8, GPTQ int4), Hugging Face ``generate`` and llama.cpp on
the same weights exported to GGUF (optional: llama-cpp-python, ``pip install 'cinq[llama]'``).

A GGUF model (e.g. ``smollm2-135m-instruct``) is timed on the same files in both engines: its dense folder is the
file dequantized (cinq/export/hf_folder.py), the variants are that folder exported as bf16 / q8_0 / q4_0 GGUF
files, which cinq loads natively too (no requantization: q8_0 and q4_0 blocks go to its int8 / int4 kernels), and
the ``file`` variant is the original file itself in both engines."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cinq.config import EngineConfig
from cinq.engine.token_times import TokenTimes, time_greedy_request
from cinq.errors import InvalidParameterError

VARIANTS = ("bf16", "int8", "int4", "file")  # file: a GGUF model's own file, in cinq and llama.cpp alike
BASELINES = ("hf", "llama.cpp")
# cinq variant -> the GGUF matrix type reading the same bytes per weight in a decode step
GGUF_TYPE = {"bf16": "bf16", "int8": "q8_0", "int4": "q4_0"}
_SHORT_DTYPE = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


class Runner(Protocol):
    """What the benchmark times: one greedy generation of ``new_tokens`` tokens after ``prompt``."""

    def run(self, prompt: list[int], new_tokens: int) -> TokenTimes: ...


@dataclass(slots=True)
class TimedEngine:
    """A runner under its report name (e.g. ``cinq int4``, ``llama.cpp q4_0``), the torch threads it runs with
    (None: leave torch's setting; llama.cpp's own threads are fixed in its runner) and the engine it is compared
    with (None: a baseline)."""

    name: str
    threads: int | None
    runner: Runner
    vs: str | None = None


class CinqRunner:
    """One cinq engine, one request at a time."""

    def __init__(self, config: EngineConfig) -> None:
        from cinq.engine.engine import LLMEngine
        self.engine = LLMEngine(config)

    def run(self, prompt: list[int], new_tokens: int) -> TokenTimes:
        return time_greedy_request(self.engine, prompt, new_tokens)


class HFRunner:
    """transformers ``generate``, batch 1, its tokens timed by a streamer (see hf_baseline.hf_token_times)."""

    def __init__(self, folder: str | Path, dtype: str) -> None:
        from cinq.bench.hf_baseline import load_hf_model
        self.model = load_hf_model(str(folder), dtype)

    def run(self, prompt: list[int], new_tokens: int) -> TokenTimes:
        from cinq.bench.hf_baseline import hf_token_times
        ttft, gaps = hf_token_times(self.model, prompt, new_tokens)
        return TokenTimes(ttft, gaps)


class LlamaCppRunner:
    """A GGUF file in llama.cpp with ``threads`` threads."""

    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        from cinq.export.llama_cpp import LlamaCppGreedy
        self.greedy = LlamaCppGreedy(path, threads, n_ctx=n_ctx)

    def run(self, prompt: list[int], new_tokens: int) -> TokenTimes:
        r = self.greedy.generate(prompt, new_tokens)
        return TokenTimes(r.prefill_s, r.step_s, r.token_ids)


def llama_cpp_missing() -> str | None:
    """None when llama-cpp-python imports, else why not (one line)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python not installed ({e.name}); pip install 'cinq[llama]'"
    return None


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, None without it (for the report's machine line)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.__version__)


def short_dtype(dtype: str) -> str:
    """``bfloat16`` -> ``bf16`` ...: how an engine's name carries its dtype."""
    return _SHORT_DTYPE.get(dtype, dtype)


def check_names(values: tuple[str, ...], allowed: tuple[str, ...], param: str) -> None:
    """InvalidParameterError naming ``param`` unless every value is one of ``allowed``."""
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InvalidParameterError(f"{param} must be among {','.join(allowed)}, got {','.join(bad)}", param)


def variant_config(config: EngineConfig, variant: str, work: Path) -> EngineConfig:
    """``config`` running the dense model (bf16) or a cached int8 / int4 quantization of it; for a GGUF model,
    the GGUF file of that type (the one llama.cpp runs) or, ``file``, the model's own file."""
    source = source_gguf(config)
    if source is not None:
        path = source if variant == "file" else gguf_file(dense_folder(config, work), GGUF_TYPE[variant], work)
        return dataclasses.replace(config, model=str(path), dtype="bfloat16")
    if variant == "file":
        raise InvalidParameterError("variant 'file' needs a GGUF model (e.g. smollm2-135m-instruct)", "variants")
    if variant == "bf16":
        return dataclasses.replace(config, dtype="bfloat16")
    bits, method = (8, "rtn") if variant == "int8" else (4, "gptq")
    return dataclasses.replace(config, model=str(quantized_folder(dense_folder(config), bits, method, work)),
                               dtype="bfloat16")


def source_gguf(config: EngineConfig) -> Path | None:
    """The GGUF file ``config``'s model is, or None for a folder."""
    from cinq.assets import resolve_model_path
    from cinq.model.gguf.file import find_gguf_file
    return find_gguf_file(Path(resolve_model_path(config.model or None, "model")))


def dense_folder(config: EngineConfig, work: Path | None = None) -> Path:
    """The folder of ``config``'s model (an embedded name resolved); a GGUF model's dequantized copy in ``work``."""
    from cinq.assets import resolve_model_path
    path = Path(resolve_model_path(config.model or None, "model"))
    source = source_gguf(config)
    if source is None:
        return path
    out = (work or Path(".")) / f"{_tag(source)}-dense"
    if not (out / "config.json").is_file():
        from cinq.export.hf_folder import gguf_to_folder
        gguf_to_folder(source, out)
    return out


def _tag(src: Path) -> str:
    """A cache name for ``src``: its folder name and a hash of its resolved path (two models never share one)."""
    return f"{src.name}-{hashlib.sha1(str(src.resolve()).encode()).hexdigest()[:8]}"


def quantized_folder(src: Path, bits: int, method: str, work: Path) -> Path:
    """A cinq quantized copy of ``src`` (kept in ``work``): RTN per channel for 8 bits, GPTQ group 128 for 4."""
    out = work / f"{_tag(src)}-{method}{bits}"
    if (out / "config.json").is_file():
        return out
    from cinq.model.config import ModelConfig
    from cinq.quant.calibration import calibration_windows
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    calib = None
    if method == "gptq":  # a small random calibration set: the kernel's speed does not depend on the integers
        vocab = ModelConfig.from_pretrained(src).vocab_size
        rng = random.Random(0)
        calib = calibration_windows([rng.randrange(vocab) for _ in range(16 * 128)], 16, 128, 0)
    quantize_model(src, out, QuantConfig(method=method, bits=bits, group_size=128 if bits == 4 else -1, sym=True),
                   calib, progress=False)
    return out


def gguf_file(src: Path, outtype: str, work: Path) -> Path:
    """``src`` exported for llama.cpp with ``outtype`` matrices (kept in ``work``)."""
    from cinq.export.gguf import export_gguf
    out = work / f"{_tag(src)}-{outtype}.gguf"
    if not out.is_file():
        export_gguf(src, out, outtype)
    return out


def build_engines(config: EngineConfig, variants: tuple[str, ...], baselines: tuple[str, ...],
                  threads_list: tuple[int, ...] | None, n_ctx: int, work: Path) -> tuple[list[TimedEngine], list[str]]:
    """Every engine to time, in report order, and one line per requested baseline that cannot run here.

    No variants (and no llama.cpp): cinq as ``config`` says, against HF at the same dtype. Variants: cinq in
    each, each against llama.cpp's matching GGUF type when llama.cpp runs (HF bf16 too), else against HF."""
    from cinq.bench.hf_baseline import hf_available
    missing = []
    hf = "hf" in baselines and hf_available()
    if "hf" in baselines and not hf:
        missing.append("HF baseline ABSENT: transformers is not installed (pip install transformers)")
    absent = llama_cpp_missing() if "llama.cpp" in baselines else None
    if absent:
        missing.append(f"llama.cpp baseline ABSENT: {absent}")
    llama = "llama.cpp" in baselines and absent is None
    if llama and not variants:  # llama.cpp runs GGUF types only: its pair is cinq bf16
        variants = ("bf16",)
    hf_dtype = "bfloat16" if variants else config.dtype
    hf_name = f"HF {short_dtype(hf_dtype)}"
    threads: tuple[int | None, ...] = threads_list or (None,)
    cinq_runners: dict[str, CinqRunner] = {}  # one engine per variant: torch threads are set per measurement
    hf_runner = HFRunner(dense_folder(config, work), hf_dtype) if hf else None
    engines: list[TimedEngine] = []
    # no variant: cinq as configured, named for its weights (a GGUF model runs its file's blocks, not bf16 ones)
    as_configured = "cinq file" if source_gguf(config) is not None else f"cinq {short_dtype(config.dtype)}"
    for t in threads:
        for i, variant in enumerate(variants or ("",)):
            name = f"cinq {variant}" if variant else as_configured
            if name not in cinq_runners:
                cinq_runners[name] = CinqRunner(variant_config(config, variant, work) if variant else config)
            gguf_name = f"llama.cpp {GGUF_TYPE.get(variant, '')}" if variant != "file" else "llama.cpp file"
            vs = gguf_name if llama and variant else (hf_name if hf else None)
            engines.append(TimedEngine(name, t, cinq_runners[name], vs))
            if llama and variant:
                path = (source_gguf(config) if variant == "file" else
                        gguf_file(dense_folder(config, work), GGUF_TYPE[variant], work))
                engines.append(TimedEngine(gguf_name, t, LlamaCppRunner(path, t or _torch_threads(), n_ctx)))
            if hf_runner is not None and i == 0:
                engines.append(TimedEngine(hf_name, t, hf_runner, "llama.cpp bf16" if llama and "bf16" in variants
                                           else None))
    return engines, missing


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()

