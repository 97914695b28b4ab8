"""Graphs over what XLA materializes (``trace_grad(..., fuse="xla")``): nodes are the values XLA's
kernels write, learned from the compiled plain step."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from conftest import rematopt  # noqa: E402
from rematopt.jax import apply_plan, trace_grad  # noqa: E402
from rematopt.reference import no_remat_peak, no_remat_plan  # noqa: E402
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
    ops = [v.op for v in compiled.nodes if not v.is_input and v.op != "xla_buffer"]
    # XLA on CPU fuses sin and cos (and the backward's products) into the kernels reading them:
    # they are no nodes of their own; tanh and the matmuls are written to memory (the backward
    # matmul as the transpose XLA folded into it)
    assert "sin" in {v.op for v in unfused.nodes} and "cos" in {v.op for v in unfused.nodes}
    assert not {"sin", "cos"} & set(ops)
    assert {"tanh", "dot_general", "transpose"} <= set(ops)
    assert compiled.n < unfused.n
    # the fused equations are inside the nodes that read them (recomputed there, free)
    groups = compiled.meta["groups"]
    assert len(groups) == sum(not v.is_input and v.op != "xla_buffer" for v in compiled.nodes)
    assert sum(len(g) for g in groups) > len(groups)
    meta = compiled.meta["xla"]
    assert meta["backend"] == "cpu" and meta["xla_bytes_are"] == "temp + arguments + outputs - aliases"
    assert simulate(compiled, no_remat_plan(compiled)).valid


def test_memory_as_xla_allocates_it(graphs):
    unfused, compiled = graphs
    # each result (the loss, the gradient of w) holds an allocation from the start: a persistent
    # input of the result's bytes; the output node itself costs nothing more
    held = {v.extra["allocation_of"]: v for v in compiled.nodes if "allocation_of" in v.extra}
    outputs = [v for v in compiled.nodes if v.output]
    assert sorted(held) == sorted(v.id for v in outputs)
    step_nodes = compiled.meta["xla"]["step_nodes"]
    assert step_nodes == len(compiled.meta["groups"]) + len(ARGS) and min(held.values(), key=lambda v: v.id).id >= step_nodes
    assert all(held[v.id].persistent and held[v.id].is_input and v.bytes == 0 for v in outputs)
    assert sorted(v.bytes for v in held.values()) == sorted(v.bytes for v in unfused.nodes if v.output)
    # the temporaries XLA makes beyond one per equation (here a transposed copy for the backward
    # matmul) are nodes read by the node of their last reader, before it in the order
    extra = [v for v in compiled.nodes if v.op == "xla_buffer"]
    assert extra and all(v.extra["xla_buffer"] and v.bytes and compiled.succs[v.id] for v in extra)
    pos = compiled.position
    assert all(pos[v.id] < pos[s] for v in extra for s in compiled.succs[v.id])
    # the graph's no-remat peak is XLA's figure for the same step (CPU: temp + arguments + outputs)
    meta = compiled.meta["xla"]
    assert abs(no_remat_peak(compiled) / meta["xla_bytes"] - 1) < 0.03, (no_remat_peak(compiled), meta)


def test_plans_of_compiled_graphs_apply(graphs):
    from rematopt import solve

    _, compiled = graphs
    want = jax.grad(_step)(*ARGS)
    plain = jax.jit(jax.grad(_step)).lower(*ARGS).compile().cost_analysis()
    for plan in (no_remat_plan(compiled), solve(compiled, "jax-nothing-saveable").plan):
        planned = apply_plan(_step, compiled, plan)
        assert jnp.allclose(jax.grad(planned)(*ARGS), want, rtol=1e-5, atol=1e-6)
    # the no-remat plan runs the plain step's work, in XLA's order; in its own order (CPU) plus the ties' adds
    flops = lambda f: jax.jit(jax.grad(f)).lower(*ARGS).compile().cost_analysis()["flops"]  # noqa: E731
    assert flops(apply_plan(_step, compiled, no_remat_plan(compiled), ordered=False)) == plain["flops"]
    tied = flops(apply_plan(_step, compiled, no_remat_plan(compiled)))
    assert plain["flops"] <= tied <= 1.05 * plain["flops"]


def test_cli_fuse_xla(tmp_path):
    out = tmp_path / "g.json"
    done = rematopt("import", "jax", "models.mlp:factory", "--set", "layers=2", "--fuse", "xla", "-o", out)
    assert done.returncode == 0, done.stderr
    table = rematopt("import", "jax", "models.mlp:factory", "--set", "layers=2", "--fuse", "-o", tmp_path / "t.json")
    assert table.returncode == 0, table.stderr
    import json

    assert json.loads(out.read_text())["meta"]["fuse"] == "xla"
    assert json.loads((tmp_path / "t.json").read_text())["meta"]["fuse"] is True
