"""The report: the verdict per model and budget, why a plan misses or is slower, the predictions
against the measurements, and the figure (memory against step time, the baselines' Pareto front)."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict
from pathlib import Path

from ...xla.cost import KERNEL_CLASSES, Calibration, profiled_by_class
from .results import BASELINES, Bench, Row
from .settings import AGAIN, AT_ONCE, KEPT, NO_REMAT, PLAN_ROUNDS, PROFILE_STEPS, SETTLE_ROUNDS, SETTLED


def noise(bench: Bench, model: str) -> float | None:
    """How far two measurements of one step time can differ: the larger of the relative difference
    between the plain step and its second compile, and, over every variant, between the fastest step
    of the even rounds and of the odd rounds."""
    rows = [r for r in bench.rows if r.model == model and r.step_ms]
    plains = [r.step_ms for r in rows if r.kind == "plain"]
    if not plains:
        return None
    return max([(max(plains) - min(plains)) / min(plains)] + [r.step_ms_spread or 0.0 for r in rows])


def verdict(bench: Bench) -> list[dict]:
    """For each model and budget ratio: the fastest baseline whose compiled peak fits r x the plain
    compiled peak, and rematopt's plan, side by side."""
    out = []
    for model in dict.fromkeys(r.model for r in bench.rows):
        rows = [r for r in bench.rows if r.model == model]
        plain = [r for r in rows if r.kind == "plain" and r.compiled_peak]
        if not plain:
            continue
        peak = plain[0].compiled_peak
        tol = noise(bench, model) or 0.0
        for ratio in sorted(set(bench.ratios) | {r.budget_ratio for r in rows if r.budget_ratio}, reverse=True):
            budget = ratio * peak
            fits = [r for r in rows if r.kind in BASELINES and r.compiled_peak and r.compiled_peak <= budget
                    and r.step_ms]
            best = min(fits, key=lambda r: r.step_ms) if fits else None
            ours = next((r for r in rows if r.kind == "rematopt" and r.budget_ratio == ratio), None)
            entry = {"model": model, "ratio": ratio, "budget": budget, "baseline": best, "plan": ours,
                     "noise": tol}
            entry["plan_fits"] = bool(ours and ours.compiled_peak and ours.compiled_peak <= budget)
            if best and entry["plan_fits"]:
                entry["time_ratio"] = ours.step_ms / best.step_ms
                entry["verdict"] = ("at or below the baseline" if entry["time_ratio"] <= 1
                                    else "slower, within the noise" if entry["time_ratio"] <= 1 + tol
                                    else "slower than the baseline")
            elif entry["plan_fits"]:
                entry["verdict"] = "fits where no baseline does"
            elif ours and ours.compiled_peak:
                entry["verdict"] = "does not fit as compiled"
            else:
                entry["verdict"] = "no plan"
            entry["why"] = cause(bench, entry)
            out.append(entry)
    return out


SUCCESSES = ("at or below the baseline", "slower, within the noise", "fits where no baseline does")


def cause(bench: Bench, entry: dict) -> str:
    """Why a :func:`verdict` entry is not a success, from its rows' data ("" where it is one): for a
    plan that misses, what ended its loop, how far over it compiled and how far the graph's prediction
    of it was; for a plan slower than the baseline, whether rematopt's own price of the compiled plan
    already ranked it slower (the planner's space or search) or the prediction was off, and the page
    faults where they make up the difference."""
    p, b = entry["plan"], entry["baseline"]
    if entry["verdict"] in SUCCESSES:
        return ""
    if entry["verdict"] == "no plan":
        return p.note if p and p.note else "the bench made no plan at this budget"
    if entry["verdict"] == "does not fit as compiled":
        return _why_over(p, b, entry["budget"])
    return _why_slower(bench, p, b)


def _why_over(p: Row, b: Row | None, budget: float) -> str:
    """A plan whose compiled peak is over the budget: the loop's end, the excess, the graph's prediction."""
    rounds = f"{p.rounds} round{'s' * (p.rounds != 1)}" if p.rounds is not None else "its rounds"
    ended = {"max_rounds": f"the loop stopped on its rounds ({rounds}, at most {PLAN_ROUNDS} an order)",
             "deterministic_time": f"the loop spent its deterministic time ({rounds})",
             "time_limit": f"the wall clock cut the loop ({rounds})",
             "bracket": f"the loop's brackets closed ({rounds}): no planning budget's plan compiled within it"}
    out = [ended.get(p.stopped_by or "", f"the loop ended ({rounds})"),
           f"its least compiled plan {100 * (p.compiled_peak / budget - 1):.1f}% over the budget"]
    if p.predicted_peak:
        error = 100 * (p.compiled_peak / p.predicted_peak - 1)
        out.append(f"the applied step on the graph predicted {_mb(p.predicted_peak)} MB for it "
                   f"({error:+.1f}% compiled), "
                   + ("within the budget: the prediction missed" if p.predicted_peak <= budget
                      else "over the budget too"))
    out.append(f"{b.variant} fits at {_mb(b.compiled_peak)} MB" if b else "no baseline fits either")
    return "; ".join(out)


def _why_slower(bench: Bench, p: Row, b: Row) -> str:
    """A plan that fits but runs slower than the fastest fitting baseline: rematopt's price of both
    compiled programs (as overheads over the plain step), what was measured, and the page faults."""
    base = _plain_ms(bench, p.model)
    slower = f"measured {100 * (p.step_ms / b.step_ms - 1):+.1f}% against {b.variant}"
    if base is None or p.predicted_ms is None or b.predicted_ms is None:
        out = [f"{slower}; not priced (the plain step was not calibrated)"]
    else:
        over = lambda ms, plain: f"{100 * (ms / plain - 1):+.1f}%"  # noqa: E731
        pp, bp = over(p.predicted_ms, base[1]), over(b.predicted_ms, base[1])
        pm, bm = over(p.step_ms, base[0]), over(b.step_ms, base[0])
        if p.predicted_ms >= b.predicted_ms:
            out = [f"rematopt's own price of the compiled plan, {pp} against the plain step, against the baseline's "
                   f"{bp}, ranked it slower already: the planner's space or search (it minimized the graph's "
                   f"recompute cost" + ("" if p.predicted_overhead is None
                                        else f", +{100 * p.predicted_overhead:.1f}% on the graph")
                   + "; the loop chose the least priced of the plans it compiled)"]
        else:
            miss = 100 * ((p.predicted_ms / base[1]) - (p.step_ms / base[0]))
            out = [f"predicted faster than the baseline ({pp} against {bp} over the plain step) but measured "
                   f"slower ({pm} against {bm}): the plan's prediction was off by {miss:+.1f} points"]
        if b.step_ms < base[0] * (1 - (noise(bench, p.model) or 0.0)):
            out.append(f"the baseline runs {bm} against the plain step itself, whose program every plan recomputes "
                       "from")
    c = bench.calibrations.get(p.model)
    fault_s = c.fault_s if isinstance(c, Calibration) else bench.machine.fault_s if bench.machine else 0.0
    if p.page_faults is not None and b.page_faults is not None and fault_s:
        extra_ms = 1e3 * fault_s * (p.page_faults - b.page_faults)
        if extra_ms > 0 and extra_ms >= 0.5 * (p.step_ms - b.step_ms):
            out.append(f"page faults: the plan's step faults {p.page_faults:,} times against the baseline's "
                       f"{b.page_faults:,} ({extra_ms:+.2f} ms of the {p.step_ms - b.step_ms:+.2f} ms)")
    return "; ".join(out)


def _mb(x) -> str:
    return "—" if x is None else f"{x / 1e6:,.2f}"


def _ms(x) -> str:
    return "—" if x is None else f"{x:,.2f}"


def markdown(bench: Bench) -> str:
    import jax

    clock = ("the process's CPU time on one pinned core (another process's time on that core does not count, "
             "what it leaves in the core's caches does: the machine's other load while each model was timed is "
             "under the verdict)" if bench.clock == "cpu" else "wall-clock time")
    lines = [f"# rematopt bench device: {bench.backend}", "",
             f"jax {jax.__version__}, backend `{bench.backend}`"
             + (f" ({bench.kind})" if bench.kind not in ("", bench.backend) else "") + ", cost profile "
             + (f"`{bench.device}` at the rates micro-benchmarks measured on the core ({bench.machine.describe()}; "
                "rematopt.xla.machine)" if bench.machine else f"`{bench.device}` (its data sheet's rates)")
             + ", calibrated per model on its plain step: each of the plain step's kernels at its profiled time, "
             "scaled so that the step is its measured time; another row's kernel alike to one of them at that "
             "time, any other priced at the one scale that prices the plain step at its measured time (where "
             f"the plain step was not profiled, that scale for all); rematopt's plans the same way on `{NO_REMAT}` "
             "(the plan that recomputes nothing, as apply_plan writes it) first, then on the plain step's kernels. "
             "Step time: "
             f"the fastest of interleaved rounds, each running one step of every variant (more rounds for short "
             f"steps; in a full run, more until each variant's fastest step of the even rounds is within "
             f"{SETTLED:.0%} of its fastest of the odd rounds, {SETTLE_ROUNDS} rounds at most), {clock}. "
             + " ".join(bench.notes), "",
             "## Verdict", "",
             "Budget: r x the plain step's compiled peak. Fastest baseline: the quickest of plain, the "
             "per-layer and whole-step policies (and XLA's GPU remat on a GPU) whose compiled peak fits.", "",
             "| model | r | budget MB | fastest fitting baseline | its MB | its ms | rematopt MB | rematopt ms "
             "| plan / baseline time | noise | verdict |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for v in verdict(bench):
        b, p = v["baseline"], v["plan"]
        ratio = f"{v['time_ratio']:.3f}" if "time_ratio" in v else "—"
        lines.append(f"| {v['model']} | {v['ratio']} | {_mb(v['budget'])} | {b.variant if b else 'none fits'} | "
                     f"{_mb(b.compiled_peak if b else None)} | {_ms(b.step_ms if b else None)} | "
                     f"{_mb(p.compiled_peak if p else None)} | {_ms(p.step_ms if p else None)} | {ratio} | "
                     f"±{100 * v['noise']:.1f}% | {v['verdict']} |")
    why = [f"- {v['model']} {v['ratio']} ({v['verdict']}): {v['why']}." for v in verdict(bench) if v["why"]]
    lines += ["", "Noise: per model, the largest relative difference between two measurements of one step time: "
              "the plain step against its second compile, and each variant's fastest step in the even rounds "
              "against the odd rounds.", *_beside(bench), ""]
    lines += ["Why, where the plan misses or is slower (from the rows below; `rounds` are the planning rounds of "
              "--verify xla's loop, both orders together):", "", *why, ""] if why else []
    lines += ["## Predicted against measured", "", _prediction_summary(bench), "",
              "## Where the time went, per kernel class", "", _by_class(bench), "",
              "## Where the run's time went", "", _time_spent(bench), "",
              "## Every row", "", f"Planning: {bench.planning}. {_reproducible(bench)}", "",
              "| model | variant | compiled peak MB | device peak MB | step ms | predicted ms | overhead measured "
              "| overhead predicted | graph: plan peak MB | graph: plan overhead | kernels | GB moved "
              "| page faults per step: predicted / measured | max grad error | compile s "
              "| planning stopped by (deterministic s) | note |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in bench.rows:
        base = _plain_ms(bench, r.model)
        over = lambda x: "—" if x is None or base is None else f"{100 * (x / base[0] - 1):+.1f}%"  # noqa: E731
        pover = "—" if r.predicted_ms is None or base is None else f"{100 * (r.predicted_ms / base[1] - 1):+.1f}%"
        lines.append(f"| {r.model} | {r.variant} | {_mb(r.compiled_peak)} | {_mb(r.device_peak)} | {_ms(r.step_ms)} "
                     f"| {_ms(r.predicted_ms)} | {over(r.step_ms)} | {pover} | {_mb(r.predicted_peak)} | "
                     f"{'—' if r.predicted_overhead is None else f'{100 * r.predicted_overhead:+.1f}%'} | "
                     f"{r.kernels or '—'} | {'—' if r.bytes_moved is None else f'{r.bytes_moved / 1e9:.2f}'} | "
                     f"{'—' if r.predicted_faults is None else f'{r.predicted_faults:,}'} / "
                     f"{'—' if r.page_faults is None else f'{r.page_faults:,}'} | "
                     f"{'—' if r.grad_error is None else f'{r.grad_error:.1e}'} | "
                     f"{'—' if r.compile_s is None else f'{r.compile_s:.1f}'} | {_stopped(r)} | {r.note} |")
    return "\n".join(lines) + "\n"


# Beside a model's timing, other processes' CPU time above this share of the machine's cores marks its
# step times as a shared machine's.
SHARED = 0.05


def _beside(bench: Bench) -> list[str]:
    """What ran on the machine beside each model's timing (:attr:`.results.Bench.beside`), marked where it
    was more than :data:`SHARED` of the machine."""
    if not bench.beside:
        return []
    cores, parts = os.cpu_count() or 1, []
    for model, (cpu, wall) in bench.beside.items():
        share = cpu / wall / cores if wall > 0 else 0.0
        parts.append(f"{model} {cpu:.1f} s in {wall:.0f} s ({100 * share:.1f}% of the {cores} cores"
                     + (": shared, its step times are not an idle machine's" if share > SHARED else "") + ")")
    return ["", "Beside the timing: the CPU seconds the machine's other processes ran while each model's variants "
            "were timed (/proc/stat, less the bench's own): " + ", ".join(parts) + "."]


def _time_spent(bench: Bench) -> str:
    """The run's wall and CPU seconds, and per kind of worker process where its wall seconds went."""
    run = bench.run
    head = (f"The run: {run['wall']:.0f} s of wall clock, {run['cpu']:.0f} s of CPU, two worker processes at once "
            f"for {run.get('two_at_once', 0.0):.0f} s of it (rows and planning; timing alone), load average "
            f"{run['load_start']:.1f} at its start and {run['load_end']:.1f} at its end ({os.cpu_count()} cores)."
            if run else "The run did not finish.")
    out = [head + _critical_path(bench), "", "| process | count | wall s | CPU s | its phases, wall s |",
           "|---|---:|---:|---:|---|"]
    for kind, d in bench.spent.items():
        phases = {k: v for k, v in d.items() if k not in ("processes", "wall", "cpu")}
        phases["other"] = d["wall"] - sum(phases.values())
        out.append(f"| {kind} | {d['processes']:.0f} | {d['wall']:.1f} | {d['cpu']:.1f} | "
                   + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()) + " |")
    return "\n".join(out)


def _critical_path(bench: Bench) -> str:
    """What the run's processes would take on an idle machine, where a pinned process's CPU seconds are its
    wall seconds: the measuring and planning at least half their CPU (two cores) and at least the longest
    model's chain (its rows or its planning, then its plan rows); the timing processes one after another.
    On CPU only: a GPU host's processes share its device, not two cores."""
    ran = bench.processes
    stage = [p for p in ran if p[0] in ("rows", "planning")]
    timing = [p for p in ran if p[0] == "timing"]
    if not stage or not timing or bench.backend != "cpu":  # a run cut before any timing: no figure for the whole
        return ""
    chains = {}
    for model in dict.fromkeys(p[1] for p in stage):
        rows = sorted((p for p in stage if p[1] == model and p[0] == "rows"), key=lambda p: p[2])
        planning = sum(p[4] for p in stage if p[1] == model and p[0] == "planning")
        chains[model] = max(rows[0][4] if rows else 0.0, planning) + sum(p[4] for p in rows[1:])
    longest = max(chains, key=chains.get)
    cpu = sum(p[4] for p in stage)
    span = max(p[3] for p in stage) - min(p[2] for p in stage)
    # the run's own schedule at full speed: its processes ran at cpu / (their wall seconds) of a core each
    scheduled = max(span * cpu / sum(p[3] - p[2] for p in stage), chains[longest])
    before = sum(p[4] for p in ran if p[0] in ("probe", "micro-benchmarks"))
    timed = sum(p[4] for p in timing)
    return (f" Measuring and planning: {len(stage)} processes, {cpu:.0f} s of CPU in {span:.0f} s of wall clock; "
            f"on an idle machine at least {max(cpu / AT_ONCE, chains[longest]):.0f} s (half their CPU, or "
            f"{longest}'s chain, {chains[longest]:.0f} s: its rows or its planning, then its plan rows), about "
            f"{scheduled:.0f} s as this run's schedule had them (its wall clock times the share of a core each "
            f"process had). Timing, each alone: {len(timing)} process{'es' * (len(timing) != 1)}, {timed:.0f} s of "
            f"CPU. With the probe and micro-benchmarks ({before:.0f} s of CPU), about {before + scheduled + timed:.0f} "
            f"s on an idle machine, taking each process's CPU seconds for its wall seconds.")


def _reproducible(bench: Bench) -> str:
    """Whether the plans are the ones ``deterministic_time`` makes on any load, and which are not."""
    if bench.deterministic_time is None:
        return "Planning ran on the wall clock: the plans may differ between runs."
    cut = [f"{r.model} {r.variant}" for r in bench.rows if r.stopped_by == "time_limit"]
    said = (f"Each budget's loop had {bench.deterministic_time:g} seconds of CP-SAT's deterministic time "
            "(--deterministic-time: one worker, seed 0), so the plans are reproducible: the same on any load, "
            "given the same jax, XLA and OR-Tools")
    return said + (f"; except where the wall clock cut planning ({', '.join(cut)}: `time_limit` below)." if cut
                   else ". The column `planning stopped by` says which limit ended each loop.")


def _stopped(r: Row) -> str:
    if r.stopped_by is None:
        return "—"
    spent = "" if r.deterministic_spent is None else f" ({r.deterministic_spent:.2f})"
    return f"{r.stopped_by}{spent}" + (" (the wall clock: not reproducible)" if r.stopped_by == "time_limit" else "")


def _plain_ms(bench: Bench, model: str) -> tuple[float, float] | None:
    """(measured, predicted) plain step time: the medians over the plain rows."""
    plains = [r for r in bench.rows if r.model == model and r.kind == "plain" and r.step_ms and r.predicted_ms]
    if not plains:
        return None
    return statistics.median(r.step_ms for r in plains), statistics.median(r.predicted_ms for r in plains)


def _prediction_summary(bench: Bench) -> str:
    """Per model: the calibration, how far it predicts the second compile of the plain step and the
    baselines, and the plans: their step time, and their overhead over the plain step (both priced by
    the same function, so the overhead is predicted(plan) / predicted(plain) - 1)."""
    out = ["The prediction is calibrated on the plain step (its kernels, one by one): the second compile of the "
           f"plain step and the policies are predicted from it; rematopt's plans from `{NO_REMAT}` (apply_plan's "
           "program of the plan that recomputes nothing, measured and profiled as the plain step is), then the "
           "plain step: a plan is that program and the kernels its recomputation adds or changes, and its overhead "
           f"is still against the measured plain step. `{NO_REMAT}` against the plain step, measured, and as the "
           "plain step's calibration predicts it, says how far apply_plan's program alone moves the step. Two "
           "other calibrations beside it, for comparison: every kernel at one scale, and one scale per kernel "
           "class (both from the plain step alone). Page faults, predicted from the compiled program "
           "(xla.cost.step_faults): the pages of the buffers a step allocates anew above glibc's mmap ceiling, and "
           "the scratch of YNNPACK fusions that glibc gives back to the kernel; each at the price the plain step "
           f"paid for them (its time less `{KEPT}`'s, the same program with glibc keeping its pages, over its "
           "faults), where it faults, and taken out of the profiled time of the kernel whose write takes it "
           "(xla.cost.profiled_faults). Beyond "
           "its kernels as profiled (step after step, its memory in the caches), the plain step's measured time "
           "(among the other variants' steps) holds what it takes to bring its memory back: priced per byte of a "
           "row's compiled peak (xla.cost.calibrate's footprint; where the step took less than its kernels "
           "profiled, they are scaled down instead).", "",
           "| model | one scale on the measured rates | plain's page faults | beyond its profiled kernels "
           "| plain (again): predicted vs measured "
           f"| baselines within 15% | worst baseline | {NO_REMAT}: measured (from the plain step) "
           "| plans: predicted vs measured time "
           "| plans: predicted overhead - measured (points) | the same, one scale per kernel class "
           "| the same, one scale |",
           "|---|---:|---:|---:|---:|---:|---|---:|---|---|---|---|"]
    for model in dict.fromkeys(r.model for r in bench.rows):
        c = bench.calibrations.get(model)
        base = _plain_ms(bench, model)
        if not isinstance(c, Calibration) or base is None:
            out.append(f"| {model} | not calibrated: {c or 'not timed'} |" + " — |" * 10)
            continue
        rows = [r for r in bench.rows if r.model == model and r.step_ms and r.predicted_ms]
        plain = next(r for r in rows if r.variant == "plain")
        errs = [(r.predicted_ms / r.step_ms - 1, r.variant) for r in rows if r.kind in BASELINES and r is not plain]
        again = next((f"{100 * e:+.1f}%" for e, v in errs if v == AGAIN), "—")
        within = sum(abs(e) <= 0.15 for e, _ in errs)
        worst = max(errs, key=lambda e: abs(e[0]), default=None)
        plans = [r for r in rows if r.kind == "rematopt"]
        times = ", ".join(f"{r.variant} {100 * (r.predicted_ms / r.step_ms - 1):+.1f}%" for r in plans)
        overheads = ", ".join(f"{r.variant} {100 * ((r.predicted_ms / base[1]) - (r.step_ms / base[0])):+.1f}"
                              for r in plans)
        def points(field_: str) -> str:  # each plan's predicted overhead - measured, on another calibration
            own = getattr(plain, field_)
            return ", ".join(f"{r.variant} {100 * (getattr(r, field_) / own - r.step_ms / base[0]):+.1f}"
                             for r in plans if getattr(r, field_) and own)
        share = (plain.predicted_faults or 0) * c.fault_s * 1e3 / plain.step_ms
        kept = bench.kept.get(model)
        paid = (f"; {c.fault_s * 1e6:.3g} us each: pages kept {kept[0]:.4g} ms, {kept[1]:,} faults" if kept
                else "")
        no_remat = next((r for r in rows if r.variant == NO_REMAT and (model, NO_REMAT) in bench.costs), None)
        applied = "—"
        if no_remat is not None:
            priced = bench.predicted_ms(c, no_remat)
            applied = f"{100 * (no_remat.step_ms / base[0] - 1):+.1f}% ({100 * (priced / base[1] - 1):+.1f}%)"
        why = bench.plan_calibrations.get(model)
        if isinstance(why, str):  # the plans were priced on the plain step's calibration
            applied += f"; the plans priced on the plain step: {why}"
        one = bench.scale_calibrations.get(model)
        beyond = (plain.compiled_peak or 0) * c.footprint_s * 1e3
        refill = (f"{beyond:.3g} ms ({100 * beyond / plain.step_ms:.0f}%), {1e12 * c.footprint_s:.3g} ns a KB of peak"
                  if c.footprint_s else "none: its faults priced at what its kernels left them"
                  if plain.predicted_faults and c.fault_s else "none: its kernels scaled down to it")
        out.append(f"| {model} | x{(one.scale if isinstance(one, Calibration) else c.scale):.3g} "
                   f"| {plain.predicted_faults or 0:,} ({100 * share:.0f}% of its time{paid}) | {refill} "
                   f"| {again} | {within} of {len(errs)} | {f'{worst[1]} {100 * worst[0]:+.1f}%' if worst else '—'} "
                   f"| {applied} | {times or '—'} | {overheads or '—'} | {points('predicted_class_ms') or '—'} "
                   f"| {points('predicted_scale_ms') or '—'} |")
    return "\n".join(out)


def _by_class(bench: Bench) -> str:
    """Per model, for the plain step and each plan: each kernel class's predicted seconds (one scale, and
    one scale per class fitted on the plain step's profile) against its profiled seconds (the fastest run
    of each kernel inside the step, wall time, page faults included where they happen)."""
    out = ["Kernel classes (xla.cost.kernel_class): lone dot (Eigen), matrix fusion (YNNPACK), transposing, "
           "loop fusion, other. Profiled: each kernel's fastest of "
           f"{PROFILE_STEPS} steps inside the program (xla.profile.kernel_seconds, wall time). Predicted: the "
           "class's kernels priced and scaled, without page faults. The per-class scales share the plain step's "
           "measured kernel time among the classes as its profile does; the plans' profiles are not fitted on.",
           "", "| model | class | per-class scale | plain: predicted ms (one scale / per class) | plain: profiled ms "
           "| plan | plan: predicted ms (one scale / per class) | plan: profiled ms |",
           "|---|---|---:|---:|---:|---|---:|---:|"]
    for model in dict.fromkeys(r.model for r in bench.rows):
        one, per = bench.scale_calibrations.get(model), bench.class_calibrations.get(model)
        if not isinstance(one, Calibration) or not isinstance(per, Calibration):
            continue
        def split(variant: str) -> tuple[dict, dict, dict]:
            step = bench.costs[model, variant]
            return one.scaled(step), per.scaled(step), profiled_by_class(step, bench.profiles.get((model, variant), {}))

        plain = split("plain")
        scales = dict(per.class_scales)
        for variant in [r.variant for r in bench.rows if r.model == model and r.kind == "rematopt"
                        and (model, r.variant) in bench.costs]:
            plan = split(variant)
            for c in [c for c in KERNEL_CLASSES if c in plain[0] or c in plan[0]]:
                ms = lambda d: f"{1e3 * d[c]:,.2f}" if c in d else "—"  # noqa: E731
                prof = lambda d, v: ms(d) if (model, v) in bench.profiles else "—"  # noqa: E731
                out.append(f"| {model} | {c} | {'x%.3g' % scales[c] if c in scales else f'x{one.scale:.3g} (global)'} "
                           f"| {ms(plain[0])} / {ms(plain[1])} | {prof(plain[2], 'plain')} | {variant} "
                           f"| {ms(plan[0])} / {ms(plan[1])} | {prof(plan[2], variant)} |")
    return "\n".join(out)


def write_report(bench: Bench, folder: Path) -> None:
    """``device.md``, ``device.csv`` and ``device.png`` under ``folder/<backend>/``."""
    import csv

    where = Path(folder) / bench.backend
    where.mkdir(parents=True, exist_ok=True)
    (where / "device.md").write_text(markdown(bench))
    with open(where / "device.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(Row("", "", "")).keys()))
        writer.writeheader()
        for r in bench.rows:
            writer.writerow(asdict(r))
    if any(r.compiled_peak for r in bench.rows):
        figure(bench, where / "device.png")


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both memory and time, by memory."""
    front, best = [], math.inf
    for m, t in sorted(points):
        if t < best:
            front.append((m, t))
            best = t
    return front


def figure(bench: Bench, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in bench.rows if r.compiled_peak))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [r for r in bench.rows if r.model == model and r.compiled_peak and r.step_ms]
        base = [r for r in rows if r.kind in BASELINES]
        for kind, marker in (("plain", "s"), ("layer", "o"), ("step", "^"), ("xla-gpu", "D")):
            pts = [r for r in base if r.kind == kind]
            if pts:
                ax.scatter([r.compiled_peak / 1e6 for r in pts], [r.step_ms for r in pts], marker=marker,
                           label=kind if kind != "layer" else "per layer", zorder=3)
        front = pareto([(r.compiled_peak / 1e6, r.step_ms) for r in base])
        if front:
            ax.step([m for m, _ in front], [t for _, t in front], where="post", color="grey", lw=1,
                    label="baselines' Pareto front")
        own = [r for r in rows if r.kind == "applied"]
        if own:
            ax.scatter([r.compiled_peak / 1e6 for r in own], [r.step_ms for r in own], marker="x", color="red",
                       label=NO_REMAT, zorder=4)
        ours = [r for r in rows if r.kind == "rematopt"]
        if ours:
            ax.scatter([r.compiled_peak / 1e6 for r in ours], [r.step_ms for r in ours], marker="*", s=160,
                       color="red", label="rematopt", zorder=4)
            for r in ours:
                ax.annotate(f"{r.budget_ratio}", (r.compiled_peak / 1e6, r.step_ms), fontsize=8)
        ax.set_title(model)
        ax.set_xlabel("compiled peak (MB)")
        ax.set_ylabel("step time (ms)")
        if ax.get_legend_handles_labels()[0]:  # nothing to label before the rows are timed
            ax.legend(fontsize=7)
    fig.suptitle(f"memory against step time ({bench.backend})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
