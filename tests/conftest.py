"""Shared fixtures. ``benchmarks_dir`` skips (loudly, with the reason) where
``../shared/benchmarks`` is absent, so the suite still passes on a bare checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

# The suite compiles hundreds of steps, most of them only to read their memory and program: every compile
# in it skips LLVM's optimization of its kernels, in this process (XLA reads XLA_FLAGS when the backend
# starts, after this) and in every process it starts with its environment or through last_json. XLA's
# program and buffers come before it (tests/test_xla_flags.py compiles both ways and compares); its
# kernels run slower, on steps of kilobytes. Tests that time steps ask for the optimized kernels
# (the optimized_kernels fixture).
# rematopt.xla.flags.READ_ONLY as a flag: imported from there, this file would need JAX, which the suite can do without
FAST_COMPILE = "--xla_backend_optimization_level=0"


def _with_fast_compile(flags: str) -> str:
    return flags if FAST_COMPILE in flags.split() else f"{flags} {FAST_COMPILE}".strip()


os.environ["XLA_FLAGS"] = _with_fast_compile(os.environ.get("XLA_FLAGS", ""))


@pytest.fixture
def optimized_kernels(monkeypatch):
    """XLA_FLAGS without :data:`FAST_COMPILE`, for the processes a test that times steps starts."""
    monkeypatch.setenv("XLA_FLAGS", " ".join(w for w in os.environ["XLA_FLAGS"].split() if w != FAST_COMPILE))


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
    of the last line it printed, its compiles fast (:data:`FAST_COMPILE`). A script that fails fails the test
    with its stderr's tail."""
    if env is not None:
        env = {**env, "XLA_FLAGS": _with_fast_compile(env.get("XLA_FLAGS", ""))}
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
