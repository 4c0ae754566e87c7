"""A quantized variant of a model folder made once and kept: ``cinq bench stack`` and ``cinq tune`` ask for
``gptq-w4-g128`` of a model and get a folder, quantized now or found complete from an earlier run (keyed by the
source's content, the variant and the calibration settings, so a retrained model is quantized again)."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from cinq.quant.variants import VariantSpec

MARKER = "cinq-variant.json"


@dataclass(slots=True, frozen=True)
class Calibration:
    """Calibration windows: from a shipped text or a file, ``samples`` windows of ``seq_len`` tokens."""

    text: str = "calibration"
    samples: int = 32
    seq_len: int = 256
    seed: int = 0


def variant_folder(src: str | Path, spec: VariantSpec, root: str | Path, calib: Calibration = Calibration(),
                   progress: bool = False) -> Path:
    """The folder of ``spec`` applied to the dense model ``src``, under ``root`` (made now when missing)."""
    from cinq.cache import content_hash
    src = Path(src)
    key = hashlib.sha256(json.dumps({"src": content_hash(src), "spec": spec.to_dict(), "calib": asdict(calib)},
                                    sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(root) / f"{src.name}-{spec.label}-{key}"
    if (folder / MARKER).is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    from cinq.quant.pipeline import quantize_model
    tokens = None
    if spec.needs_calibration:
        from cinq.assets.text import resolve_text_path
        from cinq.model.tokenizer import Tokenizer
        from cinq.quant.calibration import calibration_tokens
        tokens = calibration_tokens(resolve_text_path(calib.text), Tokenizer.from_pretrained(src), calib.samples,
                                    calib.seq_len, calib.seed)
    res = quantize_model(src, folder, spec.quant_config(), tokens, progress=progress)
    (folder / MARKER).write_text(json.dumps({"key": key, "spec": spec.to_dict(), "seconds": res.seconds}) + "\n")
    return folder
