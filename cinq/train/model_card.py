"""Ship a finished run: copy its model folder, evaluate it on held-out data, and write the model card
(README.md) with the data manifest, config, tokens seen, training time, per-language perplexity, arithmetic
accuracy and the commands that reproduce it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from cinq.markdown_table import markdown_table
from cinq.plan.cpu import cpu_label
from cinq.train.evaluate import evaluate_folder

SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json")



def ship_run(run_dir: str | Path, dest: str | Path, data_dir: str | Path, name: str, description: str,
             commands: list[str], teacher: Any = None, n_arith: int = 300,
             continued_from: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy ``run_dir/model`` to ``dest``, evaluate it, write ``training.json``, ``data_manifest.json``, the loss
    curve and ``README.md``; returns the evaluation. ``continued_from`` is the ``training.json`` of the model
    this run started from (an anneal): its stages are kept in front of this one."""
    run_dir, dest, data_dir = Path(run_dir), Path(dest), Path(data_dir)
    dest.mkdir(parents=True, exist_ok=True)
    # The version this one replaces, for the card's before/after rows (kept in the card once written).
    previous = json.loads((dest / "eval.json").read_text()) if (dest / "eval.json").is_file() else None
    for f in SHIPPED_FILES:
        src = run_dir / "model" / f
        if src.is_file():
            shutil.copyfile(src, dest / f)
    summary = json.loads((run_dir / "summary.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    hist = history["history"]
    training = {
        "tokens_seen": summary["tokens_seen"], "steps": summary["step"], "elapsed_s": summary["elapsed_s"],
        "tokens_per_s": summary["tokens_seen"] / max(summary["elapsed_s"], 1e-9),
        "final_train_loss": hist[-1]["loss"] if hist else None,
        "final_val": history["evals"][-1] if history["evals"] else None,
        "settings": {k: v for k, v in history["settings"].items() if k not in ("out_dir", "progress", "extra")},
        "cpu": cpu_label(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "commands": commands,
    }
    if continued_from is not None:
        earlier = continued_from.get("stages") or [
            {k: continued_from.get(k) for k in ("tokens_seen", "steps", "elapsed_s", "settings")}]
        training["stages"] = [*earlier, {k: training[k] for k in ("tokens_seen", "steps", "elapsed_s", "settings")}]
    (dest / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    manifest = json.loads((data_dir / "manifest.json").read_text())
    (dest / "data_manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if (run_dir / "loss_curve.png").is_file():
        shutil.copyfile(run_dir / "loss_curve.png", dest / "loss_curve.png")
    else:
        try:
            from cinq.train.plots import plot_loss_curves
            plot_loss_curves({name: hist}, dest / "loss_curve.png", evals={name: history["evals"]})
        except ImportError:
            pass
    result = evaluate_folder(dest, data_dir, teacher=teacher, n_arith=n_arith)
    if previous is not None:
        result["previous"] = {k: previous.get(k) for k in ("perplexity", "arithmetic", "arithmetic_easy",
                                                            "kl_to_teacher") if previous.get(k) is not None}
    (dest / "eval.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    (dest / "README.md").write_text(render_card(name, description, dest, training, manifest, result))
    return result


def _schedule(s: dict[str, Any]) -> str:
    frac = s.get("decay_frac", 1.0)
    if frac >= 1.0:
        return f"{s['warmup_steps']} warmup steps, then cosine decay to {s['min_lr_ratio']}x"
    return (f"{s['warmup_steps']} warmup steps, constant, then cosine decay to {s['min_lr_ratio']}x over the last "
            f"{frac:.0%} of the steps after warmup")


def _perplexity_table(result: dict[str, Any]) -> list[str]:
    """Per-language perplexity; with the replaced version's evaluation, its row and the change too."""
    ppl = result["perplexity"]
    before = (result.get("previous") or {}).get("perplexity")
    if not before:
        return [markdown_table(list(ppl), [[f"{v:.2f}" for v in ppl.values()]], "l" * len(ppl)), ""]
    lines = [markdown_table(["", *ppl], [
        ["this version", *(f"{v:.2f}" for v in ppl.values())],
        ["replaced version", *(f"{before[k]:.2f}" if k in before else "—" for k in ppl)],
        ["change", *(f"{ppl[k] / before[k] - 1:+.1%}" if k in before else "—" for k in ppl)]], "l" * (len(ppl) + 1)),
        ""]
    prev = result["previous"]
    for key, label in (("arithmetic", "arithmetic"), ("arithmetic_easy", "arithmetic-easy")):
        if key in prev and key in result:
            lines.append(f"The replaced version scored {prev[key]['accuracy']:.1%} on {label} "
                         f"({prev[key]['problems']} problems); this one {result[key]['accuracy']:.1%}.")
    return lines + [""]


def _stage_rows(training: dict[str, Any]) -> list[list[str]]:
    """For a model trained in stages (a pre-training run, then an anneal): one row per earlier stage."""
    stages = training.get("stages") or []
    rows = []
    for i, st in enumerate(stages[:-1], 1):
        rows.append([f"before this run: stage {i}", f"{st['tokens_seen']:,} tokens in {st['elapsed_s'] / 60:.1f} min, "
                     f"lr {st['settings']['lr']}"])
    if rows:
        total = sum(st["tokens_seen"] for st in stages)
        rows.append(["tokens seen, all stages", f"{total:,}"])
    return rows


def render_card(name: str, description: str, folder: Path, training: dict[str, Any], manifest: dict[str, Any],
                result: dict[str, Any]) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    s = training["settings"]
    lines = [f"# {name}", "", description, "",
             "## Reproduce", "", "```sh", *training["commands"], "```", "",
             "## Model", "",
             markdown_table(["field", "value"], [
                 ["architecture", f"{cfg['architectures'][0]} (loads in cinq and in `transformers`)"],
                 ["parameters", f"{result['parameters']:,} ({result['parameters'] / 1e6:.2f}M, tied embeddings)"],
                 *([key, str(cfg.get(key))] for key in (
                     "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "torch_dtype"))],
                 "ll")]
    val = training.get("final_val") or {}
    lines += ["", "## Training", "",
              markdown_table(["field", "value"], [
                  ["tokens seen", f"{training['tokens_seen']:,} ({training['steps']} steps x {s['batch_size']} x "
                                  f"{s['seq_len']})"],
                  ["training time", f"{training['elapsed_s'] / 60:.1f} min on {training['cpu']} "
                                    f"({training['torch_threads']} torch thread(s), shared machine; "
                                    f"{training['tokens_per_s']:.0f} tokens/s)"],
                  *_stage_rows(training),
                  ["optimiser", f"AdamW lr {s['lr']}, betas ({s['beta1']}, {s['beta2']}), weight decay "
                                f"{s['weight_decay']}, grad clip {s['grad_clip']}"],
                  ["schedule", _schedule(s)],
                  ["precision", "bf16 autocast on CPU, float32 master weights, shipped as bf16"],
                  ["final train loss", f"{training['final_train_loss']:.3f}"],
                  ["final validation loss", f"{val.get('val_loss', float('nan')):.3f}"]], "ll"), "",
              "![loss curve](loss_curve.png)", "",
              "## Held-out evaluation", "",
              "Perplexity on the corpus test split (documents never trained on), per language:", "",
              *_perplexity_table(result)]
    if "kl_to_teacher" in result:
        lines += [f"Forward KL(teacher || this model) per token on test windows: {result['kl_to_teacher']:.3f}", ""]
    a = result["arithmetic"]
    sample = a["samples"][0]
    lines += [f"Arithmetic (held-out test split, {a['problems']} problems, greedy decoding with cinq's engine, exact "
              f"match on the `Answer:` line): **{a['accuracy']:.1%}**"
              + (f"; each of their {a['steps']} worked steps, generated after the correct earlier steps: "
                 f"**{a['step_accuracy']:.1%}**" if "step_accuracy" in a else ""), "",
              ]
    easy = result.get("arithmetic_easy")
    if easy:
        lines += [f"Arithmetic, easy level (the `arithmetic-easy` task: held-out test split, {easy['problems']} "
                  f"problems whose chains of steps no training problem has, greedy): **{easy['accuracy']:.1%}** "
                  f"(SE {easy['accuracy_se']:.1%}); steps: **{easy['step_accuracy']:.1%}** "
                  f"(SE {easy['step_accuracy_se']:.1%}, clustered by problem)", ""]
        sample = easy["samples"][0]
    lines += ["Example (prompt, then the model's completion):", "", "```", sample["prompt"] + sample["completion"],
              "```", "",
              "## Data", "",
              "Built by `cinq data build` (same inputs, same bytes); full manifest in `data_manifest.json`.", "",
              markdown_table(["language", "train bytes", "train tokens", "test tokens"],
                             [[lang, f"{e['bytes']['train']:,}", f"{e['tokens']['train']:,}",
                               f"{e['tokens']['test']:,}"]
                              for lang, e in manifest["languages"].items()], "llll"),
              "", markdown_table(["source", "Debian package", "version"],
                                 [[src, e.get("package") or "synthetic", e.get("package_version") or "—"]
                                  for src, e in manifest["sources"].items()], "lll")]
    lines += ["", f"Corpus sha256 (train.jsonl): `{manifest['sha256']['train']}`; tokenizer sha256: "
              f"`{manifest.get('tokenizer', {}).get('sha256', '—')}`.", ""]
    return "\n".join(lines)


DESCRIPTIONS = {
    "cinq-tiny": (
        "cinq's embedded default model: a small Llama-architecture model trained from scratch, on a 2-core CPU, "
        "from text that Debian packages put on this machine (fortunes in English, German, Spanish, Italian and "
        "Russian, and deliberately little Polish, Czech and Chinese; the KJV, WEB and Reina-Valera bibles; "
        "Python's standard library) plus synthetic arithmetic word problems with worked steps, at two levels: "
        "the corpus level and the easy level of the `arithmetic-easy` task (30,000 training problems, about a "
        "fifth of the tokens), so that the shipped teacher can do a little of the reasoning that the "
        "quantization study judges. It is a toy for running cinq out of the box with no download, and the "
        "teacher of `cinq-tiny-student` and of the speculative heads."),
    "cinq-tiny-student": (
        "A ~1.8M-parameter student distilled from `cinq-tiny` (token-level forward KL on the same corpus), meant "
        "as the draft model for speculative decoding once that is built. `benchmarks/results/distill.md` compares "
        "it with the same student trained on cross-entropy alone for the same token budget."),
}


def command_line() -> str:
    """The current `cinq ...` invocation, quoted for a shell."""
    import shlex
    import sys
    return "cinq " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def data_command(data_dir: str | Path) -> str:
    """The `cinq data build` command that made ``data_dir`` (from its manifest settings)."""
    m = json.loads((Path(data_dir) / "manifest.json").read_text())
    st = m.get("settings", {})
    from cinq.train.corpus import CorpusSettings
    defaults = CorpusSettings()
    extra = ""
    for name in ("arithmetic_train", "arithmetic_easy_train", "arithmetic_eval"):
        # A corpus built before a setting existed had none of it (0), not today's default.
        value = st.get(name, 0)
        if value != getattr(defaults, name):
            extra += f" --{name.replace('_', '-')} {value}"
    vocab = m.get("tokenizer", {}).get("vocab_size", 8192)
    if vocab != 8192:
        extra += f" --vocab-size {vocab}"
    return f"cinq data build --out {data_dir} --install{extra}"
