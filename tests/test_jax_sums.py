"""Backward sums computed once: XLA's CPU fusion computes a cotangent summed over its forward value's
readers (``add_any``) again inside every kernel reading it, and down a residual stream the chain grows a
layer per block. apply_plan writes each such sum once (through a conditional XLA cannot fuse across).
Checked on the compiled module against the plain step, the gradients against the plain step's."""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

from rematopt.jax import apply_plan, trace_grad  # noqa: E402
from rematopt.reference import no_remat_plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_residuals import assert_same_gradients  # noqa: E402
from models import gpt  # noqa: E402


def figures(fn, args) -> dict:
    """The compiled step's conditionals, its largest fusion's operands, its FLOPs."""
    c = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
    text = c.as_text()
    operands = [m.group(1).count("%") for m in re.finditer(r"= \S+ fusion\((.*?)\), kind", text)]
    costs = c.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    return {"conditionals": text.count(" conditional("), "largest": max(operands), "flops": costs["flops"]}


@pytest.fixture(scope="module")
def steps():
    if jax.default_backend() != "cpu":
        pytest.skip("the sums are computed once on CPU only")
    out = {}
    for layers in (2, 4):
        fn, args = gpt.factory(layers=layers, width=32, heads=2, seq=16, batch=2, vocab=64)
        graph = trace_grad(fn, *args, fuse="xla")
        planned = apply_plan(fn, graph, no_remat_plan(graph))
        joined = collections.Counter(k for members in graph.meta["groups"] for k in members)
        out[layers] = {"fn": fn, "args": args, "graph": graph, "planned": planned,
                       "repeated": sum(n > 1 for n in joined.values()),
                       "plain": figures(fn, args), "applied": figures(planned, args)}
    return out


def test_the_sums_chain_no_longer_grows_with_depth(steps):
    # measured: the plain step's largest fusion reads 50 operands at 2 layers and 91 at 4; applied, 12 at both
    small, deep = steps[2], steps[4]
    assert deep["repeated"] > small["repeated"] > 0  # equations XLA fused into several kernels
    assert deep["plain"]["largest"] > small["plain"]["largest"]
    assert deep["applied"]["largest"] == small["applied"]["largest"] < small["plain"]["largest"]
    for got in (small, deep):
        assert got["applied"]["conditionals"] > 0 == got["plain"]["conditionals"]
        # each sum once, where the plain step computed it again in each kernel (4 layers: FLOPs -2.5%)
        assert got["applied"]["flops"] < got["plain"]["flops"]


def test_the_sums_computed_once_keep_the_gradients(steps):
    got = steps[4]
    assert_same_gradients(got["fn"], got["planned"], got["args"])


def test_a_graph_of_unfused_equations_has_no_sum_computed_once():
    fn, args = gpt.factory(layers=2, width=32, heads=2, seq=16, batch=2, vocab=64)
    graph = trace_grad(fn, *args)  # one equation a node: nothing XLA fused into several kernels
    assert figures(apply_plan(fn, graph, no_remat_plan(graph)), args)["conditionals"] == 0


def test_no_sum_is_sent_through_a_conditional_off_cpu(steps, monkeypatch):
    # GPU XLA bounds a fusion's operands and reads a conditional's predicate on the host: the step is
    # left as the plan's graph has it there (the backend is read as the step is traced)
    got = steps[2]
    fn, args, graph = got["fn"], got["args"], got["graph"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    lowered = jax.jit(jax.value_and_grad(apply_plan(fn, graph, no_remat_plan(graph)))).lower(*args).as_text()
    assert "stablehlo.case" not in lowered
    monkeypatch.undo()
    lowered = jax.jit(jax.value_and_grad(apply_plan(fn, graph, no_remat_plan(graph)))).lower(*args).as_text()
    assert "stablehlo.case" in lowered
