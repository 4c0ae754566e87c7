"""xgrammar vs llguidance on this CPU, on the SmolLM2 tokenizer (49k vocabulary): compile time per schema and
mask-fill time per token at batch 1 and 32, over the benchmark schema suite. Writes
benchmarks/results/structured_backends.md (+ .json). Run: python benchmarks/structured_backends.py"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.* beside cinq when run as a script

from cinq.assets import resolve_model_path  # noqa: E402
from cinq.engine.structured_outputs import grammar_tokenizer  # noqa: E402
from cinq.structured.bitmask import allocate_bitmask, apply_token_bitmask  # noqa: E402
from cinq.structured.manager import BACKENDS, make_backend  # noqa: E402
from cinq.structured.params import StructuredOutputsParams  # noqa: E402
from benchmarks.structured_schemas import schema_suite  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def _walk(backend, compiled, bitmask, row: int, steps: int) -> tuple[list[int], float]:
    """Greedily walk a matcher: fill the mask, take the lowest allowed non-stop token. Returns the tokens and
    the mean fill time."""
    import torch
    m = backend.matcher(compiled)
    tokens, fill = [], 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        m.fill_bitmask(bitmask, row)
        fill += time.perf_counter() - t0
        allowed = torch.nonzero(((bitmask[row].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1)
                                .view(-1)).flatten().tolist()
        pick = [t for t in allowed if t > 10] or allowed
        if not pick:
            break
        tok = pick[(len(tokens) * 7919) % len(pick)]
        if not m.accept_token(tok) or m.is_terminated():
            break
        tokens.append(tok)
    return tokens, fill / max(1, len(tokens))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--schemas", type=int, default=60)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    import torch
    path = resolve_model_path(args.model)
    vocab = 49152
    specs = [StructuredOutputsParams(json=s) for s in schema_suite(args.schemas)]
    rows = {}
    for name in BACKENDS:
        t0 = time.perf_counter()
        backend = make_backend(name, grammar_tokenizer(path), vocab)
        setup = time.perf_counter() - t0
        compile_s, compiled = [], []
        for spec in specs:
            t0 = time.perf_counter()
            compiled.append(backend.compile(spec))
            compile_s.append(time.perf_counter() - t0)
        # batch 1: one matcher's fill per token; batch 32: 32 matchers (different schemas) filled each step
        bm = allocate_bitmask(32, vocab)
        fills1 = [_walk(backend, c, bm, 0, args.steps)[1] for c in compiled[:20]]
        matchers = [backend.matcher(compiled[i % len(compiled)]) for i in range(32)]
        t0 = time.perf_counter()
        reps = 10
        for _ in range(reps):
            for r, m in enumerate(matchers):
                m.fill_bitmask(bm, r)
        fill32 = (time.perf_counter() - t0) / reps
        logits = torch.randn(32, vocab)
        t0 = time.perf_counter()
        for _ in range(reps):
            apply_token_bitmask(logits, bm)
        apply32 = (time.perf_counter() - t0) / reps
        rows[name] = {
            "tokenizer_setup_s": setup,
            "compile_ms_mean": 1e3 * statistics.mean(compile_s), "compile_ms_median": 1e3 * statistics.median(compile_s),
            "compile_ms_max": 1e3 * max(compile_s),
            "fill_ms_per_token_batch1": 1e3 * statistics.mean(fills1),
            "fill_ms_per_step_batch32": 1e3 * fill32,
            "apply_ms_per_step_batch32": 1e3 * apply32,
        }
        print(name, json.dumps({k: round(v, 3) for k, v in rows[name].items()}))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "structured_backends.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["# Grammar backends on this CPU (DRAFT: 2-core machine shared with other jobs)", "",
             f"SmolLM2-135M-Instruct tokenizer ({vocab} tokens), {len(specs)} JSON schemas of the benchmark suite "
             "(benchmarks/structured_schemas.py). Fill = computing one row's allowed-token bitmask at the matcher's "
             "state (first-state fills included); batch 32 = 32 matchers on different schemas, filled one after "
             "another in one thread. Apply = cinq.structured.bitmask.apply_token_bitmask (xgrammar native kernel) over 32 rows.", "",
             "| backend | tokenizer setup s | compile ms mean / median / max | fill ms/token b=1 | fill ms/step b=32 "
             "| apply ms/step b=32 |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['tokenizer_setup_s']:.2f} | {r['compile_ms_mean']:.1f} / "
                     f"{r['compile_ms_median']:.1f} / {r['compile_ms_max']:.1f} | {r['fill_ms_per_token_batch1']:.3f} "
                     f"| {r['fill_ms_per_step_batch32']:.2f} | {r['apply_ms_per_step_batch32']:.2f} |")
    lines += ["", "Generated by `benchmarks/structured_backends.py`."]
    (RESULTS / "structured_backends.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
