"""Round trip from JAX: the StableHLO text JAX lowers a small MLP training step
to imports with hand-derived sizes, matches the JAX front end's graph of the
same step up to the documented differences, and takes a plan back."""

from __future__ import annotations

from collections import Counter

import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from rematopt.exporters.mlir import export_mlir  # noqa: E402
from rematopt.importers.mlir import import_mlir  # noqa: E402
from rematopt.reference import no_remat_peak  # noqa: E402
from rematopt.simulate import simulate  # noqa: E402
from mlir_cases import remat_plan, verify  # noqa: E402

# x: 4x16, layers 16 -> 32 -> 8, all f32.
PARAMS = [(jnp.zeros((16, 32)), jnp.zeros((32,))), (jnp.zeros((32, 8)), jnp.zeros((8,)))]
X, Y = jnp.zeros((4, 16)), jnp.zeros((4, 8))


def loss(params, x, y):
    h = x
    for w, b in params:
        h = jnp.tanh(h @ w + b)
    return jnp.mean((h - y) ** 2)


step = jax.value_and_grad(loss)


@pytest.fixture(scope="module")
def step_mlir(tmp_path_factory):
    path = tmp_path_factory.mktemp("jax") / "step.mlir"
    path.write_text(jax.jit(step).lower(PARAMS, X, Y).as_text())
    return path


def bytes_by_op(g) -> Counter:
    """Bytes per op kind. The JAX front end merges views (a reshape, a
    checkpoint_name) into their source's node; lowering keeps them as ops of
    their own, so each view the JAX graph lists counts here under its op, at its
    source's bytes, as the StableHLO op does."""
    out: Counter = Counter()
    for v in g.nodes:
        if not v.is_input:
            out[v.op.rsplit(".", 1)[-1]] += v.bytes
        for view in v.extra.get("views", ()):
            out[view] += v.bytes
    return out


def test_sizes_match_the_model(step_mlir):
    g = import_mlir(step_mlir)
    f32 = 4
    assert [v.bytes for v in g.nodes if v.is_input] == [f32 * n for n in (16 * 32, 32, 32 * 8, 8, 4 * 16, 4 * 8)]
    assert sorted(v.bytes for v in g.nodes if v.output) == sorted(f32 * n for n in (1, 16 * 32, 32, 32 * 8, 8))
    ops = bytes_by_op(g)
    # Forward h1 = x.W1 (4x32), h2 = h1.W2 (4x8); backward dW2 (8x32), dh1 (4x32), dW1 (32x16).
    assert ops["dot_general"] == f32 * (4 * 32 + 4 * 8 + 8 * 32 + 4 * 32 + 32 * 16)
    assert ops["transpose"] == f32 * (8 * 32 + 32 * 16)  # dW2 and dW1 back to the weights' layout
    assert ops["tanh"] == f32 * (4 * 32 + 4 * 8)
    assert all(v.recomputable for v in g.nodes if v.op in ("stablehlo.dot_general", "stablehlo.tanh"))
    reduces = [v for v in g.nodes if v.op == "stablehlo.reduce"]
    assert reduces and all(v.recomputable for v in reduces)  # their regions hold only an add


def test_same_bytes_as_the_jax_front_end_up_to_lowering(step_mlir):
    """Lowering materialises what a jaxpr leaves implicit: literals become
    ``stablehlo.constant`` ops, and scalar / size-1 operands of elementwise ops
    get a ``broadcast_in_dim``. Without those two kinds the bytes agree op by op
    (jaxpr names on the left: ``mul`` and ``integer_pow`` lower to multiply,
    ``add_any`` to add, ``reduce_sum`` to a reduce; JAX 0.11's ``one_minus_square``
    to three ops of its size, ``(1 - x) * (1 + x)``)."""
    try:
        from rematopt.jax import trace_grad
    except ImportError as e:
        pytest.skip(f"the JAX front end is not importable here: {e}")
    j = bytes_by_op(trace_grad(loss, PARAMS, X, Y))
    m = bytes_by_op(import_mlir(step_mlir))
    lowered = {"constant", "broadcast_in_dim"}
    assert sum(v for k, v in m.items() if k not in lowered) == \
        sum(v for k, v in j.items() if k not in lowered) + 2 * j["one_minus_square"]
    assert m["multiply"] == j["mul"] + j["integer_pow"] + j["one_minus_square"]
    assert m["add"] == j["add"] + j["add_any"] + j["one_minus_square"]
    assert m["reduce"] == j["reduce_sum"]
    for op in ("dot_general", "transpose", "tanh", "reshape"):
        assert m[op] == j[op], op
    assert m["broadcast_in_dim"] >= j["broadcast_in_dim"]
    assert m["constant"] > 0 and j["constant"] == 0


# jaxpr primitive -> the StableHLO ops it lowers to (each of its size), where the names differ.
LOWERS_TO = {"mul": ("multiply",), "integer_pow": ("multiply",), "add_any": ("add",), "sub": ("subtract",),
             "div": ("divide",), "neg": ("negate",), "exp": ("exponential",), "max": ("maximum",),
             "reduce_sum": ("reduce",), "reduce_max": ("reduce",), "scatter-add": ("scatter",),
             "one_minus_square": ("multiply", "subtract", "add")}  # JAX 0.11: (1 - x) * (1 + x)


def test_models_mlp_step_against_the_jax_front_end(tmp_path):
    """models/mlp.py's step (softmax cross-entropy: gathers, scatters, reductions).
    Besides constants and broadcasts, lowering adds index arithmetic around the
    label gather (compare / select / and) and drops ``stop_gradient``; every
    op kind the two graphs share by name carries the same bytes."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    mlp = pytest.importorskip("models.mlp")
    from rematopt.jax import trace_grad

    loss_fn, args = mlp.factory(layers=2, width=32, in_dim=16, batch=8)
    path = tmp_path / "mlp.mlir"
    path.write_text(jax.jit(jax.value_and_grad(loss_fn)).lower(*args).as_text())
    m = bytes_by_op(import_mlir(path))
    j: Counter = Counter()
    for op, b in bytes_by_op(trace_grad(loss_fn, *args)).items():
        for lowered in LOWERS_TO.get(op, (op,)):
            j[lowered] += b
    for op in ("dot_general", "transpose", "tanh", "exponential", "log", "gather", "scatter", "reshape",
               "multiply", "subtract", "add", "divide", "negate", "maximum"):
        assert m[op] == j[op] > 0, op


def test_a_plan_goes_back_into_the_stablehlo(step_mlir, tmp_path):
    g = import_mlir(step_mlir)
    # recompute both forward activations (each read by the next layer and by the backward pass)
    tanhs = [v.id for v in g.nodes if v.op == "stablehlo.tanh"]
    assert len(tanhs) == 2 and all(len(g.succs[t]) >= 2 for t in tanhs)
    plan = remat_plan(g, tanhs)
    replay = simulate(g, plan)
    assert replay.valid and replay.recompute_cost > 0
    out = tmp_path / "step.remat.mlir"
    out.write_text(export_mlir(step_mlir, plan))
    figures = verify(out)
    g2 = import_mlir(out)
    barriers = [v for v in g2.nodes if v.op == "stablehlo.optimization_barrier"]
    assert len(barriers) == 2 and all(v.bytes == 0 for v in barriers)  # one per run of clones
    assert g2.n == g.n + 2 + 2 and no_remat_peak(g2) == replay.peak_bytes == figures["tessera.remat_peak_after_bytes"]
    assert figures["tessera.rematerialized"] == 2
