"""What every command module shares: reading the GRAPH argument, refusing an
unwritable output early, printing figures, and the command's own clock."""

from __future__ import annotations

import json
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..errors import RematoptError
from ..graph import Graph
from ..importers import load as load_graph
from ..sizes import with_human


def default_graph_path() -> Path:
    """The small instance shipped inside the package, for ``solve`` with no GRAPH."""
    return Path(str(resources.files("rematopt") / "data" / "default.json"))


def load_graph_arg(path: str | None, drop_unsafe_marks: bool = False) -> Graph:
    return load_graph(path if path is not None else default_graph_path(), drop_unsafe_marks=drop_unsafe_marks)


# For MLIR input: a tessera.recompute mark on an effectful op is an error unless this is given.
drop_unsafe_marks_option = click.option(
    "--drop-unsafe-marks", is_flag=True,
    help="MLIR: warn about (instead of refusing) a tessera.recompute mark on an op that is not "
         "recomputable (REMAT_EFFECTFUL), and ignore the mark.")


def check_writable(path: str | None) -> None:
    """Refuse an output path whose directory is missing or read-only before
    the work that would be written there, not after it."""
    if path is None:
        return
    where = Path(path).parent
    if not where.is_dir():
        raise RematoptError(f"{path}: no such directory {str(where)!r}")
    if not os.access(where, os.W_OK):
        raise RematoptError(f"{path}: directory {str(where)!r} is not writable")


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, default=str))


def figures_table(title: str, rows: dict[str, Any]) -> None:
    """Two columns; byte counts (keys ending in ``bytes``) also in human units."""
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = with_human(value) if key.endswith("bytes") else f"{value:,}"
        table.add_row(key, str(value))
    Console().print(table)


# A process older than this when the command begins was not started for it
# (an in-process call, as tests make): its start-up is not the command's.
FRESH_S = 5.0
_started: float | None = None  # time.perf_counter() at the command's start


def command_started(now: float | None = 0.0) -> None:
    """Mark the command's start (``main`` calls this; None clears it): the
    process's start when the process was started for it, so a
    ``--time-limit`` counts the interpreter and the imports too."""
    global _started
    if now is None:
        _started = None
        return
    age = _process_age()
    _started = time.perf_counter() - (age if age < FRESH_S else 0.0)


def _process_age() -> float:
    """Seconds since this process started (0 where /proc does not say)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def since_start() -> float:
    """Seconds since the command started (0 outside ``main``: click's test runner)."""
    return 0.0 if _started is None else max(0.0, time.perf_counter() - _started)
