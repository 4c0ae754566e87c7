"""Speculative decoding against plain decoding: the same target, the same prompts, the same batch sizes, in one
run. The speculative config is the engine's own flag (``--speculative-config``); plain decoding is that engine
config without it, measured before and after (their mean is the baseline, their ratio the machine's drift).
Greedy decoding, so that "identical output" is checked against plain decoding too."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from cinq.bench.progress import progress_bar
from cinq.bench.report import BenchResult, Table, machine_info, model_label
from cinq.bench.workload import TokenWindows, text_tokens
from cinq.config import EngineConfig
from cinq.errors import InvalidParameterError
from cinq.option_fields import bounded, bounded_each, check_bounds
from cinq.outputs import mean_acceptance_length


@dataclass(slots=True)
class SpecOptions:
    """Batch sizes, prompts (pieces of a shipped text) and tokens generated per request."""

    batch_sizes: tuple[int, ...] = bounded_each((1, 4, 16), ge=1)
    num_prompts: int = bounded(16, ge=1)
    prompt_len: int = bounded(64, ge=1)
    max_tokens: int = bounded(64, ge=1)
    text: str = "held-out"
    seed: int = 0

    def validate(self) -> None:
        check_bounds(self)


class DraftTimer:
    """Wall time spent proposing: the runner's proposer, or the scheduler's drafter (n-gram)."""

    def __init__(self, llm: Any) -> None:
        self.seconds = 0.0
        obj = llm.engine.executor.proposer or llm.engine.scheduler.drafter
        if obj is None:
            return
        real = obj.propose

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0

        obj.propose = timed
        self._restore = (obj, real)

    def close(self) -> None:
        """Put the proposer's own ``propose`` back (an engine measured again gets a fresh timer)."""
        if hasattr(self, "_restore"):
            obj, real = self._restore
            obj.propose = real


def engine(config: EngineConfig) -> Any:
    """An in-process LLM for ``config`` (DraftTimer reaches the proposer: the core must be here)."""
    from cinq.engine.llm import LLM
    return LLM(config.model, engine_core="inproc",
               **{f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "model"})


def measure(config: EngineConfig | Any, prompts: list[list[int]], batch: int, max_tokens: int,
            temperature: float = 0.0, top_p: float = 1.0, ignore_eos: bool = True) -> dict[str, Any]:
    """Generation of ``max_tokens`` for every prompt (at least ``batch`` requests, prompts reused), in waves of
    ``batch`` requests decoding together, in a fresh engine after a short warm-up: tokens/s, tau, acceptance per
    position, the share of time spent drafting, and the outputs (to compare). Greedy by default; with a
    ``temperature``, request i is seeded with i, so plain and speculative runs draw with the same seeds.
    ``config``: an EngineConfig (a fresh engine), or an ``engine(config)`` to measure again (loading once; an
    adaptive engine keeps what it learned at other batch sizes, as a serving engine would). ``ignore_eos`` False:
    a request ends at its end of text (a task whose answer is the work, not what the model writes after it);
    ``tokens_per_step`` counts every forward of a request, with drafts or without (tau only the drafted ones);
    ``decode_tok_s`` the tokens after each request's first over the time after each wave's last first token."""
    from cinq.sampling_params import SamplingParams
    llm = engine(config) if isinstance(config, EngineConfig) else config
    todo = [prompts[i % len(prompts)] for i in range(max(batch, len(prompts)))]
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, ignore_eos=ignore_eos,
                             seed=i if temperature > 0 else None) for i in range(len(todo))]
    llm.generate(todo[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up: kernels, allocator
    timer = DraftTimer(llm)
    adaptive = getattr(llm.engine.scheduler.drafter, "adaptive", None)
    chosen_before = list(adaptive.times_chosen) if adaptive else []
    before = llm.engine.get_stats()
    outs, t0, to_first = [], time.perf_counter(), 0.0
    try:
        for at in range(0, len(todo), batch):
            start = time.time()  # the clock of the outputs' metrics
            wave = llm.generate(todo[at:at + batch], params[at:at + batch])
            firsts = [o.metrics.first_token_time for o in wave if o.metrics and o.metrics.first_token_time]
            to_first += max(firsts) - start if firsts else 0.0
            outs += wave
    finally:
        timer.close()
    elapsed = time.perf_counter() - t0
    st = llm.engine.get_stats()
    drafts = st.spec_decode_num_drafts - before.spec_decode_num_drafts
    accepted = st.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    per_pos = [a - (before.spec_decode_num_accepted_tokens_per_pos[i]
                    if i < len(before.spec_decode_num_accepted_tokens_per_pos) else 0)
               for i, a in enumerate(st.spec_decode_num_accepted_tokens_per_pos)]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    chosen = [a - b for a, b in zip(adaptive.times_chosen, chosen_before)] if adaptive else []
    return {"k_share": [round(c / max(sum(chosen), 1), 3) for c in chosen],
            "step_seconds": {f"{b},{k}": s for (b, k), s in sorted(adaptive.step_seconds.items())} if adaptive else {},
            "tok_s": tokens / elapsed, "seconds": elapsed, "tokens": tokens,
            # after every request of a wave has its first token: what speculation can speed up (prefill it cannot)
            "decode_tok_s": (tokens - len(outs)) / max(elapsed - to_first, 1e-9),
            "tau": mean_acceptance_length(accepted, drafts),
            # each forward of a request gives one token plus those of its drafts it accepted
            "tokens_per_step": tokens / max(tokens - accepted, 1),
            "accept_per_pos": [round(a / drafts, 3) for a in per_pos] if drafts else [],
            "draft_share": timer.seconds / elapsed, "outputs": [o.outputs[0].token_ids for o in outs]}


def compare(label: dict[str, Any], base: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One row: the label, plain and speculative tokens/s, the speedup, tau, acceptance, greedy identity and the
    mismatch rate (the fraction of outputs that differ from plain decoding's: bf16 near-ties flip under the
    verify step's other row count, then the continuations part)."""
    differ = sum(a != b for a, b in zip(spec["outputs"], base["outputs"]))
    return {**label, "plain_tok_s": base["tok_s"], "spec_tok_s": spec["tok_s"],
            "speedup": spec["tok_s"] / base["tok_s"], "tau": spec["tau"], "accept_per_pos": spec["accept_per_pos"],
            "decode_speedup": spec["decode_tok_s"] / base["decode_tok_s"] if "decode_tok_s" in base else None,
            "tokens_per_step": spec.get("tokens_per_step"),
            "draft_share": spec["draft_share"], "greedy_identical": differ == 0, "step_seconds": spec["step_seconds"],
            "k_share": spec["k_share"],
            "mismatch_rate": differ / max(len(base["outputs"]), 1)}


def run_spec(config: EngineConfig, options: SpecOptions, progress: bool = True) -> BenchResult:
    """Plain, speculative, plain again at each batch size."""
    if config.speculative_config is None:
        raise InvalidParameterError("cinq bench spec needs --speculative-config (the method to measure against "
                                    "plain decoding)", "speculative_config")
    options.validate()
    from cinq.model.tokenizer import Tokenizer
    from cinq.config import resolve_model
    folder = resolve_model(config.model)
    tokens = text_tokens(Tokenizer.from_pretrained(config.tokenizer or folder), options.text)
    text = TokenWindows(tokens, start=options.seed * 7919)
    prompts = [text.take(options.prompt_len) for _ in range(options.num_prompts)]
    plain_cfg = dataclasses.replace(config, speculative_config=None)
    bar = progress_bar(3 * len(options.batch_sizes), "spec", progress, unit="run")
    rows = []
    for batch in options.batch_sizes:
        base = measure(plain_cfg, prompts, batch, options.max_tokens)
        bar.update(1)
        spec = measure(config, prompts, batch, options.max_tokens)
        bar.update(1)
        again = measure(plain_cfg, prompts, batch, options.max_tokens)
        bar.update(1)
        drift = again["tok_s"] / base["tok_s"]
        base["tok_s"] = (base["tok_s"] + again["tok_s"]) / 2
        rows.append(compare({"batch": batch, "baseline_drift": round(drift, 3)}, base, spec))
    bar.close()
    sc = config.speculative_config
    data = {"config": {"model": model_label(folder), "dtype": config.dtype,
                       "speculative_config": dataclasses.asdict(sc)},
            "options": dataclasses.asdict(options), "machine": machine_info(), "rows": rows}
    return _result(data)


def _result(data: dict[str, Any]) -> BenchResult:
    sc = data["config"]["speculative_config"]
    name = f"{sc['method']} (k={sc['num_speculative_tokens']}{', adaptive' if sc['adaptive'] else ''})"
    table = Table(f"Plain decoding vs {name}", ["batch", "plain tok/s (baseline)", f"{sc['method']} tok/s",
                                               "speedup", "tau", "acceptance per position", "draft share (%)",
                                               "greedy identical", "baseline drift"])
    for r in data["rows"]:
        table.rows.append([r["batch"], r["plain_tok_s"], r["spec_tok_s"], r["speedup"], r["tau"],
                           ", ".join(f"{a:.2f}" for a in r["accept_per_pos"]), 100 * r["draft_share"],
                           r["greedy_identical"], r["baseline_drift"]])
    o, m = data["options"], data["machine"]
    setup = (f"Target {data['config']['model']} ({data['config']['dtype']}), speculative config "
             f"`{ {k: v for k, v in sc.items() if v not in (None, [], False)} }`. {o['num_prompts']} prompts of "
             f"{o['prompt_len']} tokens cut from the `{o['text']}` text, {o['max_tokens']} new tokens each (greedy, "
             f"ignore_eos), in waves of `batch` requests. Plain decoding ran before and after the speculative run; "
             f"the baseline is their mean, the drift their ratio. CPU threads {m['threads']}; load average at end "
             f"{m['loadavg_at_end']}.")
    headline = f"{sc['method']} / plain decoding tokens/s: " + ", ".join(
        f"{r['speedup']:.2f}x (batch {r['batch']})" for r in data["rows"])

    def plot(fig: Any) -> None:
        ax1, ax2 = fig.subplots(1, 2)
        batches = [str(r["batch"]) for r in data["rows"]]
        x = range(len(batches))
        ax1.bar([j - 0.2 for j in x], [r["plain_tok_s"] for r in data["rows"]], width=0.4, label="plain")
        ax1.bar([j + 0.2 for j in x], [r["spec_tok_s"] for r in data["rows"]], width=0.4, label=sc["method"])
        ax1.set_xticks(list(x), batches)
        ax1.set_xlabel("batch size")
        ax1.set_title("output tokens/s")
        ax1.legend()
        ax2.plot(batches, [r["speedup"] for r in data["rows"]], "o-")
        ax2.axhline(1.0, color="gray", ls=":")
        ax2.set_xlabel("batch size")
        ax2.set_title("speedup over plain decoding")

    return BenchResult("spec", f"Speculative decoding ({name}) vs plain decoding (same target, same prompts, "
                       "one run)", setup, [table], headline, data, plot=plot)
