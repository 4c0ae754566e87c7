"""No module in cinq/ that only benchmark scripts import (issue 33): what the library does not reach from its
entry points (``import cinq``, the CLI and the commands it loads by name, ``python -m`` modules) but a script in
benchmarks/ or scripts/ imports belongs beside that script. A module that only tests import (a test hook such as
``cinq.engine.faults``) is not counted: tests exercise the library, they are not its users."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_graph import ROOT, import_graph, module_name

SCRIPT_DIRS = ("benchmarks", "scripts")


def entry_points(graph: dict[str, set[str]], root: Path = ROOT) -> set[str]:
    """What runs cinq: the package, the CLI, the command modules it imports by name, ``python -m`` modules."""
    mains = {module_name(p, root) for p in root.rglob("*.py") if "__name__ == \"__main__\"" in p.read_text("utf-8")}
    return {"cinq", "cinq.cli"} | {m for m in graph if m.startswith("cinq.commands.")} | mains


def reached(graph: dict[str, set[str]], starts: set[str]) -> set[str]:
    """Every module that importing ``starts`` runs: what they import, and the packages above each module."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in graph:
            continue
        seen.add(mod)
        todo.extend(graph[mod])
        todo.extend(mod.rsplit(".", k)[0] for k in range(1, mod.count(".") + 1))
    return seen


def script_imports(path: Path, modules: set[str]) -> set[str]:
    """The cinq modules a script imports (scripts import absolutely), each as the longest known module name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def benchmark_only(root: Path = ROOT) -> dict[str, list[str]]:
    """Module -> the scripts importing it, for each cinq module the library's entry points do not reach."""
    graph = import_graph(root)
    library = reached(graph, entry_points(graph, root))
    users: dict[str, list[str]] = {}
    for folder in SCRIPT_DIRS:
        for script in sorted((root.parent / folder).rglob("*.py")):
            for mod in script_imports(script, set(graph)) - library:
                users.setdefault(mod, []).append(str(script.relative_to(root.parent)))
    return users


def test_no_library_module_serves_only_benchmark_scripts() -> None:
    only = benchmark_only()
    assert not only, f"move these beside the scripts that use them (benchmarks/), or delete them: {only}"


def test_a_planted_benchmark_only_module_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "cinq"
    (pkg / "commands").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def main():\n    import importlib\n")
    (pkg / "commands" / "__init__.py").write_text("")
    (pkg / "commands" / "run.py").write_text("from cinq.used import f\n")  # loaded by name: reached
    (pkg / "used.py").write_text("def f(): ...\n")
    (pkg / "helper.py").write_text("def g(): ...\n")
    (pkg / "tool.py").write_text("from cinq.helper import g\nif __name__ == \"__main__\":\n    g()\n")
    (pkg / "study.py").write_text("def h(): ...\n")
    (tmp_path / "benchmarks" / "bench.py").write_text("from cinq.used import f\nfrom cinq.study import h\n"
                                                      "import cinq.helper\n")
    assert benchmark_only(pkg) == {"cinq.study": ["benchmarks/bench.py"]}
