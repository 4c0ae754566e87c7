"""The quantized variants of a study, from `cinq eval --variants ... --group-sizes ...`.

Grammar: ``METHOD:ENTRY,ENTRY;METHOD:...``. Weight-only methods (rtn, gptq, awq) take bit widths, each run at
every ``--group-sizes`` entry unless it names its own (``4/128``, ``3/channel``); modifiers ``+act`` (GPTQ
act-order) and ``+asym`` / ``+sym`` (grid; AWQ defaults to asymmetric, the others to symmetric) follow an
entry. SmoothQuant takes its activation schemes, ``static`` / ``dynamic`` (W8A8 weights are per output channel,
so group sizes do not apply to it). NF4 takes block sizes (``nf4:64``, ``+dq``: double-quantized absmax); FP8
takes weight-scale strategies (``fp8:tensor``, ``fp8:channel``) with ``+dynamic`` / ``+static`` activations
(none: weight-only). Example::

    rtn:8,4,3,2;gptq:8,4,3,2;awq:4;smoothquant:static,dynamic   with   --group-sizes channel,128,64,32

What a method or the model's shapes cannot do (AWQ at 8 bits, SmoothQuant at 4, 3-bit packing of a width
that is not a multiple of 32, ...) is returned as a skipped entry with the reason, not raised; malformed text
is an InvalidParameterError naming --variants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cinq.errors import InvalidParameterError

METHODS = ("rtn", "gptq", "awq", "smoothquant", "nf4", "fp8")
ACT_SCHEMES = ("static", "dynamic")
CHANNEL = -1  # group size of per-output-channel grids


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """One quantized variant: method, grid (bits, group size, symmetry, act-order) or W8A8 activation scheme."""

    method: str
    bits: int
    group_size: int = CHANNEL
    act_scheme: str = ""  # SmoothQuant only
    desc_act: bool = False
    sym: bool | None = None  # None: the method's default
    double_quant: bool = False  # NF4 only
    strategy: str = ""  # FP8 weight scales: "tensor" | "channel"

    @property
    def label(self) -> str:
        """A short unique name (row label, folder and cache file name)."""
        if self.method == "smoothquant":
            return f"smoothquant-w8a8-{self.act_scheme}"
        if self.method == "nf4":
            return f"nf4-b{self.group_size}" + ("-dq" if self.double_quant else "")
        if self.method == "fp8":
            acts = {"": "weight-only", "none": "weight-only"}.get(self.act_scheme, f"a8-{self.act_scheme}")
            return f"fp8-{self.strategy}-{acts}"
        group = "ch" if self.group_size <= 0 else f"g{self.group_size}"
        mods = ("-act" if self.desc_act else "") + ({True: "-sym", False: "-asym", None: ""}[self.sym])
        return f"{self.method}-w{self.bits}-{group}{mods}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def quant_config(self) -> Any:
        """The cinq.quant QuantConfig that makes this variant (InvalidParameterError when it cannot exist)."""
        from cinq.quant.config import QuantConfig
        sym = self.sym if self.sym is not None else self.method != "awq"
        # lm_head=False explicitly: a study row measures the decoder's quantization, whatever default
        # `cinq quantize` gives the (possibly tied) LM head.
        if self.method in ("nf4", "fp8"):
            return QuantConfig(method=self.method, bits=self.bits, group_size=self.group_size,
                               act_scheme=self.act_scheme or "none", double_quant=self.double_quant,
                               weight_strategy=self.strategy or "tensor", lm_head=False)
        return QuantConfig(method=self.method, bits=self.bits, group_size=self.group_size, sym=sym,
                           desc_act=self.desc_act, act_scheme=self.act_scheme or "dynamic", lm_head=False)

    @property
    def needs_calibration(self) -> bool:
        if self.method == "fp8":
            return self.act_scheme == "static"
        return self.method not in ("rtn", "nf4")


def parse_group_sizes(text: str) -> list[int]:
    """``channel,128,64`` -> [-1, 128, 64] ("channel", "per-channel" or -1 for per output channel)."""
    out: list[int] = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        if item in ("channel", "per-channel", "ch", "-1"):
            g = CHANNEL
        else:
            try:
                g = int(item)
            except ValueError:
                raise InvalidParameterError(f"--group-sizes: {item!r} is neither 'channel' nor an integer",
                                            "group_sizes") from None
            if g < 1:
                raise InvalidParameterError(f"--group-sizes: {g} must be positive (or 'channel')", "group_sizes")
        if g not in out:
            out.append(g)
    if not out:
        raise InvalidParameterError("--group-sizes: no group size given", "group_sizes")
    return out


def _entry(method: str, raw: str, groups: Sequence[int]) -> tuple[list[VariantSpec], list[tuple[str, str]]]:
    """The variants (and skips) of one ``ENTRY`` of ``method``."""
    body, *mods = raw.split("+")
    if method in ("nf4", "fp8"):
        return _float_entry(method, raw, body, mods)
    unknown = [m for m in mods if m not in ("act", "asym", "sym")]
    if unknown:
        raise InvalidParameterError(f"--variants: {method}:{raw}: unknown modifier(s) {unknown} (act, asym, sym)",
                                    "variants")
    desc_act = "act" in mods
    sym = False if "asym" in mods else (True if "sym" in mods else None)
    if method == "smoothquant":
        scheme = {"w8a8": "dynamic", "8": "dynamic"}.get(body, body)
        if scheme in ACT_SCHEMES:
            return [VariantSpec("smoothquant", 8, CHANNEL, scheme)], []
        if body.isdigit():
            return [], [(f"smoothquant:{raw}", "SmoothQuant is W8A8 (8-bit weights and activations) only")]
        raise InvalidParameterError(f"--variants: smoothquant:{raw}: expected 'static' or 'dynamic'", "variants")
    bits_text, _, group_text = body.partition("/")
    try:
        bits = int(bits_text)
    except ValueError:
        raise InvalidParameterError(f"--variants: {method}:{raw}: expected a bit width (e.g. 4 or 4/128)",
                                    "variants") from None
    own = parse_group_sizes(group_text) if group_text else list(groups)
    return [VariantSpec(method, bits, g, "", desc_act, sym) for g in own], []


def _float_entry(method: str, raw: str, body: str, mods: list[str]) -> tuple[list[VariantSpec],
                                                                          list[tuple[str, str]]]:
    """An NF4 (block size, ``+dq``) or FP8 (``tensor`` / ``channel``, ``+dynamic`` / ``+static``) entry."""
    allowed = ("dq",) if method == "nf4" else ("dynamic", "static")
    if [m for m in mods if m not in allowed] or (method == "fp8" and len(mods) > 1):
        raise InvalidParameterError(f"--variants: {method}:{raw}: modifiers must be one of {list(allowed)}",
                                    "variants")
    if method == "nf4":
        from cinq.layers.quantization.float_format import NF4_BLOCKSIZES
        if not body.isdigit() or int(body) not in NF4_BLOCKSIZES:
            raise InvalidParameterError(f"--variants: nf4:{raw}: expected a block size in {list(NF4_BLOCKSIZES)} "
                                        f"(e.g. nf4:64)", "variants")
        return [VariantSpec("nf4", 4, int(body), double_quant="dq" in mods)], []
    if body not in ("tensor", "channel"):
        raise InvalidParameterError(f"--variants: fp8:{raw}: expected 'tensor' or 'channel'", "variants")
    return [VariantSpec("fp8", 8, CHANNEL, mods[0] if mods else "none", strategy=body)], []


def parse_variants(text: str, group_sizes: Sequence[int] = (CHANNEL,)) -> tuple[list[VariantSpec],
                                                                               list[tuple[str, str]]]:
    """(variants in the order given, deduplicated; (variant, reason) for those that cannot run anywhere)."""
    specs: list[VariantSpec] = []
    skipped: list[tuple[str, str]] = []
    for part in (p.strip() for p in str(text).split(";")):
        if not part:
            continue
        method, sep, entries = part.partition(":")
        method = method.strip().lower()
        if method not in METHODS:
            raise InvalidParameterError(f"--variants: unknown method {method!r} in {part!r}; methods: "
                                        f"{', '.join(METHODS)}", "variants")
        if not sep or not entries.strip():
            raise InvalidParameterError(f"--variants: {part!r} lists no bit widths / schemes (e.g. {method}:4)",
                                        "variants")
        for raw in (e.strip() for e in entries.split(",")):
            if raw:
                got, skip = _entry(method, raw, group_sizes)
                specs += [s for s in got if s not in specs]
                skipped += skip
        if method == "smoothquant" and any(g != CHANNEL for g in group_sizes):
            skipped.append((f"smoothquant at group size {', '.join(str(g) for g in group_sizes if g != CHANNEL)}",
                            "W8A8 weights are per output channel: its per-channel rows stand for every group size"))
    return specs, skipped


def unsupported_reason(spec: VariantSpec, model_config: Any) -> str | None:
    """Why ``spec`` cannot be made for a model of ``model_config`` (None: it can)."""
    if spec.method == "awq" and spec.bits != 4:
        return "the AWQ GEMM format stores 4-bit weights only"
    if spec.desc_act and spec.method != "gptq":
        return "act-order (+act) is a GPTQ option"
    try:
        cfg = spec.quant_config()
        from cinq.quant.pipeline import check_shapes
        check_shapes(model_config, cfg)
    except InvalidParameterError as e:
        return str(e)
    return None


def split_supported(specs: Sequence[VariantSpec], model_config: Any) -> tuple[list[VariantSpec],
                                                                              list[tuple[str, str]]]:
    """(the specs that can be made for this model, (label, reason) for the others)."""
    ok, skipped = [], []
    for s in specs:
        why = unsupported_reason(s, model_config)
        if why is None:
            ok.append(s)
        else:
            skipped.append((s.label, why))
    return ok, skipped


def one_variant(text: str, param: str = "quant") -> VariantSpec:
    """The one variant ``text`` names (``gptq:4/128``, ``smoothquant:static``), or one line naming ``--param``."""
    specs, skipped = parse_variants(text)
    if len(specs) != 1 or skipped:
        raise InvalidParameterError(f"--{param} must name one quantized variant (e.g. gptq:4/128), got {text!r}"
                                    + (f" ({skipped[0][1]})" if skipped else ""), param)
    return specs[0]
