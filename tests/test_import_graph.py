"""The house's import rules, read from the source: no cycles among cinq's modules, imports between cinq's
packages point one way (down ``PACKAGE_ORDER``, the order docs/architecture.md writes), and the layers inside the
engine point one way.

Imports inside functions count too: a lazy import that closes a circle is still a circle, it only fails later.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "cinq"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the cinq modules it imports (each import resolved to the longest known module name)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = package
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}".rstrip(".")
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            for name in names:
                target = known(name) if name.startswith("cinq") else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


# cinq's packages and top-level modules, lowest first: a module may import from its own package and from those
# before it, never from one after it (docs/architecture.md, "Imports run one way"). A new package takes its place
# here; ``cinq`` is the package's own __init__ (LLM, SamplingParams: the offline API the tools above it use).
PACKAGE_ORDER = [
    "errors", "markdown_table", "option_fields", "process_env", "host_memory", "cache", "real_models", "compilation_config", "structured",
    "sampling_params", "outputs", "kernels", "distributed", "layers", "model", "assets", "export", "plan", "step", "spec",
    "config", "config_argv", "engine", "cinq", "tasks", "quant", "eval", "train", "server", "dp", "bench", "tune", "commands", "cli",
]

# Back-edges that stand today, each (importer module, imported module) with whose change removes it. The list may
# only shrink: test_known_back_edges_still_exist fails on an entry that is gone, so a fix deletes its line.
KNOWN_BACK_EDGES: set[tuple[str, str]] = set()


def package_of(module: str) -> str:
    """The entry of PACKAGE_ORDER a module belongs to (``cinq`` for the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def back_edges(graph: dict[str, set[str]], order: list[str] = PACKAGE_ORDER) -> set[tuple[str, str]]:
    """Every import from a package to one after it in ``order`` (an unlisted package is an error: give it a place)."""
    rank = {name: i for i, name in enumerate(order)}
    unplaced = sorted({package_of(m) for m in graph} - set(rank))
    if unplaced:
        raise ValueError(f"packages with no place in PACKAGE_ORDER: {unplaced}")
    return {(m, t) for m, targets in graph.items() for t in targets if rank[package_of(t)] > rank[package_of(m)]}


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """cinq's import graph, parsed once for the tests that read it (a parse of every module per test added up)."""
    return import_graph()


def test_no_module_imports_itself_through_others(graph: dict[str, set[str]]) -> None:
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "cinq"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from cinq.a.y import f\n")
    (pkg / "a" / "y.py").write_text("def f():\n    from cinq.a import x  # lazy, still a circle\n")
    cycle = find_cycle(import_graph(pkg))
    assert cycle is not None and {"cinq.a.x", "cinq.a.y"} <= set(cycle)


def test_imports_between_packages_point_one_way(graph: dict[str, set[str]]) -> None:
    new = sorted(back_edges(graph) - KNOWN_BACK_EDGES)
    assert not new, f"imports against PACKAGE_ORDER (docs/architecture.md): {new}"


def test_known_back_edges_still_exist(graph: dict[str, set[str]]) -> None:
    gone = sorted(KNOWN_BACK_EDGES - back_edges(graph))
    assert not gone, f"fixed, delete from KNOWN_BACK_EDGES: {gone}"


def test_the_order_check_finds_a_planted_back_edge(tmp_path: Path) -> None:
    pkg = tmp_path / "cinq"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "x.py").write_text("from cinq.low.y import f\n")  # down: allowed
    (pkg / "low" / "y.py").write_text("def f():\n    from cinq.high import x  # lazy, still a back-edge\n")
    graph = import_graph(pkg)
    assert ("cinq.low.y", "cinq.high.x") in back_edges(graph, ["cinq", "low", "high"])
    assert {m for m, _ in back_edges(graph, ["cinq", "low", "high"])} == {"cinq.low.y"}
    assert {m for m, _ in back_edges(graph, ["cinq", "high", "low"])} == {"cinq.high.x"}
    with pytest.raises(ValueError, match="high"):
        back_edges(graph, ["cinq", "low"])


# (importer prefix, forbidden prefixes): the runtime never reaches for what sits above it
LAYERING = [
    ("cinq.kernels", ("cinq.layers", "cinq.model", "cinq.quant", "cinq.engine", "cinq.assets", "cinq.train")),
    ("cinq.layers", ("cinq.model", "cinq.quant", "cinq.engine", "cinq.assets", "cinq.train", "cinq.eval")),
    ("cinq.model", ("cinq.quant", "cinq.engine", "cinq.train", "cinq.eval", "cinq.server")),
    ("cinq.engine", ("cinq.quant", "cinq.train", "cinq.eval", "cinq.server")),
    ("cinq.engine.scheduler", ("cinq.engine.runner", "cinq.engine.executor", "cinq.model")),
    ("cinq.engine.output_processor", ("cinq.engine.runner", "cinq.engine.scheduler", "cinq.step.request")),
]


@pytest.mark.parametrize("importer,forbidden", LAYERING)
def test_imports_point_down_the_layers(importer: str, forbidden: tuple[str, ...], graph: dict[str, set[str]]) -> None:
    for mod in [m for m in graph if m == importer or m.startswith(importer + ".")]:
        bad = sorted(t for t in reaches(graph, mod) if t.startswith(forbidden))
        assert not bad, f"{mod} reaches {bad}"


def test_step_data_and_config_load_without_torch() -> None:
    code = ("import sys, cinq.engine.io, cinq.step.scheduler_output, cinq.step.runner_output, cinq.step.request, "
            "cinq.config, cinq.engine.scheduler, cinq.engine.output_processor; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == "False"
