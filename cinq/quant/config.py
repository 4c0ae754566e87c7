"""QuantConfig: what `cinq quantize` is asked to do, the format to write plus the recipe to make it with.

``target`` is the runtime's QuantFormat (what the file's ``quantization_config`` will say); ``recipe`` the
offline QuantRecipe (calibration-time settings). The constructor takes both in one flat vocabulary, the CLI's.
"""

from __future__ import annotations

from typing import Any

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.quantization.format import QuantFormat
from cinq.quant.recipe import QuantRecipe


def _read(half: str, name: str) -> Any:
    """A read-only property showing ``self.<half>.<name>``."""
    return property(lambda self: getattr(getattr(self, half), name), doc=f"``{half}.{name}``")


class QuantConfig:
    """A quantization job: ``target`` (QuantFormat) and ``recipe`` (QuantRecipe); validated on construction."""

    __slots__ = ("target", "recipe")

    def __init__(self, method: str = "rtn", bits: int | None = None, group_size: int = 128, sym: bool = True,
                 format: str | None = None, desc_act: bool = False, static_groups: bool = False,
                 true_sequential: bool = True, damp_percent: float = 0.01, lazy_batch_size: int = 128,
                 awq_grid: int = 20, awq_clip: bool = True, smooth_alpha: float = 0.5, act_scheme: str = "dynamic",
                 modules_to_not_convert: list[str] | None = None, lm_head: bool = False, double_quant: bool = False,
                 weight_strategy: str = "tensor") -> None:
        self.target = QuantFormat(method=method, bits=bits, group_size=group_size, sym=sym, format=format,
                                  desc_act=desc_act, static_groups=static_groups, act_scheme=act_scheme,
                                  modules_to_not_convert=list(modules_to_not_convert or []), lm_head=lm_head,
                                  double_quant=double_quant, weight_strategy=weight_strategy)
        self.recipe = QuantRecipe(true_sequential=true_sequential, damp_percent=damp_percent,
                                  lazy_batch_size=lazy_batch_size, awq_grid=awq_grid, awq_clip=awq_clip,
                                  smooth_alpha=smooth_alpha)

    @classmethod
    def of(cls, target: QuantFormat, recipe: QuantRecipe | None = None) -> QuantConfig:
        """A job from its two halves."""
        job = cls.__new__(cls)
        job.target, job.recipe = target, recipe or QuantRecipe()
        return job

    # Read-only views of the two halves' settings under their flat names (the CLI's and the reports').
    method = _read("target", "method")
    bits = _read("target", "bits")
    group_size = _read("target", "group_size")
    sym = _read("target", "sym")
    format = _read("target", "format")
    desc_act = _read("target", "desc_act")
    static_groups = _read("target", "static_groups")
    act_scheme = _read("target", "act_scheme")
    modules_to_not_convert = _read("target", "modules_to_not_convert")
    lm_head = _read("target", "lm_head")
    double_quant = _read("target", "double_quant")
    weight_strategy = _read("target", "weight_strategy")
    min_zero = _read("target", "min_zero")
    true_sequential = _read("recipe", "true_sequential")
    damp_percent = _read("recipe", "damp_percent")
    lazy_batch_size = _read("recipe", "lazy_batch_size")
    awq_grid = _read("recipe", "awq_grid")
    awq_clip = _read("recipe", "awq_clip")
    smooth_alpha = _read("recipe", "smooth_alpha")

    def to_hf(self) -> dict[str, Any]:
        """The ``quantization_config`` to write (the format's keys plus what it records of the recipe)."""
        return self.target.to_hf(self.recipe.recorded(self.target.format or ""))

    def quantize_config_json(self) -> dict[str, Any] | None:
        """AutoGPTQ's separate quantize_config.json (GPTQ formats only)."""
        return self.target.quantize_config_json(self.recipe.recorded(self.target.format or ""))

    @classmethod
    def from_hf(cls, qc: dict[str, Any]) -> QuantConfig:
        """The job a ``quantization_config`` describes (the recipe from what it records)."""
        target = QuantFormat.from_hf(qc)
        try:
            recipe = QuantRecipe.from_recorded(qc)
        except InvalidParameterError as e:
            raise ModelLoadError(f"quantization_config: {e}", e.param) from e
        return cls.of(target, recipe)

    def __repr__(self) -> str:
        return f"QuantConfig(target={self.target!r}, recipe={self.recipe!r})"
