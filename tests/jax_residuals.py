"""What JAX saves for the backward pass, read through its public report
(``jax.ad_checkpoint.print_saved_residuals``), what a traced graph marks as
residuals, and planned gradients against the plain ones: helpers the JAX
tests share."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import re
from dataclasses import dataclass

import jax
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from rematopt import PlanBuilder, simulate
from rematopt.graph import Graph

_LINE = re.compile(r"^(?P<dtype>[a-z]+)(?P<bits>\d*)(?P<impl><(?!host>)\w+>)?(?P<host><host>)?\[(?P<shape>[\d,]*)\] "
                   r"(?P<source>.*)$")
KEY_BYTES = 8  # a threefry key (key<fry>): two uint32 words


@dataclass(frozen=True)
class Residual:
    bytes: int
    host: bool
    source: str  # "from the argument x", "named 'mlpwi' from ...", "output of tanh from ..."

    @property
    def name(self) -> str | None:
        return self.source.split("'")[1] if self.source.startswith("named '") else None


@functools.cache
def tanh_derivative_in_forward() -> bool:
    """Whether the installed JAX computes tanh's derivative in the forward pass
    (``one_minus_square``, JAX 0.11), which the backward pass then reads, where
    0.10 computes it in the backward pass from tanh's output: the two save
    other values, so a few figures the tests pin differ by version."""
    return "one_minus_square" in str(jax.make_jaxpr(jax.grad(jax.numpy.tanh))(1.0))


def saved_residuals(fn, *args) -> list[Residual]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    found = []
    for line in out.getvalue().splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            raise ValueError(f"unreadable residual line: {line!r}")
        itemsize = KEY_BYTES if m["impl"] else 1 if m["dtype"] == "bool" else int(m["bits"]) // 8
        elements = math.prod(int(d) for d in m["shape"].split(",") if d)
        found.append(Residual(elements * itemsize, m["host"] is not None, m["source"]))
    return found


def saved(fn, args):
    """(device bytes, host bytes) of values the gradient saves, arguments and literals excluded."""
    dev, host = [], []
    for r in saved_residuals(lambda p: fn(p, *args[1:]), args[0]):
        if r.source.startswith(("from the argument", "from a literal", "from a constant")):
            continue
        (host if r.host else dev).append(r.bytes)
    return sorted(dev), sorted(host)


def assert_same_gradients(fn, planned, args):
    want, got = jax.jit(jax.grad(fn))(*args), jax.jit(jax.grad(planned))(*args)
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(jax.jit(planned)(*args)) == pytest.approx(float(jax.jit(fn)(*args)), rel=1e-6)


def residual_values(g: Graph) -> list[int]:
    """Bytes of each value jax.vjp saves, as the graph records them (see
    :func:`residuals_by_node`). Every forward node with a backward consumer must
    be marked (jax.vjp may also save a value the backward pass never reads, e.g.
    the zeros of ``jnp.where``'s tangent rule)."""
    for v in g.nodes:
        crosses = v.phase == "forward" and any(g.nodes[s].phase == "backward" for s in g.succs[v.id])
        assert v.extra.get("residual", False) or not crosses, f"{v.name} crosses but is not marked"
    return sorted(b for _, b in residuals_by_node(g))


def residuals_by_node(g: Graph):
    """(node id, bytes) of each value jax.vjp saves: a residual node's saved
    outputs, or its ``residual_values`` where views of its buffer are saved too
    (JAX lists a view and its source apart, though they are one buffer)."""
    for v in g.nodes:
        if "residual_values" in v.extra:
            yield from ((v.id, b) for b in v.extra["residual_values"])
        elif v.extra.get("residual"):
            sizes = v.extra.get("out_bytes", [v.bytes])
            yield from ((v.id, sizes[i]) for i in v.extra.get("residual_outputs", range(len(sizes))))


def jax_residuals(fn, args) -> list[int]:
    """Bytes of JAX's saved residuals w.r.t. the parameters, arguments and literals excluded."""
    res = saved_residuals(lambda p: fn(p, *args[1:]), args[0])
    return sorted(r.bytes for r in res
                  if not r.source.startswith(("from the argument", "from a literal", "from a constant")))


def recompute_plan(g, recompute=(), offload=()):
    """Forward pass in order; then free the ``recompute`` nodes and offload +
    free the ``offload`` ones; backward pass in order, prefetching offloaded
    values and recomputing freed ones (recursively) just before they are read."""
    b = PlanBuilder()
    resident = {v.id for v in g.nodes if v.is_input}
    forward = [i for i in g.order if g.nodes[i].phase == "forward"]
    for i in forward:
        b.compute(i)
        resident.add(i)
    for i in forward:
        if i in offload:
            b.offload(i)
        if i in offload or i in recompute:
            b.free(i)
            resident.discard(i)

    def ensure(i):
        if i in resident:
            return
        if i in offload:
            b.prefetch(i)
        else:
            for p in g.preds[i]:
                ensure(p)
            b.compute(i)
        resident.add(i)

    for i in g.order:
        if g.nodes[i].phase == "backward":
            for p in g.preds[i]:
                ensure(p)
            b.compute(i)
            resident.add(i)
    plan = b.build(g.name, "test")
    replay = simulate(g, plan)
    assert replay.valid, replay.error
    return plan
