"""The seed's open debate, measured (issue 30): the paged KV cache against the virtual-contiguous one (vAttention),
same requests, same memory budget, one run.

1. churn: mixed-length requests arriving as others finish (closed loop, ``--concurrency`` in flight), on the real
   model: KV bytes held vs the tokens they hold (fragmentation), physical memory (the paged pool is committed
   whole at start; the virtual reservation's RSS from /proc/self/smaps), page faults per step (getrusage minflt),
   step time, output throughput, TTFT. The driver is ``cinq.bench.drive.run_until_done`` (its ``on_step`` adds the
   next request and samples the state);
2. decode attention kernel alone: paged_decode.cpp over 16-token blocks (scattered, as after churn) vs
   contiguous_decode.cpp over one range per sequence, SmolLM2 heads, bf16, batch x context grid;
3. page size: committing and releasing one 100-token request on 4 KiB vs 2 MiB (transparent huge) pages;
4. prefix sharing: the shared-prefix workload (``cinq.bench.prefix_workload``, driven by ``cinq.bench.prefix``'s
   round runner): hit rate and TTFT, paged (prefix caching) vs virtual (none); and what page sharing would cost
   (memfd + mmap(MAP_FIXED) remaps, measured);
5. code size of each path.

    python benchmarks/vattention.py            # writes benchmarks/results/vattention.{json,md,png}
    python benchmarks/vattention.py --quick    # cinq-tiny, a small grid: smoke run
    python benchmarks/vattention.py --render   # the .md again from the saved .json
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import mmap
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from cinq.bench.drive import run_until_done  # noqa: E402
from cinq.bench.latency_stats import summarize_ms  # noqa: E402
from cinq.bench.prefix import _run_rounds  # noqa: E402
from cinq.bench.prefix_workload import PrefixWorkloadOptions, build_prefix_workload  # noqa: E402
from cinq.bench.report import machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.bench.workload import random_requests, text_tokens  # noqa: E402
from cinq.config import EngineConfig  # noqa: E402
from cinq.engine import kv_cache_virtual as kvv  # noqa: E402
from cinq.engine.engine import LLMEngine  # noqa: E402
from cinq.kernels.contiguous import contiguous_decode_native  # noqa: E402
from cinq.kernels.cpu_native import paged_decode_native  # noqa: E402
from cinq.sampling_params import OutputKind, SamplingParams  # noqa: E402
from benchmarks.vattention_report import LAYOUTS, report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
HQ, HKV, D = 9, 3, 64  # SmolLM2-135M's attention


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---- 1. churn on the real model -------------------------------------------------------------------------------
def churn(config: EngineConfig, layout: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = LLMEngine(dataclasses.replace(config, kv_cache_layout=layout))
    kv, sched = engine.kv, engine.scheduler
    core = engine.core
    per_token = core.executor.kv_bytes_per_block(1)  # all layers, K and V
    if layout == "paged":
        reserved = physical = engine.num_blocks * core.executor.kv_bytes_per_block(config.block_size)
    else:
        reserved = kv.region.nbytes
        physical = None
    reqs = random_requests(args.requests, engine.vocab_size, (16, args.max_prompt), (8, args.max_output), seed=1,
                           low_token=3)
    pending = list(reqs)
    ids: list[str] = []
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True,
                             output_kind=OutputKind.FINAL_ONLY) for r in reqs]

    def add() -> None:
        i = len(ids)
        r = pending.pop(0)
        ids.append(f"c{i}")
        engine.add_request(ids[-1], r.prompt, params[i])

    samples: list[dict[str, Any]] = []
    state = {"t": 0.0, "flt": 0, "prompt": engine.get_stats().prompt_tokens}

    def on_step(eng: LLMEngine) -> None:
        step_s, faults = time.perf_counter() - state["t"], _minflt() - state["flt"]
        prompt = eng.get_stats().prompt_tokens  # prompt tokens computed so far: none this step = a decode step
        tokens = sum(r.num_computed_tokens for r in sched.running)
        held = (kv.num_blocks - kv.num_free_blocks) * (core.executor.kv_bytes_per_block(config.block_size)
                                                       if layout == "paged" else kvv.SMALL_PAGE)
        rss = physical if layout == "paged" else kv.region.resident()["rss"]
        samples.append({"step_s": step_s, "minflt": faults, "running": len(sched.running), "token_bytes":
                        tokens * per_token, "held_bytes": held, "physical_bytes": rss,
                        "decode_only": prompt == state["prompt"]})
        while pending and len(sched.running) + len(sched.waiting) < args.concurrency:
            add()
        state["t"], state["flt"], state["prompt"] = time.perf_counter(), _minflt(), prompt

    for _ in range(min(args.concurrency, len(pending))):
        add()
    state["t"], state["flt"] = time.perf_counter(), _minflt()
    start = time.perf_counter()
    outs = run_until_done(engine, on_step=on_step)
    duration = time.perf_counter() - start
    ttft = [outs[i].metrics.first_token_time - outs[i].metrics.arrival_time for i in ids]
    out_tokens = sum(len(outs[i].outputs[0].token_ids) for i in ids)
    live = [s for s in samples if s["held_bytes"]]
    decode = [s["step_s"] for s in samples if s["decode_only"]]
    after = kv.region.resident()["rss"] if layout == "virtual" else physical
    result = {"layout": layout, "requests": len(ids), "output_tokens": out_tokens, "duration_s": duration,
              "output_throughput": out_tokens / duration, "ttft_ms": summarize_ms(ttft),
              "step_ms": summarize_ms([s["step_s"] for s in samples]), "decode_step_ms": summarize_ms(decode),
              "minflt_per_step": statistics.fmean(s["minflt"] for s in samples),
              "reserved_bytes": reserved, "budget_bytes": engine.num_blocks * core.executor.kv_bytes_per_block(
                  config.block_size),
              "peak_physical_bytes": max(s["physical_bytes"] for s in samples),
              "physical_after_bytes": after,
              "mean_fragmentation": statistics.fmean(1 - s["token_bytes"] / s["held_bytes"] for s in live),
              "preemptions": engine.get_stats().num_preemptions,
              "token_ids": [outs[i].outputs[0].token_ids for i in ids], "samples": samples}
    engine.shutdown()
    return result


def decode_ab(config: EngineConfig, rounds: int, steps: int, batch: int, prompt_len: int) -> dict[str, Any]:
    """Decode steps of both layouts interleaved (ABBA rounds of ``steps`` steps on two live engines holding the same
    ``batch`` requests): on a shared machine the load drifts, and interleaving spreads the drift over both."""
    engines = {name: LLMEngine(dataclasses.replace(config, kv_cache_layout=name)) for name in LAYOUTS}
    reqs = random_requests(batch, engines["paged"].vocab_size, (prompt_len, prompt_len), (1, 1), seed=2, low_token=3)
    params = SamplingParams(temperature=0, max_tokens=rounds * steps * 2 + 8, ignore_eos=True,
                            output_kind=OutputKind.FINAL_ONLY)
    for eng in engines.values():
        for i, r in enumerate(reqs):
            eng.add_request(f"ab{i}", r.prompt, params)
        before = eng.get_stats().prompt_tokens
        while True:  # through the prefill, to the first step that computes no prompt token
            eng.step()
            now = eng.get_stats().prompt_tokens
            if now == before:
                break
            before = now
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    faults: dict[str, list[int]] = {name: [] for name in LAYOUTS}
    for rnd in range(rounds):
        for name in (LAYOUTS if rnd % 2 == 0 else LAYOUTS[::-1]):
            for _ in range(steps):
                f0, t0 = _minflt(), time.perf_counter()
                engines[name].step()
                times[name].append(time.perf_counter() - t0)
                faults[name].append(_minflt() - f0)
    out = {name: {"step_ms": summarize_ms(times[name]), "minflt_per_step": statistics.fmean(faults[name])}
           for name in LAYOUTS}
    for eng in engines.values():
        eng.abort_request([f"ab{i}" for i in range(batch)])
        eng.shutdown()
    return {"rounds": rounds, "steps": steps, "batch": batch, "prompt_len": prompt_len, **out}


# ---- 2. the decode kernels alone ------------------------------------------------------------------------------
def kernel_grid(batches: list[int], contexts: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for ctx in contexts:
        for batch in batches:
            scale = D ** -0.5
            q = torch.randn(batch, HQ, D, generator=gen).to(torch.bfloat16)
            lens = torch.full((batch,), ctx, dtype=torch.int32)
            # paged: 16-token blocks, the batch's blocks shuffled over the pool (a pool after churn)
            nb = batch * ctx // 16
            paged = torch.randn(2, nb, 16, HKV, D, generator=gen).to(torch.bfloat16)
            tables = torch.randperm(nb, generator=gen).to(torch.int32).view(batch, ctx // 16)
            region = kvv.VirtualKVRegion(1, batch, kvv.slot_tokens_for(ctx, HKV * D * 2, kvv.SMALL_PAGE), HKV, D,
                                         torch.bfloat16)
            virt = region.layer_views()[0]
            virt[:, :, :ctx] = paged.view(2, batch, ctx, HKV, D)  # same values (another order: the timing only)
            slots = torch.arange(batch, dtype=torch.int32)
            t_paged = _best(lambda: paged_decode_native(q, paged, tables, lens, scale), repeats)
            t_cont = _best(lambda: contiguous_decode_native(q, virt, slots, lens, scale), repeats)
            rows.append({"batch": batch, "context": ctx, "paged_ms": 1000 * t_paged, "contiguous_ms": 1000 * t_cont,
                         "paged_over_contiguous": t_paged / t_cont,
                         "kv_gb_s_contiguous": 2 * batch * ctx * HKV * D * 2 / t_cont / 1e9})
            del paged, virt, region
    return rows


def _best(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ---- 3. page size ---------------------------------------------------------------------------------------------
def page_sizes(layers: int, tokens: int) -> list[dict[str, Any]]:
    rows = []
    row_bytes = HKV * D * 2
    for page in (kvv.SMALL_PAGE, kvv.HUGE_PAGE):
        region = kvv.VirtualKVRegion(layers, 4, kvv.slot_tokens_for(8192, row_bytes, page), HKV, D, torch.bfloat16,
                                     page)
        caches = region.layer_views()
        f0, t0 = _minflt(), time.perf_counter()
        for c in caches:
            c[:, 0, :tokens] = 1.0
        commit_s, faults = time.perf_counter() - t0, _minflt() - f0
        res = region.resident()
        t0 = time.perf_counter()
        region.release(0, tokens)
        rows.append({"page_size": page, "tokens": tokens, "committed_bytes": res["rss"],
                     "in_huge_pages_bytes": res["anon_huge"], "token_bytes": 2 * layers * tokens * row_bytes,
                     "page_faults": faults, "commit_ms": 1000 * commit_s,
                     "release_ms": 1000 * (time.perf_counter() - t0), "after_release_bytes": region.resident()["rss"]})
        del caches, region
    return rows


# ---- 4. prefix sharing ----------------------------------------------------------------------------------------
def prefix(config: EngineConfig, layout: str, opts: PrefixWorkloadOptions) -> dict[str, Any]:
    engine = LLMEngine(dataclasses.replace(config, kv_cache_layout=layout))
    work = build_prefix_workload(text_tokens(engine.tokenizer), opts)
    _run_rounds(engine, [work.warmup], None)
    out = _run_rounds(engine, work.rounds("shared_prefix"), None)
    engine.shutdown()
    return out


def remap_cost(runs: int, run_bytes: int) -> dict[str, Any]:
    """What sharing pages would cost: map ``run_bytes`` of a memfd at a fixed address inside a reservation (one
    mmap(MAP_FIXED | MAP_SHARED) per run and range) vs copying the same bytes."""
    libc = kvv._libc
    fd = os.memfd_create("cinq-kv")
    os.ftruncate(fd, runs * run_bytes)
    src = mmap.mmap(fd, runs * run_bytes)
    src.write(b"\1" * (runs * run_bytes))
    region = kvv.VirtualKVRegion(1, 1, kvv.slot_tokens_for(runs * run_bytes // (HKV * D * 2), HKV * D * 2,
                                                             kvv.SMALL_PAGE), HKV, D, torch.bfloat16)
    base = region.base
    t0 = time.perf_counter()
    for i in range(runs):
        addr = libc.mmap(base + i * run_bytes, run_bytes, 0x3, 0x01 | 0x10, fd, i * run_bytes)  # SHARED | FIXED
        if addr != base + i * run_bytes:
            raise OSError(ctypes.get_errno(), "mmap(MAP_FIXED) failed")
    remap_s = (time.perf_counter() - t0) / runs
    view = region.layer_views()[0].view(-1).view(torch.uint8)
    f0, t0 = _minflt(), time.perf_counter()
    touched = int(view[::4096].sum())  # first touch of every shared page: a fault each, no copy
    touch_faults, touch_s = _minflt() - f0, time.perf_counter() - t0
    other = torch.empty(runs * run_bytes, dtype=torch.uint8)
    other.fill_(0)
    t0 = time.perf_counter()
    other.copy_(torch.frombuffer(src, dtype=torch.uint8))
    copy_s = (time.perf_counter() - t0) / runs
    maps = sum(1 for _ in open("/proc/self/maps"))
    del view, region, other
    src.close()
    os.close(fd)
    return {"runs": runs, "run_bytes": run_bytes, "remap_us_per_run": 1e6 * remap_s,
            "copy_us_per_run": 1e6 * copy_s, "first_touch_faults": touch_faults,
            "first_touch_us_per_run": 1e6 * touch_s / runs, "pages_touched": touched,
            "process_vmas_with_remaps": maps,
            "max_map_count": int(Path("/proc/sys/vm/max_map_count").read_text())}


# ---- 5. code size ---------------------------------------------------------------------------------------------
PATHS = {"paged": ["cinq/engine/kv_cache.py", "cinq/kernels/paged.py", "cinq/kernels/sdpa.py",
                   "cinq/kernels/cpu/paged_decode.cpp"],
         "virtual": ["cinq/engine/kv_cache_virtual.py", "cinq/kernels/contiguous.py",
                     "cinq/kernels/cpu/contiguous_decode.cpp"]}


def code_size() -> dict[str, dict[str, int]]:
    def count(path: str) -> int:
        lines = (ROOT / path).read_text().splitlines()
        return sum(1 for line in lines if line.strip() and not line.strip().startswith(("#", "//", '"""')))
    return {layout: {p: count(p) for p in paths} for layout, paths in PATHS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="cinq-tiny and a small grid (smoke run)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-prompt", type=int, default=384)
    ap.add_argument("--max-output", type=int, default=48)
    ap.add_argument("--prefix-requests", type=int, default=8)
    ap.add_argument("--out", default=str(RESULTS / "vattention"))
    ap.add_argument("--decode-ab", action="store_true",
                    help="run the interleaved decode-step A/B and add it to the saved .json (a second invocation)")
    ap.add_argument("--render", action="store_true", help="the .md (and plot) again from the saved .json")
    args = ap.parse_args()
    if args.decode_ab:  # add the interleaved decode A/B to a saved run, then render it
        saved = json.loads(Path(args.out + ".json").read_text())
        cfg = saved["config"]
        config = EngineConfig(model=args.model, dtype=cfg["dtype"], max_model_len=cfg["max_model_len"],
                              max_num_seqs=cfg["max_num_seqs"], kv_cache_memory=cfg["kv_cache_memory_gib"], seed=0)
        saved["decode_ab"] = decode_ab(config, rounds=4, steps=6, batch=8, prompt_len=256)
        saved["decode_ab"]["loadavg_at_end"] = machine_info()["loadavg_at_end"]
        Path(args.out + ".json").write_text(json.dumps(saved, indent=2) + "\n")
        args.render = True
    if args.render:
        saved = json.loads(Path(args.out + ".json").read_text())
        result = report({k: v for k, v in saved.items() if k not in ("kind", "title", "headline")})
        print_report(result)
        write_report(result, args.out)
        return
    batches, contexts, repeats = [1, 4, 16, 32], [1024, 4096, 16384], 3
    if args.quick:
        args.model, args.requests, args.max_prompt, args.max_output = "cinq-tiny", 12, 200, 24
        args.prefix_requests = 4
        batches, contexts, repeats = [1, 8], [1024, 4096], 2
    config = EngineConfig(model=args.model, dtype="bfloat16", max_model_len=1024, max_num_seqs=16,
                          kv_cache_memory=0.25, seed=0)
    random.seed(0)
    data: dict[str, Any] = {"config": {"model": args.model, "dtype": config.dtype, "max_model_len": 1024,
                                       "max_num_seqs": 16, "kv_cache_memory_gib": 0.25, "block_size": 16},
                            "options": vars(args), "machine": machine_info()}
    data["draft"], data["conditions"] = run_conditions(os.getloadavg()[0])
    warm = argparse.Namespace(**{**vars(args), "requests": 4, "concurrency": 4})
    for layout in LAYOUTS:  # oneDNN primitives, native kernels, the tokenizer: paid before either layout is timed
        churn(config, layout, warm)
    data["churn"] = []
    for layout in LAYOUTS:
        data["churn"].append(churn(config, layout, args))
        print(f"churn {layout}: {data['churn'][-1]['duration_s']:.0f} s", flush=True)
    data["tokens_identical"] = data["churn"][0]["token_ids"] == data["churn"][1]["token_ids"]
    for r in data["churn"]:
        del r["token_ids"]
    print("churn done", flush=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core each: on a shared 2-core machine a second OpenMP thread mostly waits
    data["kernels"] = kernel_grid(batches, contexts, repeats)
    torch.set_num_threads(threads)
    print("kernels done", flush=True)
    data["layers"] = 30
    data["page_sizes"] = page_sizes(30, 100)
    opts = PrefixWorkloadOptions(prefix_len=384, num_requests=args.prefix_requests, suffix_len=32, output_len=16)
    data["prefix"] = [{"layout": name, **prefix(config, name, opts)} for name in LAYOUTS]
    print("prefix done", flush=True)
    data["remap"] = remap_cost(256, 12 << 10)  # 32 tokens of one layer's K in bf16 = 3 pages
    data["code_size"] = code_size()
    data["machine"]["loadavg_at_end"] = machine_info()["loadavg_at_end"]
    result = report(data)
    print_report(result)
    for path in write_report(result, args.out):
        print("wrote", path)


if __name__ == "__main__":
    main()
