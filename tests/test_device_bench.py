"""``rematopt bench device``'s tables: the verdict's choice of baseline on hand-made rows, the noise
figure, the slop factor aimed at a ratio, the interleaved timing of a tiny MLP's variants, and
(``pytest -m slow``) one real run of the bench on a tiny MLP (its rows in two processes), whose
report has the shape the issue asks for, and quick gpt's page faults as timed. Timings are never
asserted."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import last_json

pytest.importorskip("jax")

from rematopt.importers.costmodel import device, profile_for  # noqa: E402
from rematopt.plan import Plan  # noqa: E402
from rematopt.studies.device.bench import _calibrate, _slop, run_bench  # noqa: E402
from rematopt.studies.device.launch import busy_cpu, run_worker, worker_env  # noqa: E402
from rematopt.studies.device.report import _by_class, markdown, noise, pareto, verdict, write_report  # noqa: E402
from rematopt.studies.device.results import Bench, Row  # noqa: E402
from rematopt.studies.device.settings import AGAIN, KEPT, MAX_ROUNDS, MODELS, NO_REMAT  # noqa: E402
from rematopt.studies.device.worker import run_rounds, settled, time_steps  # noqa: E402
from rematopt.xla.cost import Calibration, StepCost, kernel_cost, signature  # noqa: E402
from rematopt.xla.kernels import Kernel  # noqa: E402
from rematopt.xla.machine import Machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_verdict_takes_the_fastest_baseline_that_fits_and_says_where_the_plan_misses():
    b = Bench("cpu", "cpu", ratios=(0.8, 0.5), rows=[
        Row("m", "plain", "plain", compiled_peak=100, step_ms=10.0, step_ms_spread=0.01),
        Row("m", "layer:a", "layer", compiled_peak=70, step_ms=14.0),
        Row("m", "layer:b", "layer", compiled_peak=50, step_ms=20.0),
        Row("m", "step:c", "step", compiled_peak=60, step_ms=12.0),
        # rematopt's own program with nothing recomputed: fits and is fastest, but it is no baseline
        Row("m", NO_REMAT, "applied", compiled_peak=58, step_ms=9.0),
        Row("m", "rematopt@0.8", "rematopt", 0.8, compiled_peak=79, step_ms=11.0),
        Row("m", "rematopt@0.5", "rematopt", 0.5, compiled_peak=55, step_ms=15.0),
    ])
    by_ratio = {v["ratio"]: v for v in verdict(b)}
    assert by_ratio[0.8]["baseline"].variant == "step:c" and by_ratio[0.8]["plan_fits"]
    assert by_ratio[0.8]["time_ratio"] == pytest.approx(11 / 12)
    assert by_ratio[0.8]["verdict"] == "at or below the baseline"
    assert by_ratio[0.5]["baseline"].variant == "layer:b"
    assert not by_ratio[0.5]["plan_fits"] and by_ratio[0.5]["verdict"] == "does not fit as compiled"



MB = 1_000_000


def _bench_for_causes() -> Bench:
    """One model, four budgets: a plan that misses where a baseline fits, one that fits and is priced
    slower, one priced faster but measured slower (its page faults the difference), one that wins."""
    m = Machine(flops_per_s=1e11, dot_flops_per_s=2.5e10, vector_flops_per_s=3e10, bytes_per_s=5e10,
                launch_s=1e-6, fault_s=2e-6, transcendental_s=1e-9)
    return Bench("cpu", "cpu", ratios=(0.9, 0.8, 0.7, 0.6, 0.5), machine=m, rows=[
        Row("m", "plain", "plain", compiled_peak=100 * MB, step_ms=10.0, predicted_ms=10.0, page_faults=0),
        Row("m", "layer:a", "layer", compiled_peak=72 * MB, step_ms=8.0, predicted_ms=9.0, page_faults=0),
        Row("m", "layer:b", "layer", compiled_peak=45 * MB, step_ms=12.0, predicted_ms=12.5, page_faults=0),
        Row("m", "rematopt@0.9", "rematopt", 0.9, compiled_peak=85 * MB, step_ms=7.5, predicted_ms=8.0, page_faults=0),
        Row("m", "rematopt@0.8", "rematopt", 0.8, compiled_peak=75 * MB, step_ms=9.5, predicted_ms=9.6, page_faults=0,
            predicted_overhead=0.04),
        Row("m", "rematopt@0.7", "rematopt", 0.7, compiled_peak=66 * MB, step_ms=13.0, predicted_ms=8.5,
            page_faults=200),
        Row("m", "rematopt@0.6", "rematopt", 0.6, note="no plan: --verify xla: no plan compiled smaller than the "
            "plain step after 8 rounds"),
        Row("m", "rematopt@0.5", "rematopt", 0.5, compiled_peak=55 * MB, step_ms=11.0, predicted_peak=48 * MB, rounds=8,
            stopped_by="max_rounds"),
    ])


def test_the_report_says_why_a_plan_misses_or_is_slower_and_nothing_where_it_wins():
    b = _bench_for_causes()
    by_ratio = {v["ratio"]: v for v in verdict(b)}
    assert by_ratio[0.9]["verdict"] == "at or below the baseline" and by_ratio[0.9]["why"] == ""
    over = by_ratio[0.5]
    assert over["verdict"] == "does not fit as compiled"
    assert "the loop stopped on its rounds (8 rounds" in over["why"]
    assert "its least compiled plan 10.0% over the budget" in over["why"]  # 55 against 50
    assert ("the applied step on the graph predicted 48.00 MB for it (+14.6% compiled), within the budget: "
            "the prediction missed") in over["why"]
    assert "layer:b fits at 45.00 MB" in over["why"]
    priced = by_ratio[0.8]  # layer:a fits (72 of 80), predicted -10% where the plan is -4%
    assert priced["verdict"] == "slower than the baseline"
    assert ("own price of the compiled plan, -4.0% against the plain step, against the baseline's -10.0%"
            in priced["why"])
    assert "the planner's space or search" in priced["why"] and "+4.0% on the graph" in priced["why"]
    assert "the baseline runs -20.0% against the plain step itself" in priced["why"]
    assert "page faults" not in priced["why"]
    off = by_ratio[0.7]  # layer:b alone fits (45 of 70): the plan predicted -15% against its +25%, measured +30%
    assert "predicted faster than the baseline (-15.0% against +25.0% over the plain step) but measured slower " \
           "(+30.0% against +20.0%): the plan's prediction was off by -45.0 points" in off["why"]
    assert "page faults" not in off["why"]  # 0.4 ms of faults against 1 ms slower: not the difference
    assert by_ratio[0.6]["verdict"] == "no plan" and "no plan compiled smaller" in by_ratio[0.6]["why"]
    md = markdown(b)
    assert "- m 0.5 (does not fit as compiled): the loop stopped" in md and "- m 0.9" not in md


def test_the_cause_names_page_faults_where_they_make_up_the_difference():
    b = _bench_for_causes()
    plan = next(r for r in b.rows if r.variant == "rematopt@0.7")
    plan.step_ms, plan.page_faults = 12.5, 1_000  # 0.5 ms slower than layer:b, 2 ms of faults
    why = {v["ratio"]: v for v in verdict(b)}[0.7]["why"]
    assert "measured slower (+25.0% against +20.0%)" in why
    assert "page faults: the plan's step faults 1,000 times against the baseline's 0 (+2.00 ms of the +0.50 ms)" in why
    plan.step_ms = 12.1  # within the noise (the plain rows differ by 0, the baseline 12.0): a success, no cause
    b.rows[0].step_ms_spread = 0.01
    v = {v["ratio"]: v for v in verdict(b)}[0.7]
    assert v["verdict"] == "slower, within the noise" and v["why"] == ""


def test_the_report_marks_a_timing_that_shared_the_machine():
    b = _bench_for_causes()
    assert "Beside the timing" not in markdown(b)  # not measured (not Linux): nothing said
    cores = os.cpu_count()
    b.beside["m"] = (0.01 * cores * 100.0, 100.0)  # other processes ran 1% of the machine for 100 s
    line = next(ln for ln in markdown(b).splitlines() if ln.startswith("Beside the timing: "))
    assert f"m {cores:.1f} s in 100 s (1.0% of the {cores} cores)" in line and "shared" not in line
    b.beside["m"] = (0.3 * cores * 100.0, 100.0)
    line = next(ln for ln in markdown(b).splitlines() if ln.startswith("Beside the timing: "))
    assert "(30.0% of the" in line and "shared, its step times are not an idle machine's" in line


def test_noise_is_the_widest_gap_between_two_measurements_of_one_step():
    b = Bench("cpu", "cpu", rows=[
        Row("m", "plain", "plain", step_ms=10.0, step_ms_spread=0.01),
        Row("m", AGAIN, "plain", step_ms=10.5, step_ms_spread=0.02),
        Row("m", "layer:a", "layer", step_ms=14.0, step_ms_spread=0.03),
    ])
    assert noise(b, "m") == pytest.approx(0.05)  # plain against its second compile: 0.5 / 10
    b.rows[2].step_ms_spread = 0.08  # the even rounds' fastest step against the odd rounds', over a variant
    assert noise(b, "m") == pytest.approx(0.08)
    assert noise(b, "other") is None


def test_time_steps_interleaves_rounds_of_every_variant_and_keeps_going_past_a_failure():
    """The variants' processes start on the cores given, and all their threads move to the one core pinned
    before the rounds."""
    cores = sorted(os.sched_getaffinity(0))
    spec = {"model": MODELS["mlp"].spec, "config": MODELS["mlp"].quick, "rounds": 3, "clock": "cpu", "variants": {
        "plain": {}, AGAIN: {}, "layer:nothing_saveable": {"remat": "nothing_saveable", "scope": "layer"},
        "broken": {"remat": "no_such_policy", "scope": "layer"}}, "profile": ["plain", "broken"],
        "pin": cores[-1], "start_on": cores[:2]}
    got = time_steps(spec)
    assert got["cores"] == {label: [cores[-1]] for label in ("plain", AGAIN, "layer:nothing_saveable")}
    assert set(got["times"]) == {"plain", AGAIN, "layer:nothing_saveable"} and set(got["errors"]) == {"broken"}
    # the tiny MLP's steps take microseconds: as many rounds as short steps get, every variant in each
    assert got["rounds"] == MAX_ROUNDS
    assert all(len(t) == MAX_ROUNDS and min(t) > 0 for t in got["times"].values())
    assert all(len(f) == MAX_ROUNDS and min(f) >= 0 for f in got["faults"].values())
    assert got["peaks"]["plain"] == got["peaks"][AGAIN]  # a second compile of one program: the same memory
    assert set(got["profiles"]) == {"plain"} and min(got["profiles"]["plain"].values()) > 0  # its kernels, timed


def test_rounds_go_on_until_the_steps_settle_and_no_further_than_asked():
    def stepper(odd_until: int):  # "a" 10% slower in its odd rounds before round odd_until; "b" steady
        done = {"a": 0, "b": 0}

        def step(label: str) -> dict:
            n, done[label] = done[label], done[label] + 1
            slow = label == "a" and n % 2 and n < odd_until
            return {"ms": 110.0 if slow else 100.0 if label == "a" else 50.0, "faults": n}
        return step

    for odd_until, most, ran in ((12, 18, 14), (12, 12, 12), (12, 9, 9), (0, 18, 9), (40, 18, 18)):
        times, faults = {"a": [], "b": []}, {"a": [], "b": []}
        assert run_rounds(["a", "b"], stepper(odd_until), 9, most, times, faults) == ran
        assert [len(t) for t in times.values()] == [ran, ran] and faults["b"] == list(range(ran))
        assert settled(times) == (odd_until <= ran - 1 or odd_until == 0)
    assert settled({"a": [100.0, 101.9]}) and not settled({"a": [100.0, 102.1]}) and settled({"a": [5.0]})


def test_the_profile_is_scaled_on_the_plain_step_and_every_other_row_is_predicted():
    """Calibrated on the plain step alone: the plain step is priced at its time, and a plan's
    prediction does not move when its measured time or its profile does (it is never fitted on): with
    one scale, one scale per kernel class (fitted on the plain step's profile), and the prediction, the
    plain step's kernels at their profiled times; one scale where the plain step was not profiled."""
    m = Machine(flops_per_s=1e11, dot_flops_per_s=2.5e10, vector_flops_per_s=3e10, bytes_per_s=5e10,
                launch_s=1e-6, fault_s=2e-6, transcendental_s=1e-9)

    def step(*kernels):
        return StepCost(device("cpu"), tuple(kernel_cost(Kernel(f"k{i}", kind, read, 0, flops, ()), device("cpu"))
                                             for i, (kind, read, flops) in enumerate(kernels)))

    plain = step(("dot", 0, int(1e9)), ("fusion:kLoop", int(1e8), 0))
    plan = step(("fusion:kCustom", 0, int(1e9)), ("fusion:kLoop", int(2e8), 0), ("fusion:kLoop", int(1e6), 0))
    predictions, per_class = [], []
    for plan_ms, plan_profile in ((50.0, {"k0": 0.03}), (80.0, {"k0": 0.06, "k1": 0.02})):
        b = Bench("cpu", "cpu", machine=m, rows=[
            Row("m", "plain", "plain", step_ms=100.0, predicted_faults=10_000),
            Row("m", AGAIN, "plain", step_ms=100.0, predicted_faults=10_000),
            Row("m", "rematopt@0.8", "rematopt", 0.8, step_ms=plan_ms, predicted_faults=0)])
        b.costs = {("m", "plain"): plain, ("m", AGAIN): plain, ("m", "rematopt@0.8"): plan}
        # the plain step's profile: the Eigen dot 20 ms, the loop fusion 60 ms
        b.profiles = {("m", "plain"): {"k0": 0.02, "k1": 0.06}, ("m", "rematopt@0.8"): plan_profile}
        _calibrate(b, "m")
        c = b.scale_calibrations["m"]
        assert c.device.transcendental_s == m.transcendental_s  # these kernels evaluate none: the scale below holds
        # plain: 40 ms of Eigen dot + 2 ms of bytes + 2 launches on the machine, 20 ms of page faults
        assert c.scale == pytest.approx(80e-3 / (40e-3 + 2e-3 + 2e-6))
        assert b.rows[0].predicted_scale_ms == pytest.approx(100.0)
        assert b.rows[1].predicted_scale_ms == pytest.approx(100.0)
        predictions.append(b.rows[2].predicted_scale_ms)
        per = dict(b.class_calibrations["m"].class_scales)
        # 80 ms of kernels shared 1:3 as profiled: the dot 20 ms over its 40 ms + 1 us priced, the loop
        # 60 ms over 2 ms + 1 us
        assert per == pytest.approx({"lone dot": 20e-3 / (40e-3 + 1e-6), "loop fusion": 60e-3 / (2e-3 + 1e-6)})
        assert b.rows[0].predicted_class_ms == pytest.approx(100.0)
        per_class.append(b.rows[2].predicted_class_ms)
        # the prediction: the second compile is the plain step's kernels at their profiled times; none of
        # the plan's kernels is alike to one of the plain step's, so it is priced at the one scale
        assert b.calibrations["m"].measured_kernels and b.rows[0].predicted_ms == pytest.approx(100.0)
        assert b.rows[1].predicted_ms == pytest.approx(100.0)
        assert b.rows[2].predicted_ms == pytest.approx(predictions[-1])
        table = _by_class(b)  # where the time went: each class of plain and of the plan, predicted and profiled
        assert "| m | loop fusion |" in table and "| m | matrix fusion | x" in table and "(global)" in table
    assert predictions[0] == predictions[1] == pytest.approx(1e3 * c.scale * (10e-3 + 4e-3 + 2e-5 + 3e-6))
    # the plan's GEMM fusion: a class the plain step lacks, at the global scale
    assert per_class[0] == per_class[1] == pytest.approx(1e3 * (c.scale * (10e-3 + 1e-6) + per["loop fusion"]
                                                                 * (4e-3 + 2e-5 + 2e-6)))
    del b.profiles["m", "plain"]  # not profiled: the one scale predicts
    _calibrate(b, "m")
    assert b.calibrations["m"] is b.scale_calibrations["m"] and b.class_calibrations["m"] == "the plain step was not profiled"
    assert b.rows[2].predicted_ms == b.rows[2].predicted_scale_ms == pytest.approx(predictions[0])


def test_page_faults_are_priced_as_the_plain_step_paid_them_with_its_pages_kept():
    """Where the plain step was timed with its pages kept, its faults cost what it took beyond that step,
    and its kernels' profiled times lose their faults at that price's share the micro-benchmark gave the
    fault itself; where that step still faulted, or was not timed, the micro-benchmark's price. The plain
    step's time is the median of its two compiles'."""
    m = Machine(flops_per_s=1e11, dot_flops_per_s=2.5e10, vector_flops_per_s=3e10, bytes_per_s=5e10,
                launch_s=1e-6, fault_s=2e-6, fault_in_s=1.5e-6, transcendental_s=1e-9)
    plain = StepCost(device("cpu"), tuple(kernel_cost(Kernel(f"k{i}", kind, read, 0, flops, ()), device("cpu"))
                                          for i, (kind, read, flops) in enumerate(
                                              (("dot", 0, int(1e9)), ("fusion:kLoop", int(1e8), 0)))))
    b = Bench("cpu", "cpu", machine=m, rows=[
        Row("m", "plain", "plain", step_ms=100.0, predicted_faults=10_000, compiled_peak=int(1e8)),
        Row("m", AGAIN, "plain", step_ms=110.0, predicted_faults=10_000, compiled_peak=int(1e8))])
    b.costs = {("m", "plain"): plain, ("m", AGAIN): plain}
    b.profiles = {("m", "plain"): {"k0": 0.02, "k1": 0.06}}
    b.kernel_faults = {("m", "plain"): {"k1": 10_000}}
    b.kept = {"m": (90.0, 3)}  # 105 - 90 ms for 10,000 faults: 1.5 us each, 1.125 of them in the writing kernel
    _calibrate(b, "m")
    c = b.calibrations["m"]
    assert c.fault_s == pytest.approx(1.5e-6) and b.scale_calibrations["m"].fault_s == pytest.approx(1.5e-6)
    assert dict(c.measured_kernels)[signature(plain.kernels[1].kernel)] == pytest.approx(0.06 - 10_000 * 1.125e-6)
    assert b.rows[0].predicted_ms == b.rows[1].predicted_ms == pytest.approx(105.0)
    assert 1e3 * c.seconds(plain, 0, int(1e8)) == pytest.approx(90.0)  # the step without its faults
    assert "1.5 us each: pages kept 90 ms, 3 faults" in markdown(b)
    for kept in ({"m": (90.0, 500)}, {}):  # it still faulted, or it was not timed
        b.kept = kept
        _calibrate(b, "m")
        assert b.calibrations["m"].fault_s == 2e-6
        assert dict(b.calibrations["m"].measured_kernels)[signature(plain.kernels[1].kernel)] == pytest.approx(
            0.06 - 10_000 * 1.5e-6)


def test_the_plans_are_predicted_from_apply_plans_program_that_recomputes_nothing():
    """rematopt's rows are priced on NO_REMAT's program first (its kernels at their profiled times, scaled to
    its measured step), then on the plain step's, any other kernel at NO_REMAT's one scale; the baselines on
    the plain step's alone. Without NO_REMAT's profile, the plain step's calibration predicts the plans, and
    the bench says why."""
    m = Machine(flops_per_s=1e11, dot_flops_per_s=2.5e10, vector_flops_per_s=3e10, bytes_per_s=5e10,
                launch_s=1e-6, fault_s=2e-6, transcendental_s=1e-9)

    def step(*kernels):
        return StepCost(device("cpu"), tuple(kernel_cost(Kernel(f"k{i}", kind, read, 0, flops, ()), device("cpu"))
                                             for i, (kind, read, flops) in enumerate(kernels)))

    dot, loop, own, new = ("dot", 0, int(1e9)), ("fusion:kLoop", int(1e8), 0), ("fusion:kLoop", int(3e8), 0), \
        ("fusion:kLoop", int(1e6), 0)
    b = Bench("cpu", "cpu", machine=m, rows=[
        Row("m", "plain", "plain", step_ms=100.0),
        Row("m", "layer:a", "layer", step_ms=90.0),
        Row("m", NO_REMAT, "applied", step_ms=50.0),
        Row("m", "rematopt@0.8", "rematopt", 0.8, step_ms=60.0)])
    b.costs = {("m", "plain"): step(dot, loop), ("m", "layer:a"): step(dot, own), ("m", NO_REMAT): step(dot, own),
               ("m", "rematopt@0.8"): step(dot, own, loop, new)}
    b.profiles = {("m", "plain"): {"k0": 0.02, "k1": 0.06}, ("m", NO_REMAT): {"k0": 0.01, "k1": 0.03}}
    _calibrate(b, "m")
    plain, first = b.calibrations["m"], b.plan_calibrations["m"]
    assert isinstance(first, Calibration) and first.calibrated_on == NO_REMAT
    # each step priced at its measured time by its own table
    assert b.rows[0].predicted_ms == pytest.approx(100.0) and b.rows[2].predicted_ms == pytest.approx(50.0)
    # the baseline's kernel `own` is not the plain step's: the plain step's one scale prices it
    assert b.rows[1].predicted_ms == pytest.approx(1e3 * plain.seconds(b.costs["m", "layer:a"]))
    # the plan: the dot and `own` at NO_REMAT's times (50 ms, its whole step), the plain step's loop fusion at
    # its time there (60 of the 80 ms profiled, scaled to the step's 100: 75), the new kernel at NO_REMAT's
    # one scale
    table = dict(plain.measured_kernels)
    loop_s = next(t for sig, t in table.items() if sig.bytes_read == int(1e8))
    new_s = first.scale * kernel_cost(Kernel("x", "fusion:kLoop", int(1e6), 0, 0, ()), first.device, m.launch_s).seconds
    assert loop_s == pytest.approx(0.075)
    assert b.rows[3].predicted_ms == pytest.approx(50.0 + 1e3 * (loop_s + new_s))
    # with their compiled peaks: what each measured step holds beyond its profiled kernels (plain 20 of its
    # 100 ms, NO_REMAT 10 of 50) is priced per byte of a row's peak, and the tables are not scaled
    for r, peak in zip(b.rows, (100e6, 80e6, 50e6, 25e6)):
        r.compiled_peak = int(peak)
    _calibrate(b, "m")
    plain, first = b.calibrations["m"], b.plan_calibrations["m"]
    assert plain.footprint_s == pytest.approx(20e-3 / 100e6) and first.footprint_s == pytest.approx(10e-3 / 50e6)
    assert b.rows[0].predicted_ms == pytest.approx(100.0) and b.rows[2].predicted_ms == pytest.approx(50.0)
    assert b.rows[1].predicted_ms == pytest.approx(20.0 + 1e3 * plain.scale * kernel_cost(
        Kernel("x", "fusion:kLoop", int(3e8), 0, 0, ()), plain.device, m.launch_s).seconds + 80e6 * 2e-7)
    new_s = first.scale * kernel_cost(Kernel("x", "fusion:kLoop", int(1e6), 0, 0, ()), first.device, m.launch_s).seconds
    assert b.rows[3].predicted_ms == pytest.approx(40.0 + 60.0 + 1e3 * new_s + 25e6 * 2e-7)
    md = markdown(b)
    assert "| 20 ms (20%), 200 ns a KB of peak |" in md
    # NO_REMAT as the plain step's calibration prices it: its kernels and its 50 MB at the plain step's price
    priced = 1e3 * plain.seconds(b.costs["m", NO_REMAT], 0, int(50e6))
    assert f"| -50.0% ({priced - 100:+.1f}%) |" in md
    del b.profiles["m", NO_REMAT]
    _calibrate(b, "m")
    assert b.plan_calibrations["m"] == f"{NO_REMAT} or the plain step was not profiled"
    assert f"the plans priced on the plain step: {NO_REMAT} or the plain step was not profiled" in markdown(b)
    assert b.rows[3].predicted_ms == pytest.approx(1e3 * b.calibrations["m"].seconds(b.costs["m", "rematopt@0.8"], 0,
                                                                                     b.rows[3].compiled_peak))


def _plan(tmp_path: Path, name: str, deterministic_time: float, until: float, max_rounds: int = 8) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    got = run_worker({"model": MODELS["mlp"].spec, "config": MODELS["mlp"].quick, "label": "mlp", "device": "cpu",
                      "plan_dir": str(folder), "ratios": [0.8], "deterministic_time": deterministic_time,
                      "max_rounds": max_rounds,
                      "until": until, "cwd": str(ROOT)}, worker_env(), 600)  # a fresh process, as the bench plans
    return got["plans"]["0.8"]


def test_planning_runs_on_the_deterministic_clock_and_repeats(tmp_path):
    """The bench's plans come from --verify xla's loop under CP-SAT's deterministic time: two runs make
    the same plan, the loop says which limit ended it and what it spent, never more than D, in at
    most ``max_rounds`` rounds in each of its two orders."""
    runs = [_plan(tmp_path, name, 0.3, time.time() + 600, max_rounds=8) for name in ("a", "b")]
    for p in runs:
        assert p["stopped_by"] in ("deterministic_time", "max_rounds", "bracket"), p
        assert 0 <= p["deterministic_spent"] <= 0.3 + 1e-9 and 1 <= p["rounds"] <= 16
    same = [{k: v for k, v in p.items() if k not in ("path", "graph")} for p in runs]  # but for the folders
    assert same[0] == same[1]
    assert Plan.load(runs[0]["path"]).events() == Plan.load(runs[1]["path"]).events()


def test_planning_the_wall_clock_cut_says_so(tmp_path):
    p = _plan(tmp_path, "late", 5.0, time.time() - 1)  # the command's wall clock already out
    assert p.get("stopped_by", "time_limit") == "time_limit", p


def test_the_report_says_which_clock_ended_planning(tmp_path):
    b = Bench("cpu", "cpu", deterministic_time=5.0, rows=[
        Row("m", "plain", "plain", compiled_peak=100, step_ms=10.0),
        Row("m", "rematopt@0.8", "rematopt", 0.8, compiled_peak=79, stopped_by="deterministic_time",
            deterministic_spent=4.99),
        Row("m", "rematopt@0.6", "rematopt", 0.6, compiled_peak=59, stopped_by="max_rounds", deterministic_spent=1.2)])
    md = markdown(b)
    assert "planning stopped by (deterministic s)" in md and "5 seconds of CP-SAT's deterministic time" in md
    assert "the plans are reproducible" in md and "not reproducible" not in md
    assert "| deterministic_time (4.99) |" in md and "| max_rounds (1.20) |" in md
    b.rows.append(Row("m", "rematopt@0.5", "rematopt", 0.5, stopped_by="time_limit", deterministic_spent=0.4))
    md = markdown(b)
    assert "except where the wall clock cut planning (m rematopt@0.5" in md
    assert "| time_limit (0.40) (the wall clock: not reproducible) |" in md
    write_report(b, tmp_path)
    with open(tmp_path / "cpu" / "device.csv") as f:
        got = {r["variant"]: r for r in csv.DictReader(f)}
    assert got["rematopt@0.5"]["stopped_by"] == "time_limit" and got["rematopt@0.8"]["deterministic_spent"] == "4.99"


def test_the_time_limit_is_the_whole_runs_and_keeps_what_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    bench = run_bench(("mlp",), quick=True, time_limit=0.0, out=tmp_path, progress=lambda line: None, cwd=ROOT)
    assert list((tmp_path / "tmp").iterdir()) == []  # the workers' scratch folder is gone
    assert bench.rows == [] and any("time limit (0 s) ran out" in n for n in bench.notes)
    md = (tmp_path / bench.backend / "device.md").read_text()
    assert "time limit (0 s) ran out" in md
    # where the time went: the one process that ran, the backend's probe, its phases among them
    assert list(bench.spent) == ["probe"] and bench.spent["probe"]["processes"] == 1
    assert bench.spent["probe"]["cpu"] > 0 and bench.spent["probe"]["import jax"] > 0
    assert "| probe | 1 |" in md and bench.run["wall"] >= bench.spent["probe"]["wall"]
    run_bench(("mlp",), quick=True, time_limit=0.0, out=tmp_path / "kept", progress=lambda line: None, cwd=ROOT,
              work=tmp_path / "work")
    assert [p.name[:16] for p in (tmp_path / "work").iterdir()] == ["rematopt-device-"]  # --work keeps it


def test_on_an_accelerator_the_models_run_at_the_gpu_fixtures_size_priced_by_the_device_named():
    """The GPU targets are about ../shared/gpu's GPT step: on a GPU the bench runs it at that size, its
    other models at widths of that order, and prices kernels on the profile of the device XLA names."""
    import jax

    from rematopt.jax import load_factory

    gpt = MODELS["gpt"]
    assert gpt.config_for("gpu", False) == {"layers": 8, "width": 1024, "heads": 16, "seq": 1024, "batch": 8,
                                            "vocab": 8192}
    assert gpt.config_for("cpu", False) == gpt.config and gpt.config_for("gpu", True) == gpt.quick
    for m in MODELS.values():  # the factories take every key (keras_llama's trace takes 36 s: not here)
        assert set(m.accelerator) == set(m.config)
    fn, args = load_factory(gpt.spec, **gpt.accelerator)
    tokens = jax.eval_shape(jax.value_and_grad(fn), *args)[0]
    assert tokens.shape == ()
    assert profile_for("gpu", "NVIDIA H100 80GB HBM3") == "h100-tf32" and profile_for("gpu", "NVIDIA H200") == "h200"
    assert profile_for("gpu", "Tesla V100-SXM2-16GB") == "h200" and profile_for("cpu", "cpu") == "cpu"
    assert profile_for("tpu", "TPU v4") == "tpu-v4"
    assert device(profile_for("gpu", "NVIDIA H100 80GB HBM3")).vector_flops_per_s == device("h200").vector_flops_per_s


def test_pareto_front_and_slop():
    assert pareto([(3, 1), (1, 5), (2, 2), (2.5, 3)]) == [(1, 5), (2, 2), (3, 1)]
    plain = Row("m", "plain", "plain", compiled_peak=10_000, argument_bytes=500, output_bytes=500,
                device_memory=100_000)
    # XLA's limit: (0.8 x 100,000 - 1,000) x slop / 100 aimed at 0.5 x 10,000 - 1,000
    assert _slop(plain, 0.5) == round(100 * 4_000 / 79_000)


SPIN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"


@pytest.mark.skipif(busy_cpu() is None, reason="no /proc/stat: the machine's busy time is not known here")
def test_the_machines_busy_time_counts_another_processs_cpu_in_seconds():
    """What :func:`_time` takes the bench's own CPU from to say what ran beside a timing: a process
    spinning half a CPU second is in it, and no more is counted than the cores could run."""
    before, wall = busy_cpu(), time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    _, _, usage = os.wait4(proc.pid, 0)
    busy, wall = busy_cpu() - before, time.perf_counter() - wall
    assert usage.ru_utime + usage.ru_stime - 0.05 <= busy <= wall * os.cpu_count() + 0.05


@pytest.mark.slow  # about 40 s idle, 134 s measured on the shared 2-core machine (load average 9): six fresh processes
def test_bench_on_a_tiny_model_writes_the_report(tmp_path, optimized_kernels):
    lines = []
    bench = run_bench(("mlp",), quick=True, runs=1, ratios=(0.8,), deterministic_time=0.5, out=tmp_path,
                      progress=lines.append, cwd=ROOT, work=tmp_path / "work")
    kept = {p.name for p in (tmp_path / "work").glob("rematopt-device-*/mlp-*/*")}
    assert {"graph.json", "plan_0.8.json", "grads.npz"} <= kept  # the plan can be applied again
    kinds = [r.kind for r in bench.rows]
    assert kinds.count("plain") == 2 and kinds.count("layer") == 2 and kinds.count("step") == 1
    assert kinds[-2:] == ["applied", "rematopt"] and bench.rows[1].variant == AGAIN
    assert "plan_none.json" in kept
    # the micro-benchmarks' line, then a line per row process (for a missing plan, its reason), the
    # planning's and the timing's: two more than the rows, plain (again) having no process of its own
    assert lines[0].startswith("machine: ") and len(lines) == len(bench.rows) + 2
    for r in bench.rows:
        if r.kind != "rematopt" or r.compiled_peak:
            assert r.compiled_peak > 0 and r.step_ms > 0 and r.predicted_ms > 0, r
            assert r.compiled_peak_is == "temp + arguments + outputs - aliases"
            assert r.variant == AGAIN or r.grad_error < 1e-5
    plain = [r for r in bench.rows if r.kind == "plain"]
    assert all(r.compiled_peak == plain[0].compiled_peak for r in plain)  # same program, same memory
    assert isinstance(bench.calibrations["mlp"], Calibration) and bench.machine is not None
    # the plain step profiled kernel by kernel in the timing process: one scale per kernel class beside
    assert isinstance(bench.class_calibrations["mlp"], Calibration) and bench.profiles["mlp", "plain"]
    # calibrated on the plain step: the median of its two compiles' times
    measured = (plain[0].step_ms + plain[1].step_ms) / 2
    assert bench.rows[0].predicted_class_ms == pytest.approx(measured)
    assert bench.rows[0].predicted_scale_ms == pytest.approx(measured)
    assert bench.rows[0].predicted_ms == bench.rows[1].predicted_ms == pytest.approx(measured)
    # and the plans on apply_plan's program of the no-remat plan, profiled too
    own = bench.rows[-2]
    assert isinstance(bench.plan_calibrations["mlp"], Calibration) and bench.profiles["mlp", NO_REMAT]
    assert own.predicted_ms == pytest.approx(own.step_ms)
    plan = bench.rows[-1]
    assert plan.stopped_by in ("deterministic_time", "max_rounds", "bracket") and plan.deterministic_spent <= 0.5
    # on CPU a model's rows share a process (the plain step and the policies; after planning, the plans)
    assert bench.spent["rows"]["processes"] == 2 and bench.spent["planning"]["processes"] == 1
    # the timing process had no other process of the bench beside it; rows and planning ran two at a time
    timing = [p for p in bench.processes if p[0] == "timing"]
    assert len(timing) == 1 and all(p[3] <= timing[0][2] for p in bench.processes if p is not timing[0])
    assert (bench.run["two_at_once"] > 0) == (len(os.sched_getaffinity(0)) > 1)
    assert "## Where the run's time went" in (tmp_path / bench.backend / "device.md").read_text()
    # what the machine's other processes ran beside the timing, measured and reported
    assert set(bench.beside) == {"mlp"} and bench.beside["mlp"][0] >= 0 and bench.beside["mlp"][1] > 0
    folder = tmp_path / bench.backend
    md = (folder / "device.md").read_text()
    assert md.index("## Verdict") < md.index("## Where the time went, per kernel class") < md.index("## Every row")
    assert sum(line.startswith("| mlp | 0.8 |") for line in md.splitlines()) == 1
    assert "Beside the timing: " in md and " mlp " in md.split("Beside the timing: ")[1].split("\n")[0] + " "
    with open(folder / "device.csv") as f:
        assert len(list(csv.DictReader(f))) == len(bench.rows)
    assert (folder / "device.png").stat().st_size > 0
    # the work folder keeps what the prediction is computed from, and every round's time behind each row's
    saved = json.loads(next((tmp_path / "work").glob("rematopt-device-*/mlp-*/profiles.json")).read_text())
    timed = [r for r in bench.rows if r.step_ms]
    assert set(saved["rounds"]) == {r.variant for r in timed} and all(
        min(saved["rounds"][r.variant]) == r.step_ms and saved["peaks"][r.variant] == r.compiled_peak for r in timed)
    # and the page faults each kernel's profiled time holds, per variant (none: the mlp's temp is small)
    assert set(saved["kernel_faults"]) == {r.variant for r in bench.rows if r.compiled_peak}


PREDICTED_FAULTS = """
import json, sys
import jax
from rematopt.jax import load_factory
from rematopt.studies.device.settings import MODELS
from rematopt.xla.cost import step_faults
out = {}
for scope in ("step", "layer"):
    fn, args = load_factory(MODELS["gpt"].spec, **MODELS["gpt"].quick, remat="dots_saveable", remat_scope=scope)
    c = jax.jit(jax.value_and_grad(fn)).lower(*args).compile()
    out[f"{scope}:dots_saveable"] = step_faults(c.as_text(), int(c.memory_analysis().temp_size_in_bytes))
print(json.dumps(out))
"""


@pytest.mark.slow  # about 90 s: quick gpt's two dots_saveable steps compiled three times
def test_each_variant_is_timed_in_a_process_of_its_own_and_faults_as_predicted(monkeypatch, optimized_kernels):
    """The bench's timing path: each variant in a process of its own faults, step by step, what its
    compiled program predicts (xla.cost.step_faults). In one process shared by all of quick gpt's
    rows, one variant's frees moved the next one's faults by up to 8% (docs/device.md); with these
    two variants alone in one process they did not, so this checks the path, not that finding. The same
    program with its pages kept (on the main thread, glibc keeping what it frees) faults none."""
    import os

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=false")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(ROOT)
    predicted = last_json(PREDICTED_FAULTS)
    variants = {label: {"remat": "dots_saveable", "scope": label.split(":")[0]} for label in predicted}
    variants[KEPT] = {**variants["step:dots_saveable"], "keep_pages": True}
    got = time_steps({"model": MODELS["gpt"].spec, "config": MODELS["gpt"].quick, "rounds": 3, "clock": "cpu",
                      "pin": min(os.sched_getaffinity(0)), "variants": variants})
    assert not got["errors"] and set(got["faults"]) == {*predicted, KEPT}
    kept = got["faults"].pop(KEPT)
    assert sorted(kept)[len(kept) // 2] < 0.01 * predicted["step:dots_saveable"], kept
    for label, faults in got["faults"].items():
        assert sorted(faults)[len(faults) // 2] == pytest.approx(predicted[label], rel=0.01), (label, faults)


def _script_copy(tmp_path: Path, python: str) -> tuple[Path, dict]:
    """tools/gpu_bench.sh in a checkout of its own (src/ and models/ linked, no .whl/), and an
    environment whose python3 is ``python``."""
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "gpu_bench.sh"
    script.write_text((ROOT / "tools" / "gpu_bench.sh").read_text())
    for name in ("src", "models"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')  # a link loses a venv
    (tmp_path / "bin" / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    return script, env


def test_the_gpu_script_runs_the_bench_from_its_checkout_and_refuses_what_it_cannot_do(tmp_path):
    import subprocess
    import sys

    script, env = _script_copy(tmp_path, sys.executable)
    # run: rematopt from the checkout's src/, its output also in $OUT/bench.log
    got = subprocess.run(["bash", str(script), "run", "--help"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    assert "--time-limit" in got.stdout and "--work" in got.stdout
    assert "--time-limit" in (tmp_path / "out" / "bench.log").read_text()
    # no step named: one line, exit 2
    got = subprocess.run(["bash", str(script), "bogus"], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and got.stderr.strip().startswith("usage: tools/gpu_bench.sh")
    # fetch takes the versions installed here: where a package is not, it says which, exit 2, nothing fetched
    (tmp_path / "bin" / "python3").write_text("#!/bin/sh\nexit 1\n")
    got = subprocess.run(["bash", str(script), "fetch"], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 2
    assert got.stderr.strip() == ("tools/gpu_bench.sh: ortools is not installed here "
                                  "(install what the README's test command needs first)")
    assert not (tmp_path / ".whl").exists()


def test_run_outside_a_checkout_it_says_so_in_one_line_before_it_starts(tmp_path):
    # the workers import models/ from the current directory: elsewhere every row used to fail and the
    # command exit 0 with an empty report
    got = subprocess.run([sys.executable, "-m", "rematopt", "bench", "device", "--quick", "--models", "mlp",
                          "--out", tmp_path / "out"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        f"rematopt: bench device: cannot import models.mlp from {tmp_path}: run it from a checkout of rematopt, "
        "whose models/ it imports"]
    assert not (tmp_path / "out").exists()
