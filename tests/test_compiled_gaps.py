"""``python -m rematopt.studies.compiled_gaps``: its table on the smallest
instance (traced against compiled graph in two orders, each budget judged against the
graph's own floor), and a missing instance refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUSES = {"OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "below the lower bound"}


def study(*args) -> subprocess.CompletedProcess:
    """A fresh process from the checkout (models/ on the path, XLA's flags its own)."""
    return subprocess.run([sys.executable, "-m", "rematopt.studies.compiled_gaps", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_table_on_mlp(tmp_path):
    out = tmp_path / "gaps.md"
    r = study(out, "mlp_l4_w256", "--limit", "2")
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert "1 worker" in lines[0] and "2 s wall-clock limit" in lines[0]
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[4:]]
    assert [(x["graph"], x["ratio"]) for x in rows] == [
        ("traced", "0.8"), ("traced", "0.6"), ("compiled", "0.8"), ("compiled", "0.6"),
        ("compiled, eager", "0.8"), ("compiled, eager", "0.6")]
    traced_nodes = len(json.loads((ROOT / "instances" / "mlp_l4_w256.json").read_text())["nodes"])
    assert {int(x["nodes"]) for x in rows[:2]} == {traced_nodes}
    assert 0 < int(rows[2]["nodes"]) < traced_nodes  # XLA's kernels: fewer values than equations
    assert rows[4]["nodes"] == rows[2]["nodes"]  # the same graph in another order
    for x in rows:
        assert x["status"] in STATUSES
        assert (x["status"] == "below the lower bound") == (float(x["ratio"]) < float(x["floor"]))


def test_missing_instance(tmp_path):
    r = study(tmp_path / "gaps.md", "no_such_model")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: instances/no_such_model.json: no such instance file"]
    assert not (tmp_path / "gaps.md").exists()



def test_deterministic_time_heads_the_page_and_says_what_stopped_each_solve(tmp_path):
    """``--deterministic-time``: the page says the limit, and each solved row
    which limit ended it (here never the wall clock; that two runs agree is
    tests/test_cpsat_deterministic.py's)."""
    out = tmp_path / "gaps.md"
    r = study(out, "mlp_l4_w256", "--limit", "120", "--deterministic-time", "0.5")
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert "0.5 s of CP-SAT's deterministic time" in lines[0] and "120 s" in lines[0]
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[4:]]
    solved = [x for x in rows if x["status"] != "below the lower bound"]
    assert solved and all(x["stopped_by"] in ("", "deterministic_time") for x in solved)
    assert all(x["stopped_by"] == "" for x in rows if x not in solved)


def test_deterministic_time_refuses_a_negative_value(tmp_path):
    r = study(tmp_path / "gaps.md", "mlp_l4_w256", "--deterministic-time", "-1")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --deterministic-time must be >= 0, got -1.0"]
