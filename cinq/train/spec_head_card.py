"""Ship a finished head run: copy ``<run>/head`` and write its model card (README.md) from the run's summary:
what the head is, how to serve it, the commands that reproduce it, its training data and time, and its held-out
greedy acceptance per language."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

ABOUT = {
    "eagle": ("An EAGLE draft head (Li et al. 2024): one decoder layer over the target's final hidden state and "
              "the next token's embedding, drafting through the target's own LM head; trained teacher-forced on "
              "feature regression (smooth-L1, weight 1.0) plus KL to the target's next-token distribution "
              "(weight 0.1). Folder layout: vLLM's EAGLE-1 Llama one (`EagleLlamaForCausalLM`)."),
    "eagle3": ("An EAGLE-3 draft head (Li et al. 2025): one decoder layer over a fusion of three of the target's "
               "layers and the next token's embedding, drafting through the target's LM head after its own norm; "
               "trained with training-time test (unrolled over its own outputs) on KL to the target's "
               "distributions only. Folder layout: cinq's own (cinq/spec/eagle.py)."),
    "eagle3-vllm": (
        "An EAGLE-3 draft head (Li et al. 2025): one decoder layer attending over the normed next-token embedding "
        "and a fusion of three of the target's layers, with its own LM head over a reduced draft vocabulary (the "
        "tokens the target wrote most in training; `d2t` maps them to target ids); trained with training-time "
        "test on KL to the target's distributions restricted to that vocabulary. Folder layout: vLLM's / "
        "SpecForge's EAGLE-3 one (`LlamaForCausalLMEagle3`, cinq/spec/eagle3.py)."),
    "medusa": ("Medusa-1 heads (Cai et al. 2024): residual blocks on the target's final hidden state, each with "
               "its own LM head (initialised from the target's), head i guessing the token i + 2 ahead; trained "
               "on KL to the target's distributions there (weights 0.8^i). Folder layout: vLLM's Medusa one."),
    "medusa-shared": (
        "Medusa-1 heads (Cai et al. 2024) drafting through the target's own LM head (vLLM's `original_lm_head`): "
        "residual blocks on the target's final hidden state, head i guessing the token i + 2 ahead; trained on KL "
        "to the target's distributions there (weights 0.8^i), the LM head frozen and stored nowhere here. Folder "
        "layout: vLLM's Medusa one, without `lm_heads.0.weight` (add the target's `lm_head.weight` under that name "
        "to load it in vLLM)."),
}


def ship_head(run_dir: str | Path, dest: str | Path, commands: list[str]) -> Path:
    """Copy the run's head folder to ``dest`` and write README.md; returns ``dest``."""
    run_dir, dest = Path(run_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(run_dir / "head" / name, dest / name)
    summary = json.loads((run_dir / "summary.json").read_text())
    (dest / "README.md").write_text(render_head_card(dest, summary, commands))
    (dest / TRAINING_FILE).write_text(json.dumps(training_record(summary), indent=1) + "\n")
    return dest


TRAINING_FILE = "training.json"  # a shipped head's training figures, machine-readable beside its card


def training_record(summary: dict[str, Any]) -> dict[str, Any]:
    """What a shipped head keeps of its run's summary: enough to compare heads without the run folder."""
    return {"train_prompts": summary["job"]["train_prompts"], "train_tokens": summary["train_data"]["tokens"],
            "steps": summary["step"], "elapsed_s": round(summary["elapsed_s"], 1),
            "tau": summary["acceptance"]["all"]["tau"], "prompt_mix": summary["job"].get("prompt_mix", "balanced")}


def _acceptance_table(acc: dict[str, Any]) -> list[str]:
    k = acc["k"]
    head = "| language | tau | " + " | ".join(f"accept {j + 1}" for j in range(k)) + " | steps |"
    lines = [head, "|" + "---|" * (k + 3)]
    rows = list(acc["per_language"].items()) + [("**all**", acc["all"])]
    for lang, r in rows:
        rates = " | ".join(f"{a:.1%}" for a in r["accept_rate"])
        lines.append(f"| {lang} | {r['tau']:.3f} | {rates} | {r['steps']} |")
    return lines


def _shared_note(method: str, original_lm_head: bool) -> str:
    if method != "medusa":
        return "(the target's embedding and LM head are shared, not counted) |"
    if original_lm_head:
        return "(the target's LM head is shared, not counted) |"
    return "(one LM head per head included, initialised from the target's) |"


def _mix_note(job: dict[str, Any]) -> str:
    mix = job.get("prompt_mix", "balanced")
    if mix == "natural":
        return "prompts in the train split's natural language proportions"
    if mix == "english":
        return "English prompts only"
    return "the same number of prompts per language"


def _generation_note(data: dict[str, Any]) -> str:
    seconds = data.get("generation_s")
    return f"; the target wrote the data beforehand in {seconds:.0f} s with cinq's engine" if seconds else ""


def _about_key(method: str, cfg: dict[str, Any]) -> str:
    if cfg.get("original_lm_head"):
        return "medusa-shared"
    return "eagle3-vllm" if "draft_vocab_size" in cfg else method


def _prompt_source(job: dict[str, Any]) -> str:
    if job.get("data_dir") == "chat":
        return "language-balanced chat turns in its own chat template (cinq/train/spec_head_prompts.py, train topics)"
    return "corpus train-split prompts"


def _held_out_source(job: dict[str, Any]) -> str:
    if job.get("data_dir") == "chat":
        return "chat turns on the held-out topics"
    return "prompts from the corpus test split"


def render_head_card(dest: Path, summary: dict[str, Any], commands: list[str]) -> str:
    """The README.md of the head folder ``dest`` from its run's summary."""
    name = dest.name
    job = summary["job"]
    method = job["method"]
    acc = summary["acceptance"]
    cfg = json.loads((Path(summary["head_dir"]) / "config.json").read_text())
    spec = cfg["cinq_spec"]
    target = spec["target"]
    train, held = summary["train_data"], summary["eval_data"]
    minutes = summary["elapsed_s"] / 60
    lines = [
        f"# {name}", "",
        ABOUT[_about_key(method, cfg)]
        + f" Trained for `{target['name']}` on text that model wrote itself (DistillSpec's lesson: "
        "align the drafter to the target on the target's own outputs).", "",
        "## Use", "",
        "```python",
        f'speculative_config = {{"method": "{method}", "model": "{dest}", '
        f'"num_speculative_tokens": {acc["k"]}}}',
        "```", "",
        "The head is loaded onto its target only: loading it onto another model is refused, naming the field "
        f"that differs (target fingerprint `{target['fingerprint']}`).", "",
        "## Reproduce", "", "```sh", *commands, "```", "",
        "## Head", "",
        "| field | value |", "|---|---|",
        f"| method | {method} |",
        f"| parameters | {summary['head_parameters']:,} "
        + _shared_note(method, bool(cfg.get("original_lm_head"))),
        f"| target | {target['name']} (hidden {target['hidden_size']}, vocab {target['vocab_size']}, "
        f"{target['num_hidden_layers']} layers) |",
    ]
    if "draft_vocab" in summary:
        dv = summary["draft_vocab"]
        lines.append(f"| draft vocabulary | {dv['size']:,} of {target['vocab_size']:,} tokens (share of the "
                     f"target's generated tokens inside: train {dv['coverage_train']:.3f}, held-out "
                     f"{dv['coverage_held_out']:.3f}) |")
    if method != "medusa":
        lines.append(f"| feature layers | {spec['feature_layers']} (indices into the target's hidden states) |")
    else:
        lines.append(f"| heads | {cfg['num_heads']} |")
    lines += [f"| dtype | {cfg.get('torch_dtype', 'bfloat16')} |", ""]
    per_lang = ", ".join(f"{k} {v}" for k, v in train["per_language"].items())
    lines += [
        "## Training", "",
        "| field | value |", "|---|---|",
        f"| data | {train['sequences']} sequences the target wrote from {_prompt_source(job)} (at most "
        f"{job['max_prompt']} prompt tokens, {job['max_tokens']} new ones, temperature {job['sample_temperature']}; "
        f"{train['tokens']:,} tokens, {train['generated_tokens']:,} of them generated), {_mix_note(job)}: {per_lang} |",
        f"| steps | {summary['step']} x {job['batch_size']} whole sequences |",
        f"| training time | {minutes:.1f} min on {summary['cpu']} ({summary['torch_threads']} torch thread(s), "
        f"shared machine){_generation_note(train)} |",
        f"| optimiser | AdamW lr {job['lr']}, {job['warmup_steps']} warmup steps then cosine decay, no weight decay, "
        f"bf16 autocast where the CPU has native bf16 GEMMs (else float32), float32 master weights, shipped as "
        f"bf16 |",
        f"| final train loss | {summary['final_loss']:.3f} |", "",
        "## Held-out acceptance", "",
        f"Greedy drafts of k = {acc['k']} tokens against the target's greedy continuations of {held['sequences']} "
        f"{_held_out_source(job)} (neither the target nor the head trained on them; at most "
        f"{job['eval_max_tokens']} new tokens each), measured offline in float32 (cinq/eval/spec_acceptance.py). "
        "tau = tokens per target forward along the speculative walk (1 + accepted drafts per step); accept j = "
        "share of continuation positions whose first j drafts are all accepted.", "",
        *_acceptance_table(acc), "",
    ]
    ngram = summary.get("acceptance_ngram")
    if ngram:
        lines += [
            "The same measure for prompt lookup (n-gram drafts of 2-4 tokens from the sequence itself, "
            "cinq/spec/ngram.py), which costs no model: the target's greedy text repeats itself a lot, and "
            "that part of the head's acceptance comes for free.", "",
            *_acceptance_table(ngram), "",
        ]
    return "\n".join(lines)
