"""The quantization quality report: perplexity AND reasoning accuracy, per model folder, in one table with
deltas against the first (float) model, plus a plot.

Perplexity alone hides what low-bit weights lose on multi-step reasoning (arXiv 2505.11574), so every row also
carries exact-match accuracy on held-out arithmetic word problems with worked steps (cinq.eval.tasks),
answered by greedy generation. Each folder is loaded the way the engine loads it (the quantization method
comes from its config.json), so the numbers are those of the served model.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# generate(folder, prompts, max_new_tokens, dtype) -> (completions, generated tokens per second)
GenerateFn = Callable[[Path, list[str], int, str], tuple[list[str], float]]


@dataclass(slots=True)
class ModelQuality:
    """One row of the report."""

    label: str
    path: str
    method: str  # "float" for unquantized models
    bits: int | None
    weight_bytes: int  # all tensors of the checkpoint
    perplexity: float | None
    accuracy: float | None
    n_problems: int
    gen_tokens_per_s: float | None = None
    kl_vs_base: float | None = None  # mean KL(base || model) per token on the perplexity text, nats
    top1_vs_base: float | None = None  # fraction of those tokens where both models' argmax agree
    step_accuracy: float | None = None  # worked steps reproduced exactly after the correct earlier steps
    n_steps: int = 0


@dataclass(slots=True)
class QualityReport:
    """Rows plus the rendering: markdown table with deltas vs the first row, JSON, plot."""

    rows: list[ModelQuality]
    ppl_source: str = ""
    task: str = "arithmetic"

    def to_markdown(self) -> str:
        base = self.rows[0] if self.rows else None
        head = ("| model | method | bits | weight MiB | size vs base | perplexity | Δppl | KL vs base | "
                f"top-1 = base | {self.task} acc | Δacc | step acc | Δstep | gen tok/s |")
        lines = [head, "|" + "---|" * 14]
        for r in self.rows:
            size = f"{r.weight_bytes / base.weight_bytes:.2f}x" if base and base.weight_bytes else "-"
            dppl = _delta(r.perplexity, base.perplexity if base else None, pct=True)
            dacc = _delta(None if r.accuracy is None else 100 * r.accuracy,
                          None if base is None or base.accuracy is None else 100 * base.accuracy, unit=" pt")
            dstep = _delta(None if r.step_accuracy is None else 100 * r.step_accuracy,
                           None if base is None or base.step_accuracy is None else 100 * base.step_accuracy,
                           unit=" pt")
            lines.append(
                f"| {r.label} | {r.method} | {r.bits or '-'} | {r.weight_bytes / 2**20:.2f} | {size} | "
                f"{_fmt(r.perplexity, '.3f')} | {dppl} | {_fmt(r.kl_vs_base, '.5f')} | "
                f"{'-' if r.top1_vs_base is None else f'{100 * r.top1_vs_base:.1f}%'} | "
                f"{'-' if r.accuracy is None else f'{100 * r.accuracy:.1f}%'} | {dacc} | "
                f"{'-' if r.step_accuracy is None else f'{100 * r.step_accuracy:.1f}%'} | {dstep} | "
                f"{_fmt(r.gen_tokens_per_s, '.1f')} |")
        ppl = (f"perplexity on {self.ppl_source}; KL vs base / top-1: next-token distributions against the "
               f"first row's on the first tokens of that text" if self.ppl_source else "no perplexity text given")
        note = f"\n{ppl}; accuracy: exact match over " \
               f"{self.rows[0].n_problems} held-out {self.task} problems (greedy); step acc: each of their " \
               f"{self.rows[0].n_steps} worked steps generated after the correct earlier steps, exact match of " \
               f"the line." if self.rows else ""
        return "\n".join(lines) + note + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"ppl_source": self.ppl_source, "task": self.task, "rows": [asdict(r) for r in self.rows]}

    def save(self, folder: str | Path, name: str = "quality") -> list[Path]:
        """Write <name>.md, <name>.json and (with matplotlib) <name>.png into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        md, js = folder / f"{name}.md", folder / f"{name}.json"
        md.write_text(self.to_markdown())
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        out = [md, js]
        png = self.plot(folder / f"{name}.png")
        if png is not None:
            out.append(png)
        return out

    def plot(self, path: str | Path) -> Path | None:
        """Bar charts of Δperplexity, KL to the base, accuracy and size per model; None without matplotlib."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("matplotlib is not installed: no plot")
            return None
        labels = [r.label for r in self.rows]
        base = self.rows[0]
        series = [("Δ perplexity % vs base", [100 * ((r.perplexity or 0) / base.perplexity - 1)
                                              if base.perplexity else 0.0 for r in self.rows]),
                  ("KL(base || model) per token", [r.kl_vs_base or 0.0 for r in self.rows]),
                  (f"{self.task} accuracy %", [100 * (r.accuracy or 0.0) for r in self.rows]),
                  ("step accuracy %", [100 * (r.step_accuracy or 0.0) for r in self.rows]),
                  ("weights MiB", [r.weight_bytes / 2**20 for r in self.rows])]
        fig, axes = plt.subplots(1, len(series), figsize=(4 + 2.0 * len(labels), 3.6))
        for ax, (title, values) in zip(axes, series):
            ax.bar(range(len(labels)), values, color=["#777"] + ["#3a7"] * (len(labels) - 1))
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
            ax.set_title(title, fontsize=9)
            ax.axhline(0, color="black", linewidth=0.6)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _delta(v: float | None, base: float | None, pct: bool = False, unit: str = "") -> str:
    if v is None or base is None:
        return "-"
    if pct:
        return f"{100 * (v - base) / base:+.1f}%" if base else "-"
    return f"{v - base:+.1f}{unit}"


def describe_folder(path: Path) -> tuple[str, int | None, int]:
    """(method, bits, tensor bytes) of a model folder."""
    from safetensors import safe_open

    from cinq.model.loader import checkpoint_files
    cfg = json.loads((path / "config.json").read_text())
    qc = cfg.get("quantization_config")
    if qc:
        from cinq.quant.config import QuantConfig
        q = QuantConfig.from_hf(qc)
        method, bits = (f"{q.method} ({q.format})", q.bits)
    else:
        method, bits = "float", None
    total = 0
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                numel = math.prod(sl.get_shape())
                total += numel * _dtype_bytes(sl.get_dtype())
    return method, bits, total


def _dtype_bytes(name: str) -> int:
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1,
            "BOOL": 1}.get(name, 4)


def engine_generate(path: Path, prompts: list[str], max_new_tokens: int, dtype: str) -> tuple[list[str], float]:
    """Greedy completions through the serving engine (paged KV cache, batching)."""
    from cinq import LLM, SamplingParams
    llm = LLM(str(path), dtype=dtype)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop=["\nQuestion:"])
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    texts = [o.outputs[0].text for o in outs]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return texts, tokens / max(seconds, 1e-9)


def simple_generate(path: Path, prompts: list[str], max_new_tokens: int, dtype: str) -> tuple[list[str], float]:
    """Greedy completions without the engine: batched full recomputation per token (right padding is harmless
    under causal attention). Quadratic in length: for small models and tests."""
    from cinq.eval.tasks import extract_answer
    from cinq.model.loader import load_model
    from cinq.model.tokenizer import Tokenizer
    model = load_model(path, dtype=dtype)
    tok = Tokenizer.from_pretrained(path)
    eos = set(tok.eos_token_ids)
    seqs = [tok.encode(p) for p in prompts]
    starts = [len(s) for s in seqs]
    done = [False] * len(seqs)
    start, generated = time.perf_counter(), 0
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            live = [i for i, d in enumerate(done) if not d]
            if not live:
                break
            width = max(len(seqs[i]) for i in live)
            ids = torch.zeros(len(live), width, dtype=torch.long)
            for row, i in enumerate(live):
                ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
            hidden = model(ids)
            last = torch.tensor([len(seqs[i]) - 1 for i in live])
            nxt = model.compute_logits(hidden[torch.arange(len(live)), last]).argmax(-1).tolist()
            for i, t in zip(live, nxt):
                seqs[i].append(t)
                generated += 1
                text = tok.decode(seqs[i][starts[i]:])
                if t in eos or "\nQuestion:" in text or (extract_answer(text) is not None and text.endswith("\n")):
                    done[i] = True
    seconds = time.perf_counter() - start
    texts = [tok.decode(s[st:]).split("\nQuestion:")[0] for s, st in zip(seqs, starts)]
    return texts, generated / max(seconds, 1e-9)


def compare_to_base(base: Any, model: Any, token_ids: Sequence[int], context_len: int = 256,
                    max_tokens: int = 8192) -> tuple[float, float]:
    """(mean KL(base || model) per token, top-1 agreement) over the first ``max_tokens`` tokens, in windows of
    ``context_len``: how far a quantized model's next-token distributions moved, which perplexity averages
    away."""
    import torch.nn.functional as F
    ids = torch.as_tensor(list(token_ids)[:max_tokens], dtype=torch.long)
    kl_sum, agree, count = 0.0, 0, 0
    with torch.inference_mode():
        for lo in range(0, ids.numel() - 1, context_len):
            window = ids[lo:lo + context_len].unsqueeze(0)
            a = base.compute_logits(base(window)).float().log_softmax(-1)
            b = model.compute_logits(model(window)).float().log_softmax(-1)
            kl_sum += float(F.kl_div(b, a, log_target=True, reduction="sum"))
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            count += window.shape[1]
    return kl_sum / max(count, 1), agree / max(count, 1)


def evaluate_model(path: str | Path, ppl_tokens_text: str, problems: Sequence[Any], label: str | None = None,
                   dtype: str = "bfloat16", context_len: int = 256, max_new_tokens: int = 96,
                   generate: GenerateFn | None = None, base: Any = None) -> ModelQuality:
    """Perplexity of ``ppl_tokens_text`` and accuracy on ``problems`` for one model folder; with ``base`` (a
    loaded model), also its KL and top-1 agreement against it."""
    from cinq.eval.perplexity import perplexity_of_text
    from cinq.eval.tasks import accuracy, step_accuracy, step_items
    from cinq.model.loader import load_model
    from cinq.model.tokenizer import Tokenizer
    path = Path(path)
    method, bits, nbytes = describe_folder(path)
    ppl = kl = top1 = None
    if ppl_tokens_text:
        from cinq.eval.perplexity import encode_text
        model = load_model(path, dtype=dtype)
        tok = Tokenizer.from_pretrained(path)
        ppl = perplexity_of_text(model, tok, ppl_tokens_text, context_len=context_len)
        if base is not None:
            kl, top1 = compare_to_base(base, model, encode_text(tok, ppl_tokens_text), context_len)
        del model
    acc = tps = step_acc = None
    items = step_items(problems)
    if problems:
        gen = generate or engine_generate
        completions, tps = gen(path, [p.prompt() for p in problems], max_new_tokens, dtype)
        acc = accuracy(problems, completions)
        step_acc = step_accuracy(items, gen(path, [it.prompt for it in items], 16, dtype)[0])
    return ModelQuality(label or path.name, str(path), method, bits, nbytes, ppl, acc, len(problems), tps, kl, top1,
                        step_acc, len(items))


def quality_report(models: Sequence[str | Path] | Mapping[str, str | Path], ppl_text: str = "",
                   ppl_source: str = "", n_problems: int = 100, seed: int = 0, split: str = "test",
                   dtype: str = "bfloat16", context_len: int = 256, max_new_tokens: int = 96,
                   generate: GenerateFn | None = None, task: str = "arithmetic") -> QualityReport:
    """Evaluate every folder (the first is the baseline of the deltas) on the same text and problems of
    ``task`` ("arithmetic" or "arithmetic-easy")."""
    from cinq.errors import InvalidParameterError
    from cinq.eval.tasks import TASKS, arithmetic_problems
    if task not in TASKS:
        raise InvalidParameterError(f"task must be one of {sorted(TASKS)}, got {task!r}", "task")
    items = list(models.items()) if isinstance(models, Mapping) else [(Path(p).name, p) for p in models]
    problems = arithmetic_problems(n_problems, seed=seed, split=split, level=TASKS[task]) if n_problems > 0 else []
    from cinq.model.loader import load_model
    rows = []
    base = load_model(items[0][1], dtype=dtype) if ppl_text and len(items) > 1 else None
    for i, (label, path) in enumerate(items):
        log.info("evaluating %s (%s)", label, path)
        rows.append(evaluate_model(path, ppl_text, problems, label, dtype, context_len, max_new_tokens, generate,
                                   base if i else None))
    if base is not None:
        rows[0].kl_vs_base, rows[0].top1_vs_base = 0.0, 1.0
    return QualityReport(rows, ppl_source, task)
