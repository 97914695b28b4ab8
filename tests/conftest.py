"""Shared fixtures. ``benchmarks_dir`` skips (loudly, with the reason) where
``../shared/benchmarks`` is absent, so the suite still passes on a bare checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def rematopt(*args):
    """The CLI through its real entry point, run from the checkout (where models/ is)."""
    return subprocess.run([sys.executable, "-m", "rematopt", *map(str, args)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)


def pytest_report_header(config):
    """The fuzz's profile and seed (tests/fuzzing.py), so a red run names the examples it drew."""
    import fuzzing

    return fuzzing.header()
