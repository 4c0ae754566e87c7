"""EAGLE-3's reduced draft vocabulary on SmolLM2-135M-Instruct: coverage against head cost, per N.

For each draft vocabulary size N (the N tokens the target wrote most often in the head's training set,
cinq/spec/draft_vocab.py) it reports the coverage (share of the target's held-out greedy tokens inside the set:
an upper bound on any head's acceptance per draft, per language) and the cost of a head step with that LM head:
multiply-adds per token against the target's (its layers and LM head), and measured time of an ``Eagle3Head``
forward plus its logits at M = 1 and M = 8 rows (float32 and bf16) next to the target's full-vocabulary LM head
alone, measured in the same run.

Needs the target sequences a `cinq distill --heads eagle3 --data chat` run cached (``--run``).

    python benchmarks/speculative_draft_vocab.py --run runs/eagle3-smollm2   # ~2 min
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cinq.process_env import set_omp_wait_policy  # noqa: E402

set_omp_wait_policy()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cinq.bench.report import BenchResult, Table, machine_info, print_report, run_conditions, write_report  # noqa: E402
from cinq.config import resolve_model  # noqa: E402
from cinq.spec.draft_vocab import coverage, frequent_tokens  # noqa: E402
from cinq.spec.eagle3 import new_eagle3_head  # noqa: E402
from cinq.train.distill import load_teacher  # noqa: E402
from cinq.train.spec_head_data import TargetSequences  # noqa: E402
from cinq.train.spec_heads import generated_tokens  # noqa: E402

SIZES = (1024, 2048, 4096, 8192, 16384, 32768, 49152)


def _time(fn: Any, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def _sets(run: Path) -> tuple[TargetSequences, TargetSequences]:
    found = {split: sorted(run.glob(f"target-{split}-*.npz")) for split in ("train", "test")}
    if not found["train"] or not found["test"]:
        sys.exit(f"{run}: no cached target sequences (run `cinq distill --heads eagle3 --data chat --out {run}`)")
    return TargetSequences.load(found["train"][-1]), TargetSequences.load(found["test"][-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/eagle3-smollm2", help="head run folder holding the cached sequences")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "speculative_draft_vocab"))
    args = ap.parse_args()
    draft, note = run_conditions(os.getloadavg()[0])
    train, test = _sets(Path(args.run))
    target = load_teacher(resolve_model("smollm2-135m-instruct"))
    vocab, hidden = target.config.vocab_size, target.config.hidden_size
    train_tokens = generated_tokens(train)
    langs = sorted(set(test.langs.tolist()))
    held = {lang: np.concatenate([test.sequence(i)[int(test.prompt_lens[i]):] for i in range(len(test))
                                  if test.langs[i] == lang]) for lang in langs}
    c = target.config  # from the shapes: a GGUF target's weights are buffers, not parameters
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    target_macs = c.num_hidden_layers * (hidden * (2 * q + 2 * kv) + 3 * hidden * c.intermediate_size) \
        + vocab * hidden
    with torch.inference_mode():
        full_head = {m: _time(lambda m=m: target.compute_logits(torch.randn(m, hidden)), args.reps) for m in (1, 8)}
    rows, data = [], []
    for n in SIZES:
        ids = frequent_tokens(train_tokens, n, vocab)
        cov = {lang: coverage(ids, held[lang], vocab) for lang in langs}
        all_cov = coverage(ids, np.concatenate(list(held.values())), vocab)
        head = new_eagle3_head(target, ids).eval()
        cost: dict[str, float] = {}
        for dtype in (torch.float32, torch.bfloat16):
            h = head.to(dtype)
            for m in (1, 8):
                tok = torch.randint(0, vocab, (1, m))
                feat = torch.randn(1, m, hidden, dtype=dtype)
                pos = torch.arange(m)[None]
                with torch.inference_mode():
                    cost[f"{str(dtype)[6:]}_m{m}"] = _time(lambda: h.draft_logits(h(tok, feat, pos, None)[1]),
                                                           args.reps)
        macs = (3 * hidden * hidden + sum(p.numel() for n_, p in head.named_parameters()
                                          if n_.startswith("layers.")) + n * hidden)
        data.append({"n": n, "coverage": all_cov, "coverage_per_language": cov, "head_ms": cost,
                     "head_macs_per_token": macs})
        rows.append([n, f"{all_cov:.3f}", f"{min(cov.values()):.3f} ({min(cov, key=cov.get)})",
                     f"{macs / 1e6:.1f}", f"{cost['float32_m1']:.2f}", f"{cost['bfloat16_m1']:.2f}",
                     f"{cost['float32_m8']:.2f}", f"{macs / target_macs:.3f}"])
    table = Table("Draft vocabulary N: coverage of the target's held-out tokens and head step cost",
                  ["N", "coverage", "worst language", "head MMAC/token", "head ms f32 M=1", "head ms bf16 M=1",
                   "head ms f32 M=8", "head / target MAC"], rows)
    pick = next((d for d in data if d["coverage"] >= 0.9), data[-1])
    result = BenchResult(
        "speculative_draft_vocab", "EAGLE-3 draft vocabulary size on SmolLM2-135M-Instruct",
        f"{note} Target: SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, float32; {target_macs / 1e6:.0f} MMAC per "
        f"token); its full LM head {full_head[1]:.2f} ms (M=1) / {full_head[8]:.2f} ms (M=8). Train set "
        f"{len(train)} sequences ({train_tokens.size} generated tokens), held-out {len(test)} "
        f"({sum(v.size for v in held.values())} tokens, {', '.join(langs)}).",
        [table], f"smallest N with >= 90% held-out coverage: {pick['n']} ({pick['coverage']:.3f}); its head step "
        f"{pick['head_ms']['float32_m1']:.2f} ms vs the full-vocabulary one "
        f"{data[-1]['head_ms']['float32_m1']:.2f} ms (f32, M=1)",
        {"draft": draft, "machine": machine_info(), "target_macs_per_token": target_macs, "full_lm_head_ms": full_head,
         "sizes": data, "train_sequences": len(train), "held_out_sequences": len(test)})
    print_report(result)
    write_report(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
