"""Kernel pricing (rematopt.xla.cost): the roofline per kernel, its totals checked against XLA's
own ``cost_analysis()`` of the same compiled step, the H200 fixture's traffic as measured in
../shared/gpu, and calibration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

from rematopt.importers.costmodel import DEVICES, device  # noqa: E402
from rematopt.xla.cost import StepCost, calibrate, kernel_cost, step_cost  # noqa: E402
from rematopt.xla.hlo import read_hlo  # noqa: E402
from rematopt.xla.kernels import Kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
H200 = ROOT.parent / "shared" / "gpu" / "h200_gpt8"


def kernel(kind="fusion:kLoop", read=0, written=0, flops=0, trips=1) -> Kernel:
    return Kernel("k", kind, read, written, flops, (), trips)


def test_a_kernel_is_bound_by_the_slower_of_bytes_and_flops():
    dev = device("h200")
    mem = kernel_cost(kernel(read=4.8e9, written=4.8e9, flops=1e9), dev)
    assert mem.bound == "memory" and mem.seconds == pytest.approx(2e-3)
    gemm = kernel_cost(kernel("custom-call:__cublas$lt$matmul", read=1e6, written=1e6, flops=494e12), dev)
    assert gemm.bound == "compute" and gemm.seconds == pytest.approx(1.0)
    # the same FLOPs outside the matrix units run at the vector rate (67 TFLOPS FP32 on the H200)
    assert kernel_cost(kernel(flops=67e12), dev).seconds == pytest.approx(1.0)
    assert kernel_cost(kernel(read=4.8e9, trips=8), dev).seconds == pytest.approx(8e-3)


def test_every_profile_states_its_source():
    assert {"a100", "h100", "h200", "tpu-v4", "cpu"} <= set(DEVICES)
    assert all(d.source and d.bytes_per_s > 0 and d.flops_per_s > 0 for d in DEVICES.values())


@pytest.mark.parametrize("model,config,flops_tol", [
    ("gpt", {"layers": 2, "width": 64, "heads": 4, "seq": 64, "batch": 2, "vocab": 128}, 0.01),
    # XLA's convolution count is lower (it leaves out the padded window); ours counts the whole window
    ("unet", {}, 0.20),
])
def test_totals_match_xla_cost_analysis(model, config, flops_tol):
    import importlib

    fn, args = importlib.import_module(f"models.{model}").factory(**config)
    compiled = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, (list, tuple)) else xla
    priced = step_cost(compiled.as_text(), device("cpu"))
    assert priced.bytes_moved == pytest.approx(xla["bytes accessed"], rel=0.03)
    assert priced.flops == pytest.approx(xla["flops"], rel=flops_tol)


@pytest.fixture
def h200_dir() -> Path:
    if not H200.is_dir():
        pytest.skip(f"the H200 fixture is not at {H200} (../shared is absent)")
    return H200


def test_h200_traffic_is_the_fixtures_and_the_roofline_is_below_the_measured_step(h200_dir):
    import json

    measured = {r["variant"]: r["step_ms"] / 1e3 for r in json.loads((h200_dir / "measured.json").read_text())["rows"]}
    plain = step_cost(read_hlo(h200_dir / "hlo_plain.txt"), device("h200"))
    planned = step_cost(read_hlo(h200_dir / "hlo_cpsat_at_0.5.txt"), device("h200"))
    # ../shared/gpu/README.md: HBM traffic 101.5 -> 155.6 GB, 513 -> 757 kernels
    assert (len(plain.kernels), len(planned.kernels)) == (513, 757)
    assert plain.bytes_moved / 1e9 == pytest.approx(101.5, abs=0.05)
    assert planned.bytes_moved / 1e9 == pytest.approx(155.6, abs=0.05)
    # a roofline at data-sheet rates is a floor under what the device took
    assert plain.seconds < measured["plain"] and planned.seconds < measured["cpsat@0.5"]
    assert planned.seconds > plain.seconds


def test_calibration_prices_the_measured_step_at_its_time_and_keeps_the_balance():
    dev = device("h200")
    step = StepCost(dev, (kernel_cost(kernel(read=1e9), dev), kernel_cost(kernel("dot", flops=1e12), dev)))
    cal = calibrate(dev, step, 0.01, "a test step")
    again = StepCost(cal, tuple(kernel_cost(k.kernel, cal) for k in step.kernels))
    assert again.seconds == pytest.approx(0.01)
    assert cal.flops_per_s / cal.bytes_per_s == pytest.approx(dev.flops_per_s / dev.bytes_per_s)
    assert "a test step" in cal.source
    with pytest.raises(ValueError):
        calibrate(dev, step, 0.0, "nothing")


def test_a_graph_traced_on_xlas_kernels_costs_what_the_compiled_step_does():
    """fuse="xla": each node costs the kernels writing it, so the nodes add up to the compiled
    step's kernels (within 5%: the tagged compile of the tracer and the user's compile differ by a
    few copies), where pricing each equation alone overstates the step."""
    from models import gpt
    from rematopt.jax import trace_grad

    fn, args = gpt.factory(layers=2, width=32, heads=2, seq=32, batch=2, vocab=64)
    compiled = step_cost(jax.jit(jax.value_and_grad(fn)).lower(*args).compile().as_text(), device("cpu"))
    on_kernels = trace_grad(fn, *args, fuse="xla", device="cpu")
    per_equation = trace_grad(fn, *args, device="cpu")
    assert "kernels" in on_kernels.meta["cost_from"] and "kernels" not in per_equation.meta["cost_from"]
    assert sum(n.cost for n in on_kernels.nodes) == pytest.approx(compiled.seconds, rel=0.05)
    assert sum(n.cost for n in per_equation.nodes) > 1.5 * compiled.seconds
