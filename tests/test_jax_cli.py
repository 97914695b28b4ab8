"""``rematopt import jax`` and ``rematopt jax-measure`` through the real entry point."""

from __future__ import annotations


import pytest

pytest.importorskip("jax")

from rematopt import no_remat_plan, simulate  # noqa: E402
from rematopt.importers import load as load_graph  # noqa: E402

from conftest import rematopt  # noqa: E402

TINY = ["--set", "layers=2", "--set", "width=16", "--set", "in_dim=8", "--set", "batch=4"]


def test_import_jax_writes_a_phased_graph_with_provenance(tmp_path):
    out = tmp_path / "mlp.json"
    run = rematopt("import", "jax", "models.mlp:factory", *TINY, "--fuse", "--device", "h100", "-o", out)
    assert run.returncode == 0, run.stderr
    g = load_graph(out)
    assert f"{g.meta['nodes']} nodes fused from {g.meta['nodes_unfused']}" in run.stdout
    assert g.meta["model"] == "models.mlp:factory" and g.meta["config"]["width"] == 16
    assert g.meta["device"] == "h100" and g.meta["fuse"] is True and g.has_phases
    assert simulate(g, no_remat_plan(g)).valid


@pytest.mark.parametrize("args,message", [
    (["models.mlp"], "expected MODULE:FACTORY"),
    (["models.nothing:factory"], "cannot import models.nothing"),
    (["models.mlp:factory", "--set", "depth=3"], "unknown config depth"),
    (["models.mlp:CONFIG"], "no callable CONFIG"),
])
def test_bad_factories_exit_2_with_one_line(tmp_path, args, message):
    run = rematopt("import", "jax", *args, "-o", tmp_path / "g.json")
    assert run.returncode == 2
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_jax_measure_writes_the_table(tmp_path):
    table = tmp_path / "t.md"
    run = rematopt("jax-measure", "models.mlp:factory", *TINY, "--budget-ratio", "0.8",
                   "--planner", "no-such-planner", "-o", table)
    assert run.returncode == 0, run.stderr
    text = table.read_text()
    for row in ("no checkpointing", "jax.checkpoint(nothing_saveable)", "jax.checkpoint(dots_saveable)",
                "jax.checkpoint(dots_with_no_batch_dims_saveable)", "rematopt no-remat (control)"):
        assert f"| {row} |" in text
    assert "rematopt no-such-planner" in text and "not available" in text
