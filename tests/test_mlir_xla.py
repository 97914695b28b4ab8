"""Exported plans through XLA: the exported module compiles with the
installed jaxlib, keeps its recomputations through XLA's pipeline and spends
the clones' FLOPs on them (CSE off on CPU, where XLA drops optimization
barriers before CSE; the full pipeline on an accelerator)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from rematopt import solve, simulate  # noqa: E402
from rematopt.exporters.mlir import export_mlir  # noqa: E402
from rematopt.exporters.xla_check import FLOPS_TOLERANCE, check_export  # noqa: E402
from rematopt.importers.mlir import import_mlir  # noqa: E402
from mlir_cases import STEPS, lower, model_step  # noqa: E402

CPU = jax.default_backend() == "cpu"


def exported(tmp_path: Path, src: Path, ratio: float, planner: str = "greedy"):
    g = import_mlir(src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = solve(g, planner, budget_ratio=ratio)
    out = tmp_path / f"{src.stem}.{planner}.{ratio}.remat.mlir"
    out.write_text(export_mlir(src, sol.plan))
    return sol, out


@pytest.fixture(scope="module")
def gpt_step(tmp_path_factory):
    loss_fn, args = model_step("gpt", **STEPS["gpt"])
    return lower(tmp_path_factory.mktemp("xla"), jax.value_and_grad(loss_fn), *args, name="gpt")


@pytest.mark.parametrize("ratio", [0.9, 0.7])
def test_gpt_decoder_keeps_its_recomputations_and_flops(gpt_step, tmp_path, ratio):
    sol, out = exported(tmp_path, gpt_step, ratio)
    assert sol.replay.recompute_cost > 0
    check = check_export(gpt_step, out)
    assert check.cse == (not CPU)
    assert check.clones >= 5 and check.clones_kept == check.clones
    assert check.planned_flops > 0
    assert abs(check.compiled_flops - check.planned_flops) <= FLOPS_TOLERANCE * check.planned_flops
    assert check.ok
    # the whole module's rise is the clones' and how XLA fuses around them: jax 0.10.2 +7.3% / +6.7% of the
    # clones' FLOPs, 0.12.1 -16% / -18% (an elementwise chain computed in one fusion where it was in two; docs/mlir.md)
    assert 0.5 * check.planned_flops < check.rise < 1.5 * check.planned_flops


def test_mlp_keeps_its_recomputations(tmp_path):
    """A segment plan (chen-sqrt) of the lowered MLP passes the check. The
    greedy plan recomputes tanh (a transcendental: no FLOPs in XLA's count)
    whose input, a bias add, XLA had fused into the forward tanh and never
    stored: the recomputing fusion redoes the add too, so FLOPs rise by more
    than the clones' own (measured 133,632 against 1,280 on the default
    MLP); its clones all survive."""
    loss_fn, args = model_step("mlp", **STEPS["mlp"])
    src = lower(tmp_path, jax.value_and_grad(loss_fn), *args, name="mlp")
    _, out = exported(tmp_path, src, 0.7, planner="chen-sqrt")
    check = check_export(src, out)
    assert check.clones >= 3 and check.ok, check.summary()
    _, out = exported(tmp_path, src, 0.7)
    check = check_export(src, out)
    assert check.clones >= 1 and check.clones_kept == check.clones
    assert check.rise >= check.planned_flops


@pytest.mark.skipif(not CPU, reason="the CPU pipeline's CSE")
def test_on_cpu_cse_merges_clones_back(gpt_step, tmp_path):
    """Why the check disables CSE on CPU: with it, XLA removes the barriers
    first and merges clones with their originals."""
    _, out = exported(tmp_path, gpt_step, 0.7)
    with_cse = check_export(gpt_step, out, cse=True)
    # the merged clones' FLOPs are gone from the compiled module: jax 0.10.2 keeps 12 of 28 clones, 7,168 of
    # their 545,792 FLOPs (the module rises 22,944); 0.12.1 keeps 19 of 23, 541,696 FLOPs
    assert with_cse.clones_kept < with_cse.clones and with_cse.compiled_flops < with_cse.planned_flops
    if jax.__version_info__ < (0, 11):  # 0.10's XLA merges most of them back
        assert with_cse.rise < with_cse.planned_flops / 2


@pytest.mark.skipif(CPU, reason="no accelerator backend here")
def test_on_an_accelerator_the_full_pipeline_keeps_them(gpt_step, tmp_path):
    _, out = exported(tmp_path, gpt_step, 0.7)
    check = check_export(gpt_step, out, cse=True)
    assert check.clones_kept == check.clones and check.ok


def test_sharded_step_compiles_with_its_recomputations(tmp_path):
    import numpy as np
    from jax._src import config as jax_config
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    spec = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("d",)), PartitionSpec("d"))

    def loss(ws, x):
        h = x
        for w in ws:
            h = jax.lax.with_sharding_constraint(jnp.tanh(h @ w), spec)
        return jnp.sum(h * h)

    ws = [jnp.full((32, 32), 0.01 * (k + 1)) for k in range(3)]
    with jax_config.use_shardy_partitioner(True):
        src = lower(tmp_path, jax.value_and_grad(loss), ws, jnp.ones((16, 32)), name="sharded")
    assert "sdy.sharding_constraint" in src.read_text()
    # chen-sqrt: segments recomputed whole on any JAX (greedy recomputes only broadcasts here on jax 0.10.2, and
    # nothing on 0.12.1, whose step computes tanh's derivative in the forward pass: its peak is the weights'
    # gradients at the end)
    sol, out = exported(tmp_path, src, 0.6, planner="chen-sqrt")
    assert simulate(import_mlir(src), sol.plan).valid
    check = check_export(src, out)
    assert check.clones >= 1 and check.planned_flops > 0 and check.ok, check.summary()


def test_export_cli_checks_xla(gpt_step, tmp_path):
    plan = tmp_path / "plan.json"
    sol, _ = exported(tmp_path, gpt_step, 0.7)
    sol.plan.save(plan)
    run = subprocess.run([sys.executable, "-m", "rematopt", "export", "mlir", gpt_step, plan, "-o",
                          tmp_path / "out.mlir", "--check-xla"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "clones_kept" in run.stdout and "True" in run.stdout
