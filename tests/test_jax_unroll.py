"""Loops unrolled by the JAX front end: a scanned decoder gives the Python-loop
decoder's graph, nodes say where they came from (name stack, loop indices),
and plans made on the unrolled graph apply to the scanned program."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from rematopt import Graph, load, no_remat_plan, simulate, solve  # noqa: E402
from rematopt.importers.jaxpr.unroll import MAX_TRIP, scan_counts  # noqa: E402
from rematopt.exporters.jax_policy import UnrolledLoop  # noqa: E402
from rematopt.jax import apply_plan, residual_fates, trace, trace_grad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import gpt, gpt_scan  # noqa: E402
from jax_residuals import assert_same_gradients, jax_residuals, residual_values, saved  # noqa: E402

GPT = {"layers": 3, "width": 16, "heads": 2, "seq": 4, "vocab": 16}


def compute_ops(g: Graph) -> list[tuple[str, str | None, int]]:
    return [(v.op, v.phase, v.bytes) for v in g.nodes if not v.is_input]


def no_remat_peak(g: Graph) -> int:
    replay = simulate(g, no_remat_plan(g))
    assert replay.valid, replay.error
    return replay.peak_bytes


@pytest.mark.parametrize("fuse", [False, True])
def test_scanned_decoder_unrolls_to_the_python_loop_graph(fuse):
    loop_fn, loop_args = gpt.factory(**GPT)
    scan_fn, scan_args = gpt_scan.factory(**GPT)
    loop, scanned = trace_grad(loop_fn, *loop_args, fuse=fuse), trace_grad(scan_fn, *scan_args, fuse=fuse)
    assert scanned.n == loop.n and len(scanned.edges) == len(loop.edges)
    assert compute_ops(scanned) == compute_ops(loop)
    assert scanned.meta["residuals"] == loop.meta["residuals"]
    assert no_remat_peak(scanned) == no_remat_peak(loop)
    assert sorted(v.bytes for v in scanned.nodes if v.is_input) == sorted(v.bytes for v in loop.nodes if v.is_input)
    # JAX's own report of the loop model's saved residuals, value by value
    assert residual_values(scanned) == jax_residuals(loop_fn, loop_args)
    # the same parameter values: both compute the same loss
    assert float(scan_fn(*scan_args)) == pytest.approx(float(loop_fn(*loop_args)), rel=1e-6)


def test_no_unroll_keeps_the_scan_one_node():
    fn, args = gpt_scan.factory(**GPT)
    g = trace_grad(fn, *args, unroll=False)
    assert g.meta["unroll"] is False
    assert [v.phase for v in g.nodes if v.op == "scan"] == ["forward", "backward"]
    assert not any("iteration" in v.extra for v in g.nodes)
    assert g.n < trace_grad(fn, *args).n / 2


def test_nodes_record_name_stack_and_iteration_and_keep_them_on_a_round_trip(tmp_path):
    def loss(ws, x):
        def outer(h, w_row):
            with jax.named_scope("block"):
                h, _ = lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, w_row)
            return h, None

        h, _ = lax.scan(outer, x, ws)
        with jax.named_scope("head"):
            return jnp.sum(h ** 2)

    ws = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32) * 0.3
    x = np.ones((2, 4), np.float32)
    g = trace_grad(loss, ws, x)
    tanh = [v for v in g.nodes if v.op == "tanh"]
    assert [v.extra["iteration"] for v in tanh] == [[i, j] for i in range(2) for j in range(3)]
    assert {v.extra["name_stack"] for v in tanh} == {"block"}
    # the backward pass's nodes carry the loop indices of the forward op they differentiate
    bwd = {tuple(v.extra["iteration"]) for v in g.nodes if v.phase == "backward" and "iteration" in v.extra}
    assert bwd == {(i, j) for i in range(2) for j in range(3)}
    assert {v.extra.get("name_stack") for v in g.nodes if v.phase == "backward" and "iteration" in v.extra} == {
        "block"}
    assert any(v.extra.get("name_stack") == "head" and v.phase == "forward" for v in g.nodes)
    assert not any("iteration" in v.extra for v in g.nodes if v.extra.get("name_stack") == "head")
    # the stacked argument the nested scans slice: one input node per (outer, inner) slice
    params = [v for v in g.nodes if v.is_input and v.persistent]
    assert [v.extra["iteration"] for v in params] == [[i, j] for i in range(2) for j in range(3)]
    assert {v.bytes for v in params} == {4 * 4 * 4}
    assert not {"slice", "squeeze", "pad", "stack"} & {v.op for v in g.nodes}  # no copies of the stack
    assert_same_gradients(loss, apply_plan(loss, g, no_remat_plan(g)), (ws, x))
    path = tmp_path / "g.json"
    g.save(path)
    again = load(path)
    assert again.to_dict() == g.to_dict()
    assert [v.extra.get("iteration") for v in again.nodes] == [v.extra.get("iteration") for v in g.nodes]
    assert [v.extra.get("name_stack") for v in again.nodes] == [v.extra.get("name_stack") for v in g.nodes]


def block(x, w):
    return jnp.tanh(jnp.sin(x @ w) * 2.0)


@pytest.mark.parametrize("where", ["body", "around"])
def test_checkpoint_and_scan_unroll_to_the_checkpointed_python_loop(where):
    ws = np.random.default_rng(1).standard_normal((4, 8, 8)).astype(np.float32) * 0.3
    x = np.ones((2, 8), np.float32)
    remat_block = jax.checkpoint(block)

    def scanned(ws, x):
        if where == "body":
            h, _ = lax.scan(lambda h, w: (remat_block(h, w), None), x, ws)
        else:
            h, _ = jax.checkpoint(lambda ws, x: lax.scan(lambda h, w: (block(h, w), None), x, ws))(ws, x)
        return jnp.sum(h ** 2)

    def looped(ws, x):
        if where == "around":
            return jnp.sum(jax.checkpoint(lambda ws, x: layers(ws, x, block))(ws, x) ** 2)
        return jnp.sum(layers(ws, x, remat_block) ** 2)

    def layers(ws, x, f):
        for w in ws:
            x = f(x, w)
        return x

    ws_list = list(ws)
    g_scan, g_loop = trace_grad(scanned, ws, x), trace_grad(looped, ws_list, x)
    assert not any(v.op in ("scan", "checkpoint", "remat") for v in g_scan.nodes)
    assert compute_ops(g_scan) == compute_ops(g_loop) and g_scan.n == g_loop.n
    assert no_remat_peak(g_scan) == no_remat_peak(g_loop)
    assert residual_values(g_scan) == residual_values(g_loop) == jax_residuals(looped, (ws_list, x))
    # the remat is real: the backward pass recomputes the forward sin and tanh
    assert sum(v.op == "sin" for v in g_scan.nodes) == 2 * len(ws)
    assert_same_gradients(scanned, apply_plan(scanned, g_scan, no_remat_plan(g_scan)), (ws, x))


def test_while_with_a_static_trip_count_unrolls_and_a_traced_bound_stays_a_node():
    def counted(x):
        y = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]
        return lax.fori_loop(0, jnp.int32(2), lambda i, c: c * 2.0, y)

    g = trace(counted, jnp.ones(3))
    ops = [(v.op, v.extra.get("iteration")) for v in g.nodes if not v.is_input]
    assert ops == [("sin", [0]), ("sin", [1]), ("sin", [2]), ("mul", [0]), ("mul", [1])]
    np.testing.assert_allclose(counted(jnp.ones(3)), 2.0 * 2.0 * np.sin(np.sin(np.sin(1.0))), rtol=1e-6)
    bounded = trace(lambda x, n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1],
                    jnp.ones(3), 3)
    assert [v.op for v in bounded.nodes if not v.is_input] == ["while"]
    long = trace(lambda x: lax.while_loop(lambda c: c[0] < MAX_TRIP + 1, lambda c: (c[0] + 1, c[1] * 2.0),
                                          (0, x))[1], jnp.ones(3))
    assert [v.op for v in long.nodes if not v.is_input] == ["while"]


def test_a_plan_on_the_unrolled_graph_applies_to_the_scanned_program():
    fn, args = gpt_scan.factory(**GPT)
    g = trace_grad(fn, *args, fuse=True)
    # chen-greedy keeps the same values in every layer (greedy's plan keeps
    # a 512 B add in layer 1 and not in layer 0, so its forward unrolls)
    sol = solve(g, "chen-greedy", budget_ratio=0.7)
    fates = residual_fates(g, sol.plan)
    assert fates.recomputed and fates.kept
    kept = sorted(g.nodes[i].bytes for i in fates.kept)
    unrolled = apply_plan(fn, g, sol.plan, scan=False)
    assert_same_gradients(fn, unrolled, args)
    # JAX's report of what the planned gradient saves is what the plan keeps
    assert saved(unrolled, args) == (kept, []) and unrolled.loops == []
    # rolled where the plan treats iterations alike: the same bytes, some of them stacked
    with pytest.warns(UnrolledLoop):
        planned = apply_plan(fn, g, sol.plan)
        assert_same_gradients(fn, planned, args)
    dev, host = saved(planned, args)
    assert sum(dev) == sum(kept) and len(dev) < len(kept) and not host


def test_the_unrolled_graph_differs_from_jaxs_scan_report_only_by_the_hoisted_mask():
    """JAX's gradient of a scan computes loop-invariant residuals once, outside
    the loop (gpt's causal-mask ``where``: a bool and a float [b, h, t, t]);
    the unrolled program, like the Python loop, saves them in every layer."""
    from collections import Counter

    from jax._src.ad_checkpoint import saved_residuals

    fn, args = gpt_scan.factory(**GPT)
    g = trace_grad(fn, *args)
    split = []
    for aval, src in saved_residuals(lambda p: fn(p, args[1]), args[0]):
        if src.startswith(("from the argument", "from a literal", "from a constant")):
            continue
        size = int(np.prod(aval.shape)) * aval.dtype.itemsize
        stacked = "output of scan" in src
        assert not stacked or aval.shape[0] == GPT["layers"]
        split += [size // GPT["layers"]] * GPT["layers"] if stacked else [size]
    ours = Counter(residual_values(g))
    b, h, t = 2, GPT["heads"], GPT["seq"]
    assert not Counter(split) - ours
    assert ours - Counter(split) == Counter({b * h * t * t: GPT["layers"] - 1, 4 * b * h * t * t: GPT["layers"] - 1})


def test_import_jax_unrolls_unless_told_not_to(tmp_path):
    from conftest import rematopt

    settings = [x for k, v in GPT.items() for x in ("--set", f"{k}={v}")]
    graphs = {}
    for flag in ([], ["--no-unroll"]):
        out = tmp_path / f"g{len(flag)}.json"
        run = rematopt("import", "jax", "models.gpt_scan:factory", *settings, *flag, "-o", out)
        assert run.returncode == 0, run.stderr
        graphs[bool(flag)] = load(out)
    fn, args = gpt.factory(**GPT)
    assert graphs[False].n == trace_grad(fn, *args).n and graphs[False].meta["unroll"] is True
    assert graphs[True].meta["unroll"] is False and sum(v.op == "scan" for v in graphs[True].nodes) == 2


def test_a_scan_inside_a_custom_vjp_keeps_its_rule():
    @jax.custom_vjp
    def clipped(x):
        return lax.scan(lambda h, _: (jnp.sin(h), None), x, None, length=3)[0]

    clipped.defvjp(lambda x: (clipped(x), None), lambda _, ct: (jnp.clip(ct, -0.1, 0.1),))

    def loss(w, x):
        return jnp.sum(clipped(x @ w) * 5.0)

    args = (np.ones((4, 4), np.float32), np.ones((2, 4), np.float32))
    g = trace_grad(loss, *args)
    assert sum(v.op == "scan" for v in g.nodes) == 1  # bound as it is, not inlined
    planned = apply_plan(loss, g, no_remat_plan(g))
    assert_same_gradients(loss, planned, args)
    np.testing.assert_allclose(jax.grad(planned)(*args), np.full((4, 4), 0.2), rtol=1e-6)


def test_stacked_outputs_stay_per_iteration_until_something_reads_them_whole():
    def f(x):
        _, ys = lax.scan(lambda c, _: (jnp.sin(c), jnp.cos(c)), x, None, length=3)
        _, zs = lax.scan(lambda c, y: (c, y * 2.0), 0.0, ys)  # slice by slice: no copy
        return jnp.sum(zs, axis=0)  # whole: stacked once

    x = jnp.linspace(0.0, 1.0, 5)
    g = trace(f, x)
    ops = [v.op for v in g.nodes if not v.is_input]
    assert ops.count("cos") == ops.count("mul") == 3 and ops.count("stack") == 1
    assert not {"slice", "squeeze", "dynamic_slice", "scan"} & set(ops)
    mul = [v for v in g.nodes if v.op == "mul"]
    assert [v.extra["iteration"] for v in mul] == [[0], [1], [2]]
    (stack,) = [v for v in g.nodes if v.op == "stack"]
    assert sorted(g.preds[stack.id]) == [v.id for v in mul] and stack.bytes == 3 * 5 * 4
    carries = [np.linspace(0.0, 1.0, 5, dtype=np.float32)]
    carries += [np.sin(carries[-1]), np.sin(np.sin(carries[-1]))]
    np.testing.assert_allclose(f(x), sum(2.0 * np.cos(c) for c in carries), rtol=1e-6)


def test_a_split_argument_that_is_also_read_whole_is_stacked_for_that_read():
    def loss(ws, x):
        h, _ = lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
        return jnp.sum(h ** 2) + 0.1 * jnp.sum(ws ** 2)

    args = (np.random.default_rng(2).standard_normal((3, 4, 4)).astype(np.float32), np.ones((2, 4), np.float32))
    g = trace_grad(loss, *args)
    (stack,) = [v for v in g.nodes if v.op == "stack"]
    assert [g.nodes[p].extra["iteration"] for p in g.preds[stack.id]] == [[0], [1], [2]]
    assert_same_gradients(loss, apply_plan(loss, g, no_remat_plan(g)), args)


def test_a_scans_constants_and_carry_are_counted_on_the_installed_jax():
    # JAX 0.10 names them in the scan's parameters (num_consts, num_carry), 0.11 in a tree of its
    # operands (ft_in); the importer read 0.10's alone, and every scanned model (flax_linen, flax_nnx,
    # gpt_scan, equinox_lm) failed to trace on 0.11.2 with KeyError: 'num_consts'
    def f(c, k, xs):
        return lax.scan(lambda c, x: ((c[0] + x * k, c[1] * 2.0), (c[0] * x, x)), (c, c), xs)

    v = jnp.ones(3)
    [eqn] = [e for e in jax.make_jaxpr(f)(v, v, jnp.ones((4, 3))).jaxpr.eqns if e.primitive.name == "scan"]
    assert scan_counts(eqn.params) == (1, 2)
    # and it unrolls to the Python loop's graph: four iterations of the body's equations

    def looped(c, k, xs):
        c0, c1, ys = c, c, []
        for x in xs:
            ys.append(c0 * x)
            c0, c1 = c0 + x * k, c1 * 2.0
        return (c0, c1), (jnp.stack(ys), xs)

    def loss(f):
        return lambda c, k, xs: sum(leaf.sum() for leaf in jax.tree_util.tree_leaves(f(c, k, xs)))

    scanned, unrolled = (trace(loss(fn), v, v, jnp.ones((4, 3))) for fn in (f, looped))
    assert sum(v.op == "mul" for v in scanned.nodes) == 12
    assert sorted(v.op for v in scanned.nodes if v.op in ("mul", "add")) == \
        sorted(v.op for v in unrolled.nodes if v.op in ("mul", "add"))
