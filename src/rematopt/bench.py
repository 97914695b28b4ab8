"""Benchmarks that print tables (performance is measured here, never asserted
in tests). Ratios are against a baseline run in the same process."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from rich.table import Table

from .graph import Graph
from .importers.synthetic import chain
from .plan import Plan, PlanBuilder
from .simulate import simulate


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
