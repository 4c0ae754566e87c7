"""SpeculativeConfig: vLLM's ``speculative_config`` fields and meaning, validated on construction, so that users'
configs carry over. Errors name the field and the allowed values.

``EngineConfig.speculative_config`` takes one (or its dict); ``BUILT_METHODS`` are the ones the engine runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.option_fields import from_known_fields

METHODS = ("ngram", "draft_model", "medusa", "eagle", "eagle3")
BUILT_METHODS = ("ngram", "draft_model", "medusa", "eagle", "eagle3")  # the methods the engine runs today
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


NGRAM_DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min / max when an n-gram config gives neither


@dataclass(slots=True)
class SpeculativeConfig:
    """How requests speculate. ``method`` is inferred as ``draft_model`` when only ``model`` is given.

    ``num_speculative_tokens_per_batch_size``: inclusive ``(start, end, k)`` batch-size ranges, each overriding
    ``num_speculative_tokens`` (k = 0 turns speculation off for that range). ``prompt_lookup_min`` /
    ``prompt_lookup_max`` (vLLM's n-gram fields) given with a model method put prompt lookup first: see
    ``lookup_first``."""

    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] = field(default_factory=list)
    draft_sample_method: str = "greedy"
    # cinq's own: choose k per step (0 = off) from measured acceptance and step costs, up to
    # num_speculative_tokens (cinq/spec/adaptive.py)
    adaptive: bool = False
    # vLLM's static draft tree for tree verification (medusa / eagle / eagle3): a list of paths of candidate
    # ranks, e.g. [[0], [1], [0, 0]]; num_speculative_tokens must equal its number of nodes
    speculative_token_tree: list[tuple[int, ...]] | str | None = None
    # EAGLE-2's dynamic tree (eagle / eagle3): expand the tree_topk best nodes per level for tree_depth levels,
    # verify the num_speculative_tokens best of them (SGLang's speculative_eagle_topk / num_steps / num_draft_tokens)
    tree_topk: int | None = None
    tree_depth: int | None = None

    def __post_init__(self) -> None:
        if self.method is None:
            if self.model is None:
                raise InvalidParameterError(
                    f"speculative_config: give 'method' (one of {list(METHODS)}) or a draft 'model'", "method")
            self.method = "draft_model"
        if self.method not in METHODS:
            raise InvalidParameterError(
                f"speculative_config.method must be one of {list(METHODS)}, got {self.method!r}", "method")
        if self.method != "ngram" and not self.model:
            raise InvalidParameterError(
                f"speculative_config: method {self.method!r} needs 'model' (the draft model or head folder)", "model")
        if self.num_speculative_tokens is None:
            raise InvalidParameterError("speculative_config.num_speculative_tokens is required", "num_speculative_tokens")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, 64)
        # vLLM's n-gram defaults: neither bound given, both 5; one given, the other equals it
        if self.method == "ngram" and self.prompt_lookup_min is None and self.prompt_lookup_max is None:
            self.prompt_lookup_min = self.prompt_lookup_max = NGRAM_DEFAULT_LOOKUP
        if self.prompt_lookup_max is None and self.prompt_lookup_min is not None:
            _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, 1024)
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_max is not None:
            if self.prompt_lookup_min is None:
                _check_int("prompt_lookup_max", self.prompt_lookup_max, 1, 1024)
                self.prompt_lookup_min = self.prompt_lookup_max
            _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, 1024)
            _check_int("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 1024)
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise InvalidParameterError(
                f"speculative_config.draft_sample_method must be one of {list(DRAFT_SAMPLE_METHODS)}, got "
                f"{self.draft_sample_method!r}", "draft_sample_method")
        self.num_speculative_tokens_per_batch_size = _check_ranges(self.num_speculative_tokens_per_batch_size)
        if self.speculative_token_tree is not None:
            self._check_tree()
        if self.tree_topk is not None or self.tree_depth is not None:
            self._check_dynamic_tree()
        if not isinstance(self.adaptive, bool):
            raise InvalidParameterError(f"speculative_config.adaptive must be true or false, got {self.adaptive!r}",
                                        "adaptive")

    def _check_tree(self) -> None:
        from cinq.spec.tree import TreeShape  # the tree module needs torch; a plain config never imports it
        name = "speculative_token_tree"
        paths = self.speculative_token_tree
        if isinstance(paths, str):  # vLLM's form: the string of a list of tuples
            try:
                paths = ast.literal_eval(paths)
            except (ValueError, SyntaxError) as e:
                raise InvalidParameterError(f"speculative_config.{name}: not a list of paths ({e})", name) from e
        if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (list, tuple)) for p in paths):
            raise InvalidParameterError(f"speculative_config.{name} must be a non-empty list of paths, e.g. "
                                        f"[[0], [1], [0, 0]]", name)
        if self.method not in ("medusa", "eagle", "eagle3"):
            raise InvalidParameterError(f"speculative_config.{name}: trees are verified for medusa, eagle and "
                                        f"eagle3 drafts, not {self.method!r}", name)
        if self.draft_sample_method != "greedy":
            raise InvalidParameterError(f"speculative_config.{name}: tree drafts are top-k candidates; "
                                        f"draft_sample_method must be 'greedy'", "draft_sample_method")
        shape = TreeShape([tuple(p) for p in paths])
        if len(shape.paths) != self.num_speculative_tokens:
            raise InvalidParameterError(
                f"speculative_config.num_speculative_tokens ({self.num_speculative_tokens}) must equal the number "
                f"of nodes of speculative_token_tree ({len(shape.paths)})", "num_speculative_tokens")
        self.speculative_token_tree = shape.paths

    def _check_dynamic_tree(self) -> None:
        if self.tree_topk is None or self.tree_depth is None:
            raise InvalidParameterError("speculative_config: a dynamic tree needs both tree_topk and tree_depth",
                                        "tree_topk" if self.tree_topk is None else "tree_depth")
        _check_int("tree_topk", self.tree_topk, 1, 16)
        _check_int("tree_depth", self.tree_depth, 1, 16)
        if self.method not in ("eagle", "eagle3"):
            raise InvalidParameterError(f"speculative_config.tree_topk: dynamic trees are built for eagle and eagle3 "
                                        f"heads, not {self.method!r}", "tree_topk")
        if self.speculative_token_tree is not None:
            raise InvalidParameterError("speculative_config: give speculative_token_tree (static) or tree_topk / "
                                        "tree_depth (dynamic), not both", "tree_topk")
        if self.draft_sample_method != "greedy":
            raise InvalidParameterError("speculative_config.tree_topk: tree drafts are top-k candidates; "
                                        "draft_sample_method must be 'greedy'", "draft_sample_method")
        pool = self.tree_topk + (self.tree_depth - 1) * self.tree_topk ** 2
        if self.num_speculative_tokens > pool:  # type: ignore[operator]
            raise InvalidParameterError(
                f"speculative_config.num_speculative_tokens ({self.num_speculative_tokens}): a dynamic tree with "
                f"tree_topk {self.tree_topk} and tree_depth {self.tree_depth} generates only {pool} candidates",
                "num_speculative_tokens")

    @property
    def lookup_first(self) -> bool:
        """A model method with ``prompt_lookup_max``: each request drafts by prompt lookup (n-gram) where its own
        tokens hold a match, and by the model (draft model, EAGLE, Medusa) where they do not."""
        return self.method != "ngram" and self.prompt_lookup_max is not None

    @property
    def tree_draft_depth(self) -> int:
        """How many drafts a tree verify can accept at most (0: chain drafts)."""
        if self.speculative_token_tree is not None:
            return max(len(p) for p in self.speculative_token_tree)  # type: ignore[arg-type]
        return self.tree_depth or 0

    def tree_shape(self):  # -> TreeShape | None
        """The static draft tree, or None (chain drafts)."""
        if self.speculative_token_tree is None:
            return None
        from cinq.spec.tree import TreeShape
        return TreeShape(list(self.speculative_token_tree))  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeculativeConfig:
        """From the JSON object users pass as ``speculative_config``; unknown keys are errors."""
        if not isinstance(d, dict):
            raise InvalidParameterError(f"speculative_config must be a JSON object, got {type(d).__name__}",
                                        "speculative_config")
        return from_known_fields(cls, d, "speculative_config")

    def k_for_batch_size(self, batch_size: int) -> int:
        """Draft tokens per request at this batch size (0: do not speculate)."""
        for start, end, k in self.num_speculative_tokens_per_batch_size:
            if start <= batch_size <= end:
                return k
        return self.num_speculative_tokens  # type: ignore[return-value]


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidParameterError(f"speculative_config.{name} must be an integer in [{lo}, {hi}], got {value!r}",
                                    name)


def _check_ranges(ranges: object) -> list[tuple[int, int, int]]:
    name = "num_speculative_tokens_per_batch_size"
    if not isinstance(ranges, (list, tuple)):
        raise InvalidParameterError(f"speculative_config.{name} must be a list of [start, end, k]", name)
    out: list[tuple[int, int, int]] = []
    for r in ranges:
        if not isinstance(r, (list, tuple)) or len(r) != 3:
            raise InvalidParameterError(f"speculative_config.{name}: each entry is [start, end, k], got {r!r}", name)
        start, end, k = r
        _check_int(f"{name} start", start, 1, 1 << 16)
        _check_int(f"{name} end", end, start, 1 << 16)
        _check_int(f"{name} k", k, 0, 64)
        out.append((start, end, k))
    out.sort()
    for (s0, e0, _), (s1, _, _) in zip(out, out[1:]):
        if s1 <= e0:
            raise InvalidParameterError(
                f"speculative_config.{name}: ranges [{s0}, {e0}] and one starting at {s1} overlap", name)
    return out
