"""The shipped models: load in cinq and in transformers with the same logits, fit the size budget, carry a card."""

import json

import pytest
import torch

from cinq.assets import ASSETS_DIR, default_model_path
from cinq.model.loader import load_model
from cinq.model.tokenizer import Tokenizer

SHIPPED = ["cinq-tiny", "cinq-tiny-student"]


def _folder(name):
    folder = ASSETS_DIR / name
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"{name} is not shipped in this checkout")
    return folder


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_matches_transformers(name):
    folder = _folder(name)
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.from_pretrained(folder)
    ids = tok.encode("Question: Anna has 12 apples. Then Anna buys 5 more.\nDer Hund lief. Кот сидел.")
    ours = load_model(folder, dtype="float32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        a = ours.compute_logits(ours(x))
        b = theirs(x).logits.float()
    assert a.shape == b.shape == (1, len(ids), ours.config.vocab_size)
    assert torch.allclose(a, b, atol=2e-3, rtol=1e-3), (a - b).abs().max()
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf_tok.encode("Der Hund lief 42 mal.", add_special_tokens=False) == tok.encode("Der Hund lief 42 mal.")[1:]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_card_and_generation_config(name):
    folder = _folder(name)
    card = (folder / "README.md").read_text()
    for section in ("## Reproduce", "cinq data build", "## Training", "tokens seen", "training time",
                    "## Held-out evaluation", "Arithmetic", "## Data"):
        assert section in card, section
    gen = json.loads((folder / "generation_config.json").read_text())
    tok = Tokenizer.from_pretrained(folder)
    end_id = tok._tok.token_to_id("<|end|>")
    assert end_id in (gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"


def test_default_model_is_the_shipped_teacher():
    _folder("cinq-tiny")
    assert default_model_path() == ASSETS_DIR / "cinq-tiny"


def test_assets_fit_the_size_budget():
    total = sum(p.stat().st_size for p in ASSETS_DIR.rglob("*") if p.is_file())
    # 64 MiB: the budget the real-model speculation issue set for shipping an EAGLE-3 head beside cinq-tiny's
    assert total <= 64 * 1024 * 1024, f"assets hold {total / 2**20:.1f} MiB (budget 64 MiB)"


def test_shipped_model_path():
    from cinq.assets import shipped_model_path
    assert shipped_model_path("no-such-model") is None
    folder = _folder("cinq-tiny-student")
    assert shipped_model_path("cinq-tiny-student") == folder


@pytest.mark.parametrize("name,method", [("cinq-tiny-eagle", "eagle"), ("cinq-tiny-eagle3", "eagle3"),
                                         ("cinq-tiny-medusa", "medusa")])
def test_shipped_heads_load_onto_cinq_tiny_and_carry_a_card(name, method):
    from cinq.spec.eagle import load_eagle_head
    from cinq.spec.medusa import load_medusa_heads
    folder = _folder(name)
    target = load_model(_folder("cinq-tiny"), dtype="bfloat16")
    if method == "medusa":
        heads = load_medusa_heads(folder, target, torch.bfloat16, "cpu")
        assert heads.num_heads == 4
    else:
        head = load_eagle_head(folder, target, torch.bfloat16, "cpu", "sdpa")
        assert head.method == method
    card = (folder / "README.md").read_text()
    for section in ("## Use", "## Reproduce", "cinq data build", f"--heads {method}", "## Training",
                    "training time", "## Held-out acceptance", "| **all** |"):
        assert section in card, section
    assert json.loads((folder / "config.json").read_text())["cinq_spec"]["target"]["name"] == "cinq-tiny"


def test_the_smollm2_eagle3_head_loads_onto_its_target_only_and_carries_a_card():
    """The EAGLE-3 head shipped for SmolLM2-135M-Instruct loads onto the real model's file by name, drafts over its
    ascending 8,192-token vocabulary, is refused on cinq-tiny (naming the field that differs) and has its card."""
    from cinq.errors import InvalidParameterError, ModelLoadError
    from cinq.real_models import REAL_MODELS
    from cinq.spec.eagle import load_eagle_head
    folder = _folder("smollm2-135m-instruct-eagle3")
    file = REAL_MODELS["smollm2-135m-instruct"].path()
    if file is None:
        pytest.skip("needs the real model: bash scripts/setup.sh")
    head = load_eagle_head(folder, load_model(file, dtype="bfloat16"), torch.bfloat16, "cpu", "sdpa")
    assert head.method == "eagle3" and head.draft_vocab_size == 8192 and head.draft_vocab() is not None
    with pytest.raises((InvalidParameterError, ModelLoadError), match="target"):
        load_eagle_head(folder, load_model(_folder("cinq-tiny"), dtype="bfloat16"), torch.bfloat16, "cpu", "sdpa")
    card = (folder / "README.md").read_text()
    for section in ("## Use", "## Reproduce", "--heads eagle3 --target smollm2-135m-instruct", "## Training",
                    "training time", "## Held-out acceptance", "| **all** |"):
        assert section in card, section


def test_a_record_names_shipped_and_real_models_by_name_and_other_paths_as_given(tmp_path) -> None:
    from cinq.assets import ASSETS_DIR, model_reference, resolve_model_path
    from cinq.real_models import REAL_MODELS
    assert model_reference(ASSETS_DIR / "cinq-tiny") == "cinq-tiny"
    assert model_reference(str(tmp_path)) == str(tmp_path)
    assert model_reference("runs/student") == "runs/student"
    real = next((m for m in REAL_MODELS.values() if m.path() is not None), None)
    if real is not None:  # an installed real model's file is named as the registry names it
        assert model_reference(resolve_model_path(real.name)) == real.name
        copy = tmp_path / real.file  # the same file name elsewhere is not that model
        copy.write_bytes(b"")
        assert model_reference(copy) == str(copy)
