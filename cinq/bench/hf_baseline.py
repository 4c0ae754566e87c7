"""The Hugging Face transformers baseline: the same model folder through ``AutoModelForCausalLM.generate``
(batched with left padding for throughput; batch 1 with a timing streamer for per-token latency).

transformers is not a dependency of cinq (it is in the ``dev`` extra): without it the baseline is reported as
missing, in one line, and the cinq side still runs."""

from __future__ import annotations

import time
from typing import Any

from cinq.bench.workload import BenchRequest

_TORCH_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32",
                 "float16": "float16", "fp16": "float16"}


def hf_available() -> bool:
    """Whether transformers can be imported here."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def load_hf_model(path: str, dtype: str, device: str = "cpu") -> Any:
    """The model folder (or GGUF file: transformers' own GGUF loader, the same values cinq serves) loaded by
    transformers onto ``device``, in eval mode (local files only: nothing is downloaded)."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from cinq.model.gguf.file import find_gguf_file
    gguf = find_gguf_file(Path(path))
    extra = {} if gguf is None else {"gguf_file": gguf.name}
    folder = path if gguf is None else str(gguf.parent)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, _TORCH_DTYPES[dtype]),
                                                local_files_only=True, **extra).to(device).eval()


def _sync(model: Any) -> None:
    """Wait for the model's device, so that a clock read after generate covers its kernels."""
    import torch
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def _greedy_config(new_tokens: int) -> Any:
    from transformers import GenerationConfig
    # no eos: every request generates exactly what it asked for, as cinq's ignore_eos. Every sampling knob is
    # set: transformers fills unset ones from the model's generation_config.json (a repetition penalty ...).
    return GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None,
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens, repetition_penalty=1.0,
                            temperature=None, top_p=None, top_k=None)


def hf_generate_batched(model: Any, reqs: list[BenchRequest], batch_size: int) -> dict[str, float]:
    """Greedy generation in batches of ``batch_size`` (left padding), each batch generating up to its longest
    requested output; only the requested tokens count. Returns tokens, seconds and tok_s."""
    import torch
    useful = 0
    _sync(model)
    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch_size):
        batch = reqs[start:start + batch_size]
        width = max(len(r.prompt) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        new = max(r.output_len for r in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 generation_config=_greedy_config(new))
        if out.shape[1] != width + new:
            raise RuntimeError(f"transformers generated {out.shape[1] - width} tokens, asked {new}")
        useful += sum(r.output_len for r in batch)
    _sync(model)
    elapsed = time.perf_counter() - t0
    return {"batch_size": batch_size, "tokens": useful, "seconds": elapsed, "tok_s": useful / elapsed}


def hf_token_times(model: Any, prompt: list[int], new_tokens: int) -> tuple[float, list[float]]:
    """Batch-1 greedy generation of ``new_tokens``: (time to first token, gaps between later tokens), seconds,
    as a streamer sees each token leave ``generate``."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class _Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.calls = 0

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls > 1:  # the first call hands over the prompt
                self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    clock = _Clock()
    ids = torch.tensor([prompt], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       generation_config=_greedy_config(new_tokens), streamer=clock)
    times = clock.times
    return times[0] - start, [b - a for a, b in zip(times, times[1:])]


def hf_greedy_tokens(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """The ``new_tokens`` greedy tokens transformers generates after ``prompt`` (end tokens banned, as
    ``min_new_tokens`` does: compare them with cinq's up to its first end token)."""
    import torch
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             generation_config=_greedy_config(new_tokens))
    return out[0, len(prompt):].tolist()


class HFLogits:
    """A transformers causal LM seen through the two calls cinq's scorers make (``model(ids)`` then
    ``compute_logits``), so that perplexity and KL of the HF row come from transformers' own forward."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.training = False

    def __call__(self, ids: Any) -> Any:
        return self.model(input_ids=ids).logits

    def compute_logits(self, logits: Any) -> Any:
        return logits

    def parameters(self) -> Any:
        return self.model.parameters()

    def eval(self) -> HFLogits:
        return self

    def train(self, mode: bool = True) -> HFLogits:
        return self


class HFTextGenerator:
    """Greedy text completions by transformers ``generate`` (batched, left padding, stopping at the model's end
    tokens), cut at the first stop string: the evaluations' GenerateFn for the HF row."""

    def __init__(self, model: Any, tokenizer: Any, eos_token_ids: list[int], batch_size: int = 16) -> None:
        self.model, self.tok, self.eos, self.batch_size = model, tokenizer, eos_token_ids, batch_size

    def __call__(self, prompts: list[str], max_new_tokens: int, stop: Any = ()) -> tuple[list[str], float]:
        import torch
        from transformers import GenerationConfig
        gen = GenerationConfig(do_sample=False, eos_token_id=self.eos, pad_token_id=0, bos_token_id=None,
                               max_new_tokens=max_new_tokens, repetition_penalty=1.0, temperature=None, top_p=None,
                               top_k=None)
        texts, generated, start = [], 0, time.perf_counter()
        for b in range(0, len(prompts), self.batch_size):
            seqs = [self.tok.encode(p) for p in prompts[b:b + self.batch_size]]
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, width - len(s):] = torch.tensor(s)
                mask[i, width - len(s):] = 1
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids.to(self.model.device),
                                          attention_mask=mask.to(self.model.device), generation_config=gen)
            for row in out[:, width:].tolist():
                cut = next((i for i, t in enumerate(row) if t in self.eos), len(row))
                generated += cut
                text = self.tok.decode(row[:cut])
                ends = [text.find(s) for s in stop if s in text]
                texts.append(text[:min(ends)] if ends else text)
        return texts, generated / max(time.perf_counter() - start, 1e-9)


def hf_padded_kv_slots(reqs: list[BenchRequest], batch_size: int) -> tuple[int, float]:
    """KV positions of ``hf_generate_batched``'s static batches, where every row is as long as the batch's
    longest prompt plus its longest output: (the most one batch holds at once, the share of all positions held
    that are padding or tokens nobody asked for)."""
    peak = held = useful = 0
    for start in range(0, len(reqs), batch_size):
        batch = reqs[start:start + batch_size]
        width = max(len(r.prompt) for r in batch) + max(r.output_len for r in batch)
        peak = max(peak, len(batch) * width)
        held += len(batch) * width
        useful += sum(len(r.prompt) + r.output_len for r in batch)
    return peak, 1 - useful / held if held else 0.0
