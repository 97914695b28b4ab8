"""The JAX front end: graphs traced from jaxprs, checked against JAX's own
saved-residual report, the roofline formulas and the format contract."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from rematopt import ImportFailure, no_remat_plan, simulate  # noqa: E402
from rematopt.importers import costmodel  # noqa: E402
from rematopt.importers.jaxpr.primitives import ELEMENTWISE  # noqa: E402
from rematopt.jax import trace, trace_grad  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_residuals import jax_residuals, residual_values  # noqa: E402
from models import gpt, mlp, resnet, unet  # noqa: E402
from rematopt.importers import load as load_graph  # noqa: E402

SMALL = {
    "mlp": (mlp, {"layers": 2, "width": 32, "in_dim": 16, "batch": 8}),
    "gpt": (gpt, {"layers": 1, "width": 32, "heads": 2, "seq": 8, "vocab": 32}),
    "resnet": (resnet, {"stages": 2, "blocks": 1, "channels": 4, "image": 8, "batch": 2}),
    "unet": (unet, {"depth": 2, "channels": 4, "image": 8}),
}


@pytest.mark.parametrize("model,fuse", [(m, False) for m in sorted(SMALL)] + [("gpt", True), ("mlp", True)])
def test_residuals_match_jax_saved_residuals(model, fuse):
    module, config = SMALL[model]
    fn, args = module.factory(**config)
    g = trace_grad(fn, *args, fuse=fuse)
    expected = jax_residuals(fn, args)
    assert expected, "the model saves activations"
    assert residual_values(g) == expected
    assert (g.meta["residuals"]["count"], g.meta["residuals"]["bytes"]) == (len(expected), sum(expected))


@pytest.mark.parametrize("model", sorted(SMALL))
def test_step_graph_is_a_valid_phased_training_step(model, tmp_path):
    module, config = SMALL[model]
    fn, args = module.factory(**config)
    g = trace_grad(fn, *args)
    params = jax.tree_util.tree_leaves(args[0])
    inputs = [v for v in g.nodes if v.is_input]
    assert len(inputs) == len(jax.tree_util.tree_leaves(args))
    assert [v.persistent for v in inputs] == [True] * len(params) + [False] * (len(inputs) - len(params))
    phases = [g.nodes[i].phase for i in g.order if not g.nodes[i].is_input]
    first_bwd = phases.index("backward")
    assert set(phases[:first_bwd]) == {"forward"} and set(phases[first_bwd:]) == {"backward"}
    assert not any(g.nodes[u].phase == "backward" and g.nodes[v].phase == "forward" for u, v in g.edges)
    # loss + one gradient per parameter leaf (a gradient may be shared only if the graph says so)
    assert sum(v.output and v.phase == "forward" for v in g.nodes) == 1
    assert sum(v.output and v.phase == "backward" for v in g.nodes) == len(params)
    assert simulate(g, no_remat_plan(g)).valid
    path = tmp_path / "g.json"
    g.save(path)
    again = load_graph(path)
    assert again.to_dict() == g.to_dict()


def test_nested_calls_are_inlined_and_bytes_come_from_avals():
    @jax.custom_jvp
    def softplus(x):
        return jnp.log1p(jnp.exp(x))

    softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))

    @jax.custom_vjp
    def scale(x):
        return 3.0 * x

    scale.defvjp(lambda x: (3.0 * x, None), lambda _, ct: (3.0 * ct,))

    @jax.jit
    def inner(w, x):
        return jax.checkpoint(lambda h: jnp.sin(h) * 2.0)(x @ w)

    def loss(w, x):
        return jnp.sum(scale(softplus(inner(w, x))))

    w, x = jnp.ones((8, 16)), jnp.ones((4, 8))
    for g in (trace_grad(loss, w, x), trace(loss, w, x)):
        ops = {v.op for v in g.nodes}
        assert not ops & {"jit", "pjit", "custom_jvp_call", "custom_vjp_call", "checkpoint", "remat2"}
        dot = next(v for v in g.nodes if v.op == "dot_general")
        assert dot.bytes == 4 * 16 * 4 and dot.extra["aval"] == "f32[4,16]"
        mul = next(v for v in g.nodes if v.op == "mul" and v.phase != "backward")
        assert len(g.preds[mul.id]) == 1  # the literal 2.0 is not a node


def test_control_flow_without_unrolling_is_one_opaque_node_costed_from_its_body():
    def body(c, _):
        return jnp.tanh(c @ c), None

    def scanned(x, n):
        return jax.lax.scan(body, x, None, length=n)[0]

    x = jnp.ones((32, 32))
    g4, g8 = (trace(lambda x: scanned(x, n), x, unroll=False) for n in (4, 8))
    (s4,), (s8,) = ([v for v in g.nodes if v.op == "scan"] for g in (g4, g8))
    one_step = trace(lambda c: body(c, None)[0], x)
    assert s4.cost == pytest.approx(4 * sum(one_step.cost))
    assert s8.cost == pytest.approx(2 * s4.cost)
    assert s4.bytes == 32 * 32 * 4 and s4.extra["body_bytes"] == 2 * 32 * 32 * 4

    def branches(x):
        return jax.lax.cond(x[0, 0] > 0, lambda x: x @ x @ x, lambda x: x + 1.0, x)

    gc = trace(branches, x)
    (c,) = [v for v in gc.nodes if v.op == "cond"]
    assert c.cost == pytest.approx(max(sum(trace(lambda x: x @ x @ x, x).cost), sum(trace(lambda x: x + 1.0, x).cost)))
    gw = trace(lambda x: jax.lax.while_loop(lambda c: c[0, 0] < 10.0, lambda c: c * 2.0, x), x, unroll=False)
    assert [v.op for v in gw.nodes if not v.is_input] == ["while"]


def test_roofline_costs_follow_the_device_profile():
    a, b = jnp.ones((256, 512)), jnp.ones((512, 1024))
    for name in ("a100", "cpu"):
        dev = costmodel.device(name)
        g = trace(lambda a, b: a @ b, a, b, device=name)
        (dot,) = [v for v in g.nodes if v.op == "dot_general"]
        flops, moved = 2 * 256 * 1024 * 512, 4 * (256 * 512 + 512 * 1024 + 256 * 1024)
        assert dot.cost == pytest.approx(max(flops / dev.flops_per_s, moved / dev.bytes_per_s))
        assert g.meta["device"] == name and g.meta["device_source"] == dev.source
    # a transcendental costs TRANSCENDENTAL_FLOPS per element, an add one
    big = jnp.ones((1 << 20,))
    cpu = costmodel.device("cpu")
    tanh, add = (trace(f, big, device="cpu").nodes[1] for f in (jnp.tanh, lambda x: x + x))
    assert tanh.cost == pytest.approx(max(10 * big.size / cpu.flops_per_s, 8 * big.size / cpu.bytes_per_s))
    assert add.cost == pytest.approx(max(big.size / cpu.flops_per_s, 12 * big.size / cpu.bytes_per_s))  # x read twice
    conv = trace(resnet.conv, jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 16)), device="h100").nodes[2]
    h100 = costmodel.device("h100")
    assert conv.cost == pytest.approx(max(2 * (2 * 8 * 8 * 16) * 27 / h100.flops_per_s,
                                          4 * (2 * 8 * 8 * 3 + 27 * 16 + 2 * 8 * 8 * 16) / h100.bytes_per_s))


def test_effectful_equations_are_not_recomputable():
    def noisy(x):
        y = jnp.sin(x)
        jax.debug.print("y={y}", y=y)
        return jnp.sum(y * y)

    g = trace_grad(noisy, jnp.ones(4))
    flags = {v.op: v.recomputable for v in g.nodes if not v.is_input}
    assert flags["debug_print" if "debug_print" in flags else "debug_callback"] is False
    assert flags["sin"] is True


def test_multi_output_equation_is_one_node_with_summed_bytes():
    g = trace(lambda x: jnp.split(x, [1, 3]), jnp.ones((6, 5)))
    (split,) = [v for v in g.nodes if v.op == "split"]
    assert split.bytes == 6 * 5 * 4 and split.extra["out_bytes"] == [20, 40, 60] and split.output


def test_fuse_shrinks_the_graph_and_keeps_cost_accounting():
    fn, args = gpt.factory(**SMALL["gpt"][1])
    plain, fused = trace_grad(fn, *args), trace_grad(fn, *args, fuse=True)
    assert fused.n < 0.7 * plain.n
    assert fused.meta["nodes"] == fused.n and fused.meta["nodes_unfused"] == plain.n
    groups = sum(v.extra.get("fused", 1) for v in fused.nodes if not v.is_input)
    assert groups == plain.meta["equations"] - plain.meta["views"]  # views are in no node
    # a fusion reads its operands once, so it never costs more than its parts
    assert sum(fused.cost) <= sum(plain.cost) * (1 + 1e-9)
    assert simulate(fused, no_remat_plan(fused)).valid


def test_bad_input_raises_one_line_import_failures():
    with pytest.raises(ImportFailure, match="float scalar"):
        trace_grad(lambda x: x * 2.0, jnp.ones(3))
    with pytest.raises(ImportFailure, match="tracing the loss function failed"):
        trace_grad(lambda x: jnp.sum(x @ jnp.ones((4, 2))), jnp.ones(3))
    with pytest.raises(ImportFailure, match="unknown device"):
        trace_grad(lambda x: jnp.sum(x), jnp.ones(3), device="abacus")
    with pytest.raises(ImportFailure, match="argnums"):
        trace_grad(lambda x: jnp.sum(x), jnp.ones(3), argnums=2)
    with pytest.raises(ImportFailure, match="not an array"):
        trace_grad(lambda x, s: jnp.sum(x), jnp.ones(3), "text")


INSTANCES = Path(__file__).resolve().parents[1] / "instances"


@pytest.mark.parametrize("path", sorted(INSTANCES.glob("*.json")), ids=lambda p: p.name)
def test_committed_instances_carry_provenance_and_validate(path):
    g = load_graph(path)
    for key in ("model", "config", "args", "jax_version", "device", "device_source", "nodes_unfused"):
        assert key in g.meta, key
    assert g.has_phases and simulate(g, no_remat_plan(g)).valid
    assert path.stat().st_size < 2_000_000


def test_a_committed_decoder_has_2000_nodes_unfused_and_matches_a_fresh_trace():
    big = [load_graph(p) for p in INSTANCES.glob("gpt_*.json")]
    assert any(not g.meta["fuse"] and g.n >= 2000 for g in big)
    small = load_graph(INSTANCES / "gpt_l2_w64.json")
    module, _, attr = small.meta["model"].partition(":")
    assert module == "models.gpt"
    fn, args = gpt.factory(**small.meta["config"])
    fresh = trace_grad(fn, *args, device=small.meta["device"])
    if fresh.meta["jax_version"] == small.meta["jax_version"]:
        assert [v.op for v in fresh.nodes] == [v.op for v in small.nodes] and fresh.edges == small.edges
        assert fresh.meta["residuals"] == small.meta["residuals"]
    else:  # another JAX writes the elementwise work its own way (0.11: tanh's derivative in the forward pass)
        products = [[(v.phase, v.bytes) for v in g.nodes if v.op == "dot_general"] for g in (fresh, small)]
        assert products[0] == products[1]
        ops = [Counter(v.op for v in g.nodes) for g in (fresh, small)]
        assert {op for op in ops[0] | ops[1] if ops[0][op] != ops[1][op]} <= ELEMENTWISE
