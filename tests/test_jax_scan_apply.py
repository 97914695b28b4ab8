"""Plans applied to scanned programs stay scanned: iterations a plan treats
alike run as one ``lax.scan`` in the planned gradient (forward and backward),
iterations it treats differently run unrolled and a warning says which and
why. Gradients equal the plain step's either way."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import numpy as np  # noqa: E402

from rematopt import no_remat_plan, solve  # noqa: E402
from rematopt.jax import UnrolledLoop, apply_plan, residual_fates, trace_grad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_residuals import assert_same_gradients, saved, tanh_derivative_in_forward  # noqa: E402
from models import gpt_scan  # noqa: E402
from test_jax_apply import recompute_plan  # noqa: E402

GPT = {"layers": 3, "width": 16, "heads": 2, "seq": 4, "vocab": 16}


@pytest.fixture(scope="module")
def decoder():
    fn, args = gpt_scan.factory(**GPT)
    return fn, args, trace_grad(fn, *args)


def lowered_loops(planned, args) -> tuple[int, int]:
    """(while loops, dot_general ops) in the planned gradient's StableHLO."""
    text = jax.jit(jax.grad(planned)).lower(*args).as_text()
    return text.count("stablehlo.while"), text.count("stablehlo.dot_general")


def applied(fn, args, graph, plan):
    """``apply_plan`` and its gradient traced (not run), with the UnrolledLoop warnings it gave."""
    planned = apply_plan(fn, graph, plan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.eval_shape(jax.grad(planned), *args)
    return planned, [w for w in caught if issubclass(w.category, UnrolledLoop)]


def layer_nodes(g, op):
    return {v.id for v in g.nodes if v.op == op and v.phase == "forward" and "iteration" in v.extra}


def gelu_residuals(g):
    """Per layer, the value of GELU's tanh the backward pass reads: the tanh (JAX 0.10), or its
    ``one_minus_square`` (JAX 0.11 computes tanh's derivative in the forward pass)."""
    read = lambda u: any(g.nodes[r].phase == "backward" for r in g.succs[u])  # noqa: E731
    return {u for t in layer_nodes(g, "tanh") for u in (t, *g.succs[t])
            if read(u) and (u == t or g.nodes[u].op == "one_minus_square")}


def test_a_plan_alike_in_every_iteration_stays_scanned(decoder):
    fn, args, g = decoder
    tanhs = gelu_residuals(g)
    assert len(tanhs) == GPT["layers"]
    plan = recompute_plan(g, recompute=tanhs)
    assert residual_fates(g, plan).recomputed == tanhs
    planned, said = applied(fn, args, g, plan)
    assert not said
    (note,) = planned.loops
    assert note.rolled and note.iterations == GPT["layers"]
    assert note.scanned == {"forward": [(0, 2)], "backward": [(2, 0)]}
    assert_same_gradients(fn, planned, args)
    # what the scans save is what the plan keeps, stacked by layer
    kept = sorted(g.nodes[i].bytes for i in residual_fates(g, plan).kept)
    dev, host = saved(planned, args)
    assert sum(dev) == sum(kept) and len(dev) < len(kept) and not host
    # one forward and one backward loop; the layer's matmuls appear once, not once per layer
    unrolled = apply_plan(fn, g, plan, scan=False)
    (loops, dots), (_, dots_unrolled) = lowered_loops(planned, args), lowered_loops(unrolled, args)
    assert loops == 2 and dots < dots_unrolled / 2
    assert unrolled.loops == [] and lowered_loops(unrolled, args)[0] == 0


def test_values_offloaded_in_every_iteration_leave_the_scan_stacked_in_host_memory(decoder):
    fn, args, g = decoder
    tanhs = gelu_residuals(g)
    plan = recompute_plan(g, offload=tanhs)
    planned, said = applied(fn, args, g, plan)
    assert not said and planned.loops[0].rolled
    assert_same_gradients(fn, planned, args)
    fates = residual_fates(g, plan)
    dev, host = saved(planned, args)
    assert fates.offloaded == tanhs and host == [sum(g.nodes[i].bytes for i in tanhs)]
    assert sum(dev) == sum(g.nodes[i].bytes for i in fates.kept)


def test_a_plan_that_differs_by_iteration_unrolls_and_says_so(decoder):
    fn, args, g = decoder
    middle = {i for i in gelu_residuals(g) if g.nodes[i].extra["iteration"] == [1]}
    planned, said = applied(fn, args, g, recompute_plan(g, recompute=middle))
    (note,) = planned.loops
    assert not note.rolled and note.unrolled == {"forward": [0, 1, 2], "backward": [0, 1, 2]}
    assert note.scanned == {}
    assert "saves or offloads other values in iteration 1 than in 0" in note.why["forward"]
    assert "recomputes" in note.why["backward"] and "iteration 1" in note.why["backward"]
    (warning,) = said
    assert str(warning.message) == f"apply_plan: {g.name}: {note.describe()}"
    assert note.describe().startswith("loop of 3 iterations at gpt.py:")  # the body is gpt.block
    assert_same_gradients(fn, planned, args)
    assert lowered_loops(planned, args)[0] == 0


def test_a_checkpoint_name_policy_scans_all_but_the_last_layer(decoder):
    """``jax-names`` without ``--per-layer`` gives every layer the same policy;
    the last layer's output feeds the head, not a next layer, so the plan
    treats that iteration differently and it alone runs unrolled."""
    fn, args, g = decoder
    # the least-memory name policy: 0.807 of the plain step on JAX 0.10, 0.847 on 0.11, 0.867 on 0.12 (whose
    # steps save GELU's tanh derivative, unnamed)
    sol = solve(g, "jax-names", price=False)
    assert sol.has_plan and not sol.plan.stats.get("per_layer")
    planned, said = applied(fn, args, g, sol.plan)
    (note,) = planned.loops
    assert note.scanned == {"forward": [(0, 1)], "backward": [(1, 0)]}
    assert note.unrolled == {"forward": [2], "backward": [2]} and len(said) == 1
    assert_same_gradients(fn, planned, args)
    assert lowered_loops(planned, args)[0] == 2


def test_boundary_iterations_that_differ_run_unrolled_around_the_scan():
    """``fori_loop``'s counter: the first iteration reads the literal start,
    the last one's increment is dead; the iterations between are scanned."""
    def loss(w, x):
        return jax.numpy.sum(jax.lax.fori_loop(0, 5, lambda i, h: jax.numpy.tanh(h @ w[i]), x) ** 2)

    args = (np.random.default_rng(4).standard_normal((5, 6, 6)).astype(np.float32) * 0.4,
            np.ones((2, 6), np.float32))
    g = trace_grad(loss, *args)
    planned, said = applied(loss, args, g, no_remat_plan(g))
    (note,) = planned.loops
    assert note.scanned["forward"] == [(1, 3)] and note.unrolled["forward"] == [0, 4]
    assert "iteration 1 runs other operations than 0" in note.why["forward"] and len(said) == 1
    assert_same_gradients(loss, planned, args)


def test_jax_measure_compares_the_scanned_application_with_the_unrolled_one():
    from rematopt.jax import measure

    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jax.numpy.tanh(h @ w), None), x, ws)
        return jax.numpy.sum(h ** 2)

    args = (np.random.default_rng(5).standard_normal((4, 8, 8)).astype(np.float32) * 0.3,
            np.ones((2, 8), np.float32))
    m = measure(loss, *args, budget_ratio=0.8, planners=())
    rows = {r.variant: r for r in m.rows}
    scanned, unrolled = rows["rematopt no-remat (control)"], rows["rematopt no-remat (control) (unrolled)"]
    assert scanned.grad_error == unrolled.grad_error == 0.0
    # JAX 0.11: the last iteration, whose carry only the loss reads, saves other values and runs unrolled
    forward = "forward: scanned 0-2, unrolled 3" if tanh_derivative_in_forward() else "forward: scanned 0-3"
    assert forward in scanned.note and not unrolled.note
    assert all(r.compile_s > 0 for r in rows.values())
    assert "| compile s |" in m.markdown()


def eqn(fn, ins, out, *args):
    """A hand-made equation: ``fn``'s primitive reading value ids ``ins``."""
    from rematopt.importers.jaxpr.flatten import Eqn

    e = jax.make_jaxpr(fn)(*args).eqns[0]
    return Eqn(e.primitive, dict(e.params), ins, [out], False)


def test_a_run_ends_early_when_the_next_iteration_reads_a_value_the_run_does_not_hand_on():
    """Four iterations of ``a = sin(c); b = cos(c)`` carrying ``a``; the last
    one also reads the ``b`` of the one before. Iterations 0-2 are alike, but
    a scan over them would not hand on iteration 2's ``b``: the run is 0-1,
    and iterations 2 and 3 run unrolled. Values equal the plain evaluation."""
    from rematopt.exporters.jax_loops import LoopNote, Run, Unit, execute, roll, value
    from rematopt.importers.jaxpr.flatten import evaluate

    x = np.linspace(0.1, 0.9, 5).astype(np.float32)
    units, carry, ids = [], 0, iter(range(1, 100))
    for i in range(4):
        a, b = next(ids), next(ids)
        units += [Unit(a, (eqn(jax.numpy.sin, [carry], a, x),), loop=("L", i)),
                  Unit(b, (eqn(jax.numpy.cos, [carry], b, x),), loop=("L", i))]
        if i == 3:
            units.append(Unit(99, (eqn(jax.numpy.multiply, [a, units[-3].node], 99, x, x),), loop=("L", i)))
        carry = a
    notes: dict[str, LoopNote] = {}
    aval = lambda v: jax.core.ShapedArray(x.shape, x.dtype)  # noqa: E731
    items = roll(units, aval, {99}, lambda v: (), "forward", notes)
    (run,) = [it for it in items if isinstance(it, Run)]
    assert run.iterations == (0, 1) and len(items) == 1 + 5
    assert notes["L"].scanned == {"forward": [(0, 1)]} and notes["L"].unrolled == {"forward": [2, 3]}

    def do(u, env, last):
        evaluate(u.eqns, env)
        return last

    env = {0: x}
    execute(items, env, do)
    plain = {0: x}
    for u in units:
        evaluate(u.eqns, plain)
    np.testing.assert_allclose(value(env, 99), plain[99], rtol=1e-6)


def test_slices_of_a_computed_stack_move_out_of_the_way_of_the_scan():
    """Scanning over a computed array slices it between the iterations (and
    the backward pass pads each slice's cotangent there): those operations
    neither read an iteration nor feed the next, so they move before or after
    the loop, and the forward pass is one scan."""
    def loss(w, x):
        xs = jax.numpy.tanh(x)
        h, _ = jax.lax.scan(lambda h, xi: (jax.numpy.tanh(h @ w + xi), None), xs[0], xs)
        return jax.numpy.sum(h ** 2)

    args = (np.random.default_rng(6).standard_normal((6, 6)).astype(np.float32) * 0.4,
            np.random.default_rng(7).standard_normal((4, 2, 6)).astype(np.float32))
    g = trace_grad(loss, *args, argnums=(0, 1))
    planned, _ = applied(loss, args, g, no_remat_plan(g))
    (note,) = planned.loops
    if tanh_derivative_in_forward():  # JAX 0.11: the last iteration saves other values (test above)
        assert note.scanned["forward"] == [(0, 2)] and note.unrolled["forward"] == [3]
    else:
        assert note.scanned["forward"] == [(0, 3)] and not note.unrolled.get("forward")
    assert note.scanned["backward"] == [(2, 1)]  # the first and last iterations' cotangents differ
    got = jax.jit(jax.grad(planned, argnums=(0, 1)))(*args)
    for a, b in zip(got, jax.grad(loss, argnums=(0, 1))(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_operation_between_iterations_that_feeds_the_next_one_keeps_the_loop_unrolled():
    from rematopt.exporters.jax_loops import LoopNote, Unit, roll

    x = np.ones(3, np.float32)
    units = [Unit(1, (eqn(jax.numpy.sin, [0], 1, x),), loop=("L", 0)),
             Unit(2, (eqn(jax.numpy.cos, [1], 2, x),)),  # outside the loop, between its iterations
             Unit(3, (eqn(jax.numpy.sin, [2], 3, x),), loop=("L", 1)),
             Unit(4, (eqn(jax.numpy.sin, [3], 4, x),), loop=("L", 2))]
    notes: dict[str, LoopNote] = {}
    items = roll(units, lambda v: jax.core.ShapedArray(x.shape, x.dtype), {4}, lambda v: (), "forward", notes)
    assert items == units
    assert notes["L"].unrolled == {"forward": [0, 1, 2]} and notes["L"].iterations == 3
    assert "reading one and feeding the next" in notes["L"].why["forward"]
