"""A copy workload for prompt-lookup speculation: chat requests whose answers copy from the prompt, code edits
("rename X to Y in this function") and extraction ("the lines that mention X"), over Python functions of the
standard library this interpreter ships (no download, the same text on every machine with that Python).

Each request names an identifier the function really uses (an argument or local name, used at least twice), so
the answer is the function again with one name changed, or some of its lines verbatim: what n-gram drafting was
built for (vLLM's prompt lookup; the issue's code-edit / extraction workload).
"""

from __future__ import annotations

import ast
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cinq.errors import InvalidParameterError

KINDS = ("rename", "extract")
# pure-Python standard-library modules, relative to the stdlib folder; a missing one is skipped
SOURCES = ("textwrap.py", "json/encoder.py", "json/decoder.py", "csv.py", "difflib.py", "shlex.py", "fnmatch.py",
           "glob.py", "string.py", "calendar.py", "configparser.py", "argparse.py")


@dataclass(slots=True)
class CopyRequest:
    """One chat request of the workload: its kind, the function's source, the identifier it is about."""

    kind: str
    source: str
    name: str

    def message(self) -> str:
        """The user's turn."""
        code = f"```python\n{self.source}\n```"
        if self.kind == "rename":
            return (f"Rename `{self.name}` to `{self.name}_value` in this function. Reply with the whole function, "
                    f"unchanged otherwise.\n\n{code}")
        return f"Copy, verbatim and in order, the lines of this function that mention `{self.name}`.\n\n{code}"


def stdlib_functions(min_lines: int = 8, max_lines: int = 30) -> list[tuple[str, str]]:
    """(function source, an identifier it uses at least twice) for every function or method of ``SOURCES``
    of ``min_lines`` to ``max_lines`` lines, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[tuple[str, str]] = []
    for rel in SOURCES:
        path = root / rel
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef) or not min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                continue
            names = Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and len(n.id) >= 3
                            and n.id != "self")
            name = next((n for n, c in names.most_common() if c >= 2), None)
            source = ast.get_source_segment(text, node)
            if name is not None and source is not None:
                out.append((_dedent(source, node.col_offset), name))
    if not out:
        raise InvalidParameterError(f"copy workload: no function found in the standard library at {root}", "text")
    return out


def copy_requests(n: int, seed: int = 0) -> list[CopyRequest]:
    """``n`` requests, kinds alternating (rename, extract, ...), functions in a seeded order."""
    funcs = stdlib_functions()
    order = np.random.default_rng([seed, 28]).permutation(len(funcs))
    return [CopyRequest(KINDS[i % len(KINDS)], *funcs[order[i % len(order)]]) for i in range(n)]


def copy_prompts(tokenizer: Any, n: int, seed: int = 0, max_prompt: int = 768) -> list[tuple[str, list[int]]]:
    """(kind, chat-template prompt token ids) for ``n`` requests; a function too long for ``max_prompt`` tokens
    is passed over for the next one (cutting it would cut the code the answer copies)."""
    out: list[tuple[str, list[int]]] = []
    for req in copy_requests(4 * n, seed):
        text = tokenizer.apply_chat_template([{"role": "user", "content": req.message()}])
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_prompt:
            out.append((req.kind, ids))
        if len(out) == n:
            return out
    raise InvalidParameterError(f"max_prompt: only {len(out)} of {n} copy prompts fit in {max_prompt} tokens",
                                "max_prompt")


def _dedent(source: str, col: int) -> str:
    """A method's source with its first line's indentation taken off the others too."""
    lines = source.splitlines()
    return "\n".join([lines[0]] + [ln[col:] if ln[:col].isspace() else ln for ln in lines[1:]])
