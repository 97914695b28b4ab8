"""Shared fixtures. ``benchmarks_dir`` skips (loudly, with the reason) where
``../shared/benchmarks`` is absent, so the suite still passes on a bare checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
NODELINK_DIR = SHARED_BENCHMARKS / "nodelink"


@pytest.fixture
def benchmarks_dir() -> Path:
    if not NODELINK_DIR.is_dir():
        pytest.skip(f"published benchmark graphs not found at {NODELINK_DIR} (../shared is absent)")
    return NODELINK_DIR


def nodelink_files() -> list[Path]:
    """The published graphs, for parametrisation (empty where ../shared is absent)."""
    return sorted(NODELINK_DIR.glob("*.json")) if NODELINK_DIR.is_dir() else []


def last_json(script: str, env: dict | None = None, timeout: float = 300, cwd: Path | None = None):
    """Run ``script`` in a fresh interpreter (``env``: its environment, this one's by default); the JSON
    of the last line it printed. A script that fails fails the test with its stderr's tail."""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout,
                         cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def rematopt(*args):
    """The CLI through its real entry point, run from the checkout (where models/ is)."""
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)


def pytest_report_header(config):
    """The fuzz's profile and seed (tests/fuzzing.py), so a red run names the examples it drew."""
    import fuzzing

    return fuzzing.header()


@contextmanager
def cpu_burner() -> Iterator[None]:
    """A thread spinning in Python beside the block: it takes the GIL from
    the Python of this process and a core from everything else (CP-SAT's
    search, a CLI run in a subprocess, XLA's compiles)."""
    stop = threading.Event()

    def burn() -> None:
        x = 0
        while not stop.is_set():
            x = (x * 31 + 7) % 1_000_003

    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
