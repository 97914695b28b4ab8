"""Graphs over what XLA materializes (``trace_grad(..., fuse="xla")``): nodes are the values XLA's
kernels write, learned from the compiled plain step."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from conftest import rematopt  # noqa: E402
from rematopt.jax import apply_plan, trace_grad  # noqa: E402
from rematopt.reference import no_remat_plan  # noqa: E402
from rematopt.simulate import simulate  # noqa: E402


def _step(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.sin(h) * h)


ARGS = (jnp.ones((64, 48)), jnp.ones((32, 64)))


@pytest.fixture(scope="module")
def graphs():
    return trace_grad(_step, *ARGS, fuse=False), trace_grad(_step, *ARGS, fuse="xla")


def test_nodes_are_what_kernels_write(graphs):
    unfused, compiled = graphs
    ops = [v.op for v in compiled.nodes if not v.is_input]
    # XLA on CPU fuses sin and cos (and the backward's products) into the kernels reading them:
    # they are no nodes of their own; tanh and the matmuls are written to memory (the backward
    # matmul as the transpose XLA folded into it)
    assert "sin" in {v.op for v in unfused.nodes} and "cos" in {v.op for v in unfused.nodes}
    assert not {"sin", "cos"} & set(ops)
    assert {"tanh", "dot_general", "transpose"} <= set(ops)
    assert compiled.n < unfused.n
    # the fused equations are inside the nodes that read them (recomputed there, free)
    groups = compiled.meta["groups"]
    assert len(groups) == compiled.n - sum(v.is_input for v in compiled.nodes)
    assert sum(len(g) for g in groups) > len(groups)
    meta = compiled.meta["xla"]
    assert meta["backend"] == "cpu" and meta["xla_bytes_are"] == "temp + arguments + outputs - aliases"
    assert simulate(compiled, no_remat_plan(compiled)).valid


def test_plans_of_compiled_graphs_apply(graphs):
    from rematopt import solve

    _, compiled = graphs
    want = jax.grad(_step)(*ARGS)
    plain = jax.jit(jax.grad(_step)).lower(*ARGS).compile().cost_analysis()
    for plan in (no_remat_plan(compiled), solve(compiled, "jax-nothing-saveable").plan):
        planned = apply_plan(_step, compiled, plan)
        assert jnp.allclose(jax.grad(planned)(*ARGS), want, rtol=1e-5, atol=1e-6)
    # the no-remat plan runs the plain step's work
    flops = lambda f: jax.jit(jax.grad(f)).lower(*ARGS).compile().cost_analysis()["flops"]  # noqa: E731
    assert flops(apply_plan(_step, compiled, no_remat_plan(compiled))) == plain["flops"]


def test_cli_fuse_xla(tmp_path):
    out = tmp_path / "g.json"
    done = rematopt("import", "jax", "models.mlp:factory", "--set", "layers=2", "--fuse", "xla", "-o", out)
    assert done.returncode == 0, done.stderr
    table = rematopt("import", "jax", "models.mlp:factory", "--set", "layers=2", "--fuse", "-o", tmp_path / "t.json")
    assert table.returncode == 0, table.stderr
    import json

    assert json.loads(out.read_text())["meta"]["fuse"] == "xla"
    assert json.loads((tmp_path / "t.json").read_text())["meta"]["fuse"] is True
