"""What every benchmark hands back (``BenchResult``: tables with the baseline row and the ratio, the raw
measurements) and how it is shown: an aligned table on stdout, and ``PREFIX.json`` + ``PREFIX.md`` +
``PREFIX.png`` (the plot needs the optional ``plot`` extra, matplotlib; without it the PNG is skipped with a
warning)."""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cinq.markdown_table import fmt, markdown_table

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Table:
    """One table of a report: a title, column names and rows of cells (numbers, text, None for "n/a")."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


@dataclass(slots=True)
class BenchResult:
    """One benchmark run: what it measured (``data``, the JSON) and how to present it.

    ``headline``: the ratio against the baseline measured in the same run, one line (printed last, bold in the
    markdown). ``plot`` draws the figure into a matplotlib ``Figure`` it is given."""

    kind: str
    title: str
    setup: str
    tables: list[Table]
    headline: str
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    plot: Callable[[Any], None] | None = None


def machine_info(load_at_start: float | None = None) -> dict[str, Any]:
    """Where the run happened (for the JSON and the setup line): CPU, torch threads, torch version, load; given
    the 1-minute load when the run began, also that and ``run_conditions``' verdict (the results table reads it)."""
    import torch
    from cinq.plan.cpu import cpu_label
    info = {"cpu": cpu_label(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    if load_at_start is not None:
        info["load_at_start"] = round(load_at_start, 2)
    return info


QUIET_LOAD = 1.0  # 1-minute load average at a run's start below which nothing else shared the cores


def run_conditions(load_at_start: float) -> tuple[bool, str]:
    """Whether a run counts as measured alone (``True``: the cores were idle when it began) or as a draft, and the
    line a report opens with to say so, naming the CPU (``cinq.plan.cpu.cpu_label``)."""
    from cinq.plan.cpu import cpu_label
    cpu = f" CPU: {cpu_label()}."
    if load_at_start <= QUIET_LOAD:
        return False, f"Quiet machine: load average {load_at_start:.2f} when the run began (nothing else running).{cpu}"
    return True, (f"**DRAFT: the machine was shared (load average {load_at_start:.2f} when the run began); rerun "
                  f"alone before quoting these timings.**{cpu}")


def model_label(model: str) -> str:
    """How a report names a model: an embedded model by its name (not this machine's path to it; "" is the
    default model), a folder under the home directory as ``~/...``, any other folder as given."""
    from cinq.assets import ASSETS_DIR, default_model_path
    from cinq.real_models import real_model_for_file
    path = Path(model) if model else default_model_path()
    named = real_model_for_file(path) if path.is_file() else None
    if named is not None and named.path() == path:  # a named real model: its name, not the package's path
        return named.name
    try:
        if path.resolve().parent == ASSETS_DIR.resolve():
            return path.name
        return "~/" + str(path.resolve().relative_to(Path.home()))  # no user's home in a committed report
    except (OSError, ValueError):
        return str(model)


def text_table(table: Table) -> str:
    """The table as aligned plain text (the terminal view)."""
    cells = [table.columns] + [[fmt(c) for c in row] for row in table.rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(table.columns))]
    lines = [table.title, "  ".join(c.ljust(w) for c, w in zip(table.columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for raw, row in zip(table.rows, cells[1:]):  # numbers right-aligned, text left-aligned
        lines.append("  ".join(c.rjust(w) if isinstance(v, (int, float)) and not isinstance(v, bool) else c.ljust(w)
                               for v, c, w in zip(raw, row, widths)).rstrip())
    return "\n".join(lines)


def markdown(result: BenchResult) -> str:
    """The report as markdown: title, setup, every table, the headline ratio and the notes."""
    lines = [f"# {result.title}", "", result.setup, ""]
    for table in result.tables:
        lines += [f"## {table.title}", "", markdown_table(table.columns, table.rows), ""]
    lines += [f"**{result.headline}**", ""]
    lines += [f"{note}\n" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def print_report(result: BenchResult, file: TextIO | None = None) -> None:
    """Every table as aligned text, then the headline."""
    out = file or sys.stdout
    for table in result.tables:
        print(text_table(table), file=out)
        print(file=out)
    print(result.headline, file=out, flush=True)


def write_report(result: BenchResult, prefix: str | Path) -> list[Path]:
    """Write ``PREFIX.json``, ``PREFIX.md`` and (with matplotlib) ``PREFIX.png``; returns the paths written."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".md")
    payload = {"kind": result.kind, "title": result.title, "headline": result.headline, **result.data}
    json_path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    md_path.write_text(markdown(result))
    written = [json_path, md_path]
    if result.plot is not None:
        png = _write_plot(result, prefix.with_name(prefix.name + ".png"))
        if png is not None:
            written.append(png)
    return written


def publish(result: BenchResult, prefix: str | Path | None) -> list[Path]:
    """``print_report``, then ``write_report`` to ``prefix`` (None: print only, a benchmark's --no-write)."""
    print_report(result)
    return write_report(result, prefix) if prefix is not None else []


def _write_plot(result: BenchResult, path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'cinq[plot]'): no plot written")
        return None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(12, 4))
    result.plot(fig)  # type: ignore[misc]
    fig.suptitle(result.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
