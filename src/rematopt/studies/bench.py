"""Benchmarks that print tables (performance is measured here, never asserted
in tests). Ratios are against a baseline run in the same process."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Callable

from rich.table import Table

from ..graph import Graph
from ..importers import load as load_graph
from ..importers.synthetic import chain
from ..plan import Plan, PlanBuilder
from ..simulate import simulate
from ..stats import verdict

# The checkout, and the published graphs beside it (../shared/benchmarks).
REPO = Path(__file__).resolve().parents[3]
PUBLISHED = REPO.parent / "shared" / "benchmarks" / "nodelink"


def recompute_from_source_plan(graph: Graph, depth: int) -> Plan:
    """A valid quadratic-size plan on ``chain(depth, sinks=True)``: before each
    sink, recompute the chain from ``x`` up to its link, freeing as it goes.
    About depth^2 events, the size and shape of the greedy stress plans."""
    b = PlanBuilder()
    for i in range(depth, 0, -1):
        sink = 2 * depth + 1 - i  # s{i} is added in order s{depth}..s1
        b.compute(0)
        for link in range(1, i + 1):
            b.compute(link)
            b.free(link - 1)
        b.compute(sink)
        b.free(i)
        b.free(sink)
    return b.build(graph.name, "recompute-from-source")


def depth_for_events(events: int) -> int:
    """Chain depth whose recompute-from-source plan has about ``events`` events."""
    return max(1, round(math.sqrt(events)))


def simulator_table(sizes: list[int]) -> Table:
    table = Table(title="simulator: replay, save and load of a plan")
    for col in ("events", "replay s", "events/s", "save s", "load s", "peak bytes"):
        table.add_column(col, justify="right")
    for target in sizes:
        depth = depth_for_events(target)
        graph = chain(depth, sinks=True)
        plan = recompute_from_source_plan(graph, depth)
        start = time.perf_counter()
        replay = simulate(graph, plan)
        replay_s = time.perf_counter() - start
        assert replay.valid, replay.error
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.json"
            start = time.perf_counter()
            plan.save(path)
            save_s = time.perf_counter() - start
            start = time.perf_counter()
            Plan.load(path)
            load_s = time.perf_counter() - start
        table.add_row(f"{len(plan):,}", f"{replay_s:.3f}", f"{len(plan) / replay_s:,.0f}",
                      f"{save_s:.3f}", f"{load_s:.3f}", f"{replay.peak_bytes:,}")
    return table


def greedy_table(depth: int = 2000, repeat: int = 3) -> Table:
    """The greedy pass on ``chain(depth, sinks=True)`` at a budget of 0 (below
    the working-set bound: everything is selected): unbounded, the default
    clone bound with midpoint trimming, and the max-clone ablation. Planner
    time is the fastest of ``repeat`` runs, split by phase (from that plan's
    ``timings_s``); the replay is timed once and checks every figure."""
    import warnings

    from ..planners import greedy
    from ..reference import no_remat_peak

    graph = chain(depth, sinks=True)
    before = no_remat_peak(graph)
    table = Table(title=f"greedy on chain_sinks_d{depth} (budget 0, {len(graph.compute_ids):,} compute nodes)")
    for col in ("variant", "selected", "dropped", "compute ops", "x nodes", "peak cut",
                "planner s", "select", "project", "trim", "materialise", "figures", "replay s"):
        table.add_column(col, justify="right")
    variants = [("unbounded", {"max_clone_expansion": 0}), ("bound 8, midpoint", {}),
                ("bound 8, max-clone", {"trim": "max-clone"})]
    for name, options in variants:
        runs = []
        for _ in range(repeat):  # the fastest of a few runs: the machine is shared
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = greedy.plan(graph, 0, options)
            runs.append((time.perf_counter() - start, plan))
        planner_s, plan = min(runs, key=lambda r: r[0])
        del runs
        start = time.perf_counter()
        replay = simulate(graph, plan)
        replay_s = time.perf_counter() - start
        stats = plan.stats
        assert replay.valid and replay.peak_bytes == stats["peak_bytes"], replay.error
        assert replay.compute_events == stats["emitted_compute_events"]
        t = stats["timings_s"]
        table.add_row(name, f"{len(stats['selected']):,}", f"{len(stats['dropped']):,}",
                      f"{replay.compute_events:,}", f"{replay.compute_events / len(graph.compute_ids):.2f}",
                      f"{100 * (1 - replay.peak_bytes / before):.1f}%", f"{planner_s:.2f}",
                      *(f"{t[k]:.2f}" for k in ("select_s", "project_s", "trim_s", "materialise_s", "figures_s")),
                      f"{replay_s:.2f}")
    return table


def greedy_exactness_table(depths: range = range(4, 49)) -> Table:
    """Projected against emitted compute events on ``chain(d, sinks=True)``
    with everything selected and no bound: emitted = compute nodes +
    projected clones - selected originals dropped, counted by the replay."""
    from ..planners import greedy

    table = Table(title="greedy clone projection, chain with sinks, unbounded")
    for col in ("depth", "compute nodes", "projected clones", "originals dropped",
                "projected ops", "emitted ops (replay)", "exact"):
        table.add_column(col, justify="right")
    for depth in depths:
        graph = chain(depth, sinks=True)
        plan = greedy.plan(graph, 0, {"max_clone_expansion": 0})
        selected = {graph.node_by_name(name).id for name in plan.stats["selected"]}
        proj = greedy.projection(graph, selected)
        projected = proj.compute_events(graph)
        emitted = simulate(graph, plan).compute_events
        table.add_row(str(depth), str(len(graph.compute_ids)), f"{proj.total_clones:,}",
                      str(proj.originals_dropped()), f"{projected:,}", f"{emitted:,}",
                      "yes" if projected == emitted else "NO")
    return table


def cpsat_table(ratios: tuple[float, ...] = (0.9, 0.8), time_limit: float = 60.0, workers: int = 2,
                folder: Path | None = None) -> Table:
    """``cpsat`` on the published node-link graphs at each budget ratio: status,
    overhead, gap, time to first and to best solution (seconds from the call)."""
    from ..errors import RematoptError
    from ..solve import solve

    folder = folder or PUBLISHED
    files = sorted(folder.glob("*.json"))
    if not files:
        raise RematoptError(f"{folder}: no node-link graphs to benchmark")
    table = Table(title=f"cpsat on {folder.name}: {time_limit:g} s limit, {workers} workers")
    for col in ("graph", "ratio", "status", "overhead %", "gap %", "space", "space status", "space gap %",
                "first s", "best s", "wall s", "space proven", "whole space proven by", "warm start"):
        table.add_column(col, justify="right")
    for path in files:
        graph = load_graph(path)
        for ratio in ratios:
            sol = solve(graph, "cpsat", budget_ratio=ratio, check_budget=False, time_limit=time_limit,
                        workers=workers, lp_bound=False)
            st = sol.plan.stats
            if sol.replay is None:
                note = st.get("reason", "")
                table.add_row(graph.name, f"{ratio:g}", verdict(st), "", "", "", "", "", "", "",
                              f"{sol.wall_s:.1f}", "", "", note[:60])
                continue
            table.add_row(graph.name, f"{ratio:g}", verdict(st), f"{100 * sol.replay.overhead:.3f}",
                          _pct(st.get("gap")), st.get("space", ""), st.get("space_status", st["status"]),
                          _pct(st.get("space_gap", st.get("gap"))), _secs(st.get("time_to_first_s")),
                          _secs(st.get("time_to_best_s")), f"{sol.wall_s:.1f}",
                          _proven(st.get("rounds", [])), _whole(st), str(st.get("warm_start")))
    return table


def peak_table(caps: tuple[float | None, ...] = (None, 0.1), time_limit: float = 60.0, workers: int = 2,
               folders: list[Path] | None = None, max_nodes: int = 2100) -> Table:
    """``cpsat --objective peak`` (issue 19's target: proven, or a gap of at
    most 5%) on the node-link graphs and ``instances/`` up to ``max_nodes``,
    with the overhead unlimited and capped: the peak, the bound, what proved
    it (``bound_by``) and the bisection's probes (yes / no / undecided)."""
    from ..solve import solve

    folders = folders or [PUBLISHED, REPO / "instances"]
    graphs = [g for g in (load_graph(p) for f in folders for p in sorted(f.glob("*.json"))) if g.n <= max_nodes]
    table = Table(title=f"cpsat --objective peak: {time_limit:g} s limit, {workers} workers")
    for col in ("graph", "nodes", "max overhead", "status", "peak B", "bound B", "gap %", "bound by",
                "probes y/n/?", "overhead %", "wall s"):
        table.add_column(col, justify="right")
    for g in graphs:
        for cap in caps:
            opts = {} if cap is None else {"max_overhead": cap}
            sol = solve(g, "cpsat", objective="peak", time_limit=time_limit, workers=workers, lp_bound=False,
                        **opts)
            st = sol.plan.stats
            probes = st.get("peak_probes", [])
            tally = "/".join(str(sum(p["verdict"] == v for p in probes)) for v in ("yes", "no", "unknown"))
            table.add_row(g.name, str(g.n), "none" if cap is None else f"{100 * cap:g}%", verdict(st),
                          f"{sol.replay.peak_bytes:,}", f"{math.ceil(st['best_bound']):,}", _pct(st.get("gap")),
                          str(st.get("bound_by", "")), tally, f"{100 * sol.replay.overhead:.2f}", f"{sol.wall_s:.1f}")
    return table


def _proven(rounds: list[dict]) -> str:
    """The deepest model solved to optimality, and when: "depth 1 at 11.0 s"."""
    done = [r for r in rounds if r["status"] == "OPTIMAL"]
    return f"depth {done[-1]['recompute_depth']} at {done[-1]['elapsed_s']:.1f} s" if done else ""


def _whole(st: dict) -> str:
    """What proved the plan optimal over the whole staged space: a
    bound (``staged.bounds``) and when, or the full model itself."""
    if not st.get("optimal_in"):
        return ""
    proof = next((p for p in st.get("relaxation_proofs", []) if p["status"] == "INFEASIBLE"), None)
    if proof is not None:
        return f"{proof['level']} at {proof['elapsed_s']:.1f} s"
    if (st.get("gap_relaxation") or {}).get("bound") == st["objective"]:
        return "gaps"
    return "full model" if st.get("space") == "staged" else ""


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.2f}"


def _secs(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


# The instances of the scale benchmark (issues 15 and 25): JAX training steps
# of the decoder at 12 to 96 layers (Python loop; at 48 also fused, and the
# lax.scan stack unrolled), at 480 layers (84,084 nodes since views merge
# into their sources; 99,940 before) and 576 (about 100,000), a generated
# chain of 480 decoder blocks of 16 heads (99,847 nodes), and Moccasin-style
# random layered graphs.
# name -> (kind, what, fused, size): size is the layers, blocks or nodes.
SCALE = {
    "gpt12": ("jax", "models.gpt:factory", False, 12),
    "gpt24": ("jax", "models.gpt:factory", False, 24),
    "gpt48": ("jax", "models.gpt:factory", False, 48),
    "gpt96": ("jax", "models.gpt:factory", False, 96),
    "gpt480": ("jax", "models.gpt:factory", False, 480),
    "gpt576": ("jax", "models.gpt:factory", False, 576),
    "gpt48_fused": ("jax", "models.gpt:factory", True, 48),
    "gpt_scan48": ("jax", "models.gpt_scan:factory", False, 48),
    "decoder480": ("decoder", 16, False, 480),
    "random_layered_n500": ("random", None, False, 500),
    "random_layered_n1000": ("random", None, False, 1000),
}

# Reports a child process's peak resident memory when it exits.
_CHILD = ("import atexit, resource, sys\n"
          "atexit.register(lambda: sys.stderr.write("
          "f'\\nMAXRSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n'))\n"
          "from rematopt.cli import main\n"
          "sys.argv = ['rematopt', *sys.argv[1:]]\n"
          "main()\n")


def scale_graph(name: str, folder: Path) -> Path:
    """The instance ``name`` of SCALE in ``folder``, made on first use (the
    JAX ones need the models/ folder of a checkout on the path)."""
    path = folder / f"{name}.json"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    kind, what, fused, size = SCALE[name]
    if kind == "random":
        from ..importers.synthetic import random_layered

        random_layered(size, seed=1).save(path)
        return path
    if kind == "decoder":
        from ..importers.synthetic import decoder

        decoder(size, heads=what).save(path)
        return path
    from ..jax import load_factory, trace_grad

    loss, args = load_factory(what, layers=size)
    trace_grad(loss, *args, name=name, fuse=fused, meta={"model": what, "config": {"layers": size}}).save(path)
    return path


def scale_rows(names: tuple[str, ...], ratios: tuple[float, ...], time_limit: float, workers: int,
               folder: Path, lns: tuple[str, ...] = ("auto",),
               progress: Callable[[str], None] | None = None) -> list[dict]:
    """cpsat at each budget ratio of each instance, each run in its own
    process (its wall time, build included, and peak memory), against the
    best heuristic plan within the budget (dtr, greedy, chen-*, the JAX
    policies) run here; once per ``--lns`` setting in ``lns``. Each row
    is told to ``progress`` in a line as it is done."""
    import json
    import subprocess
    import sys

    from ..planners.cpsat.warm_start import fast_plans
    from ..reference import resolve_budget

    rows = []
    for name in names:
        path = scale_graph(name, folder)
        graph = load_graph(path)
        for ratio in ratios:
            budget = resolve_budget(graph, ratio=ratio, check=False)
            fast = fast_plans(graph, budget)
            fits = [(r.overhead, p.planner) for p, r in fast if r.peak_bytes <= budget]
            dtr = next((r.overhead for p, r in fast if p.planner == "dtr" and r.peak_bytes <= budget), None)
            for setting in lns:
                began = time.perf_counter()
                out = subprocess.run([sys.executable, "-c", _CHILD, "solve", str(path), "--budget-ratio", str(ratio),
                                      "--time-limit", str(time_limit), "--workers", str(workers), "--lns", setting,
                                      "--json"], capture_output=True, text=True)
                wall = time.perf_counter() - began
                rss = next((int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("MAXRSS")), 0)
                try:
                    st = json.loads(out.stdout)
                except ValueError:
                    st = {"status": "ERROR", "reason": out.stderr.strip()[-60:]}
                rows.append({"graph": name, "nodes": graph.n, "ratio": ratio, "lns": setting,
                             "best_heuristic": min(fits, default=None), "dtr": dtr, "stats": st, "wall_s": wall,
                             "over_limit_s": wall - time_limit, "rss_gib": rss / 2**20})
                if progress:
                    progress(f"{name} at {ratio:g}: cpsat {_pct(st.get('overhead'))}% ({st['status']}), dtr "
                             f"{_pct(dtr)}%, {wall:.0f} s")
    return rows


def _space(st: dict) -> str:
    """The order of the staged space cpsat searched (planners/staged/order.py)."""
    return f"{st['order_from']}'s" if st.get("order_from") else "program"


def scale_table(rows: list[dict], time_limit: float, workers: int) -> Table:
    """The rows of :func:`scale_rows` as a table."""
    table = Table(title=f"cpsat at scale: {time_limit:g} s limit, {workers} workers")
    for col in ("graph", "nodes", "ratio", "lns", "best fast plan %", "dtr %", "status", "order", "first s", "cpsat %",
                "vs best", "vs dtr", "bound %", "bound by", "gap %", "lns windows (improved)", "wall s", "over limit s",
                "RSS GiB", "reason"):
        table.add_column(col, justify="right")
    for row in rows:
        st, best = row["stats"], row["best_heuristic"]
        ours = st.get("overhead")
        versus = "" if ours is None or best is None or not best[0] else f"{ours / best[0]:.2f}x"
        dtr = row.get("dtr")
        vs_dtr = "" if ours is None or not dtr else f"{ours / dtr:.2f}x"
        ran = st.get("lns")  # LNS's windows, when it ran
        # the whole-space bound as an overhead (its cost over the base cost, as cpsat % is)
        bound = None if st.get("best_bound") is None or not st.get("base_cost") else st["best_bound"] / st["base_cost"]
        table.add_row(row["graph"], f"{row['nodes']:,}", f"{row['ratio']:g}", row.get("lns", "auto"),
                      "" if best is None else f"{100 * best[0]:.3f} ({best[1]})",
                      "" if dtr is None else f"{100 * dtr:.3f}", verdict(st), _space(st),
                      _secs(st.get("time_to_first_s")), "" if ours is None else f"{100 * ours:.3f}", versus, vs_dtr,
                      "" if bound is None else f"{100 * bound:.3f}", str(st.get("bound_by") or ""),
                      _pct(st.get("gap")), "" if not ran else f"{ran['windows']} ({ran['improved']})",
                      f"{row['wall_s']:.1f}", f"{row['over_limit_s']:+.1f}",
                      f"{row['rss_gib']:.2f}", (st.get("reason") or "")[:60])
    return table


# The graphs of the bounds benchmark (issue 24): the published random
# layered graph of 250 nodes, Moccasin-style ones of 500 and 1,000, the
# 2-layer decoder of instances/ and the 48-layer one.
BOUNDS_GRAPHS = ("random_layered_n250", "random_layered_n500", "random_layered_n1000", "gpt_l2_w64", "gpt48")


def bench_graph(name: str, folder: Path) -> Path:
    """A benchmark graph by name: a scale instance (made in ``folder`` on
    first use), a published node-link graph (../shared/benchmarks), one of
    instances/, or a path."""
    if name in SCALE:
        return scale_graph(name, folder)
    for path in (PUBLISHED / f"{name}.json", REPO / "instances" / f"{name}.json", Path(name)):
        if path.is_file():
            return path
    from ..errors import RematoptError

    raise RematoptError(f"bench bounds: no graph {name!r} (a scale instance, a published graph, one of "
                        "instances/, or a file)")


def bounds_rows(names: tuple[str, ...], ratios: tuple[float, ...], time_limit: float, bound_limit: float,
                workers: int, folder: Path, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Per graph and budget ratio: cpsat's plan, bound (``bound_by``) and
    gap in ``time_limit``, and each bound of the table (``staged.bounds``)
    asked alone for ``bound_limit`` seconds (value in cost units, seconds,
    status) over the staged space cpsat searched (its order), all in the
    same process; each row told to ``progress`` as it is done."""
    from ..planners.staged.bounds import BOUNDS, bound
    from ..planners.staged.order import in_order_of
    from ..reference import resolve_budget
    from ..solve import solve

    rows = []
    for name in names:
        graph = load_graph(bench_graph(name, folder))
        base = sum(graph.cost[i] for i in graph.compute_ids)
        for ratio in ratios:
            budget = resolve_budget(graph, ratio=ratio, check=False)
            began = time.perf_counter()
            sol = solve(graph, "cpsat", budget=budget, check_budget=False, time_limit=time_limit, workers=workers,
                        lp_bound=False)
            row = {"graph": Path(name).stem, "nodes": graph.n, "ratio": ratio, "base": base, "stats": sol.plan.stats,
                   "wall_s": time.perf_counter() - began, "bounds": {}}
            space = in_order_of(graph, sol.plan) if sol.plan.stats.get("order_from") else graph
            for level in BOUNDS:
                r = bound(space, budget, level, time_limit=bound_limit, workers=workers)
                row["bounds"][level] = (r.status, r.value, r.seconds)
            rows.append(row)
            if progress:
                progress(f"{row['graph']} at {ratio:g}: cpsat {_pct(sol.plan.stats.get('gap'))}% gap, "
                         f"{row['wall_s']:.0f} s")
    return rows


def bounds_table(rows: list[dict], time_limit: float, bound_limit: float, workers: int) -> Table:
    """The rows of :func:`bounds_rows`: overheads and bounds as % of the base cost."""
    from ..planners.staged.bounds import BOUNDS

    table = Table(title=f"whole-space bounds: cpsat {time_limit:g} s, each bound alone {bound_limit:g} s, "
                        f"{workers} workers (% of the base cost; seconds)")
    for col in ("graph", "nodes", "ratio", "order", "cpsat %", "bound %", "bound by", "gap %", *BOUNDS, "wall s"):
        table.add_column(col, justify="right")
    for row in rows:
        st, base = row["stats"], row["base"]
        pct = lambda x: "" if x is None else f"{100 * x / base:.3f}"  # noqa: E731
        cells = []
        for level in BOUNDS:
            status, value, seconds = row["bounds"][level]
            cells.append(status if value is None else f"{pct(value)} ({seconds:.0f} s{'' if status == 'OPTIMAL' else ', ' + status.lower()})")
        table.add_row(row["graph"], f"{row['nodes']:,}", f"{row['ratio']:g}", _space(st), pct(st.get("objective")),
                      pct(st.get("best_bound")), str(st.get("bound_by") or ""), _pct(st.get("gap")), *cells,
                      f"{row['wall_s']:.1f}")
    return table
