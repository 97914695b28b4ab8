"""cpsat's gaps on the traced graphs of ``instances/`` against the compiled
graphs of the same models (issue 35: the compiled graph is a smaller problem).

Run from the repository root (the models are in ``models/``):
``python -m rematopt.studies.compiled_gaps OUT.md [--limit S] [--deterministic-time D] [STEM ...]``.
Each instance's ``meta`` names its model and full config; the model is traced
again with ``fuse="xla"`` under XLA's memory-minimizing CPU scheduler, and
the graphs (that one also in the eager order) are solved by ``cpsat`` at each ratio of that graph's own no-remat
peak, one worker each, one after another. With ``--deterministic-time``
each solve is bounded by CP-SAT's deterministic time (cpsat's rounds and LNS
take shares of it), so two runs give the same rows whatever the machine's
load, the wall-clock ``--limit`` still ending a solve that outlasts it (its
row then says so: ``stopped_by``); without it (the default, as the page in
docs/xla.md was measured) by the wall clock alone, and the page records the
limit and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from ..errors import BudgetError
from ..graph import Graph
from ..importers import load as load_graph
from ..reference import no_remat_peak, peak_lower_bound
from ..reorder import eager
from ..solve import solve

RATIOS = (0.8, 0.6)
# Seconds per solve, one worker: 78 solves (13 instances, 3 graphs, 2 ratios),
# most compiled ones refused below the floor, took 13 minutes of one core
# (docs/xla.md, "cpsat on the compiled graphs").
LIMIT_S = 20.0
# floor: the cheap peak lower bound (working set, resident inputs) as a ratio
# of the no-remat peak; a budget ratio under it is not solved.
FIELDS = ("instance", "graph", "nodes", "floor", "ratio", "status", "claim", "gap", "overhead", "seconds",
          "stopped_by")


def compiled_graph(traced: Graph) -> Graph:
    """The model of a traced instance, traced again with ``fuse="xla"`` at the
    config its ``meta`` records (CPU: the memory-minimizing scheduler)."""
    from ..jax import load_factory, trace_grad
    from ..xla.flags import CPU_VERIFY, apply

    apply(CPU_VERIFY)
    meta = traced.meta
    fn, args = load_factory(meta["model"], **meta["config"])
    return trace_grad(fn, *args, name=f"{traced.name}_xla", fuse="xla", device=meta.get("device", "a100"),
                      meta={"model": meta["model"], "config": meta["config"]})


def solve_row(instance: str, kind: str, graph: Graph, ratio: float, limit: float,
              work: float | None = None) -> dict[str, Any]:
    """One cpsat solve, one worker, replayed by :func:`~rematopt.solve.solve`,
    within ``limit`` wall seconds and ``work`` deterministic ones (None:
    the wall clock alone); a budget below the graph's cheap lower bound is
    not solved, and says so."""
    row = {"instance": instance, "graph": kind, "nodes": graph.n,
           "floor": round(peak_lower_bound(graph) / no_remat_peak(graph), 3), "ratio": ratio}
    try:
        s = solve(graph, "cpsat", budget_ratio=ratio, time_limit=limit, deterministic_time=work, workers=1, seed=0)
    except BudgetError:
        return {**row, "status": "below the lower bound", "claim": None, "gap": None, "overhead": None,
                "seconds": 0.0, "stopped_by": None}
    st = s.plan.stats
    claim = next((f"{k.split('_')[0]} in {st[k]}" for k in ("optimal_in", "infeasible_in") if st.get(k)), None)
    return {**row, "status": s.status, "claim": claim, "gap": st.get("gap"),
            "overhead": s.replay.overhead if s.has_plan else None, "seconds": round(s.wall_s, 1),
            "stopped_by": st["stopped_by"]}


def rows(paths: Iterable[Path], ratios: Iterable[float] = RATIOS, limit: float = LIMIT_S,
         work: float | None = None) -> list[dict[str, Any]]:
    """Traced, compiled, and compiled in the eager order (what the closed loop
    also plans in: :func:`~rematopt.reorder.eager`) rows for each instance
    file that names a model (``meta.model``); the ``*_fused`` files are the
    traced graph fused by the table, not another model, and are skipped."""
    out = []
    for path in paths:
        traced = load_graph(path)
        if "model" not in traced.meta or traced.meta.get("fuse"):
            continue
        compiled = compiled_graph(traced)
        for kind, g in (("traced", traced), ("compiled", compiled), ("compiled, eager", eager(compiled))):
            for r in ratios:
                out.append(solve_row(path.stem, kind, g, r, limit, work))
                print(*(out[-1][k] for k in FIELDS), sep="\t", file=sys.stderr, flush=True)
    return out


def _cell(key: str, v: Any) -> str:
    if v is None:
        return ""
    if key in ("gap", "overhead"):
        return f"{100 * v:.1f}%"
    return f"{v:,}" if isinstance(v, int) else str(v)


def markdown(table: list[dict[str, Any]], limit: float, work: float | None = None) -> str:
    """The rows as a markdown table, headed by how the work was bounded."""
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    bounded = f"{limit:g} s wall-clock limit" if work is None else (
        f"{work:g} s of CP-SAT's deterministic time (the wall-clock limit, {limit:g} s, ending a solve first "
        "where stopped_by says time_limit)")
    head = (f"cpsat, {bounded}, 1 worker, seed 0, solves in sequence; "
            f"load average at the end {load} on {os.cpu_count()} cores.\n\n")
    lines = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(_cell(k, r[k]) for k in FIELDS) + " |" for r in table]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rematopt.studies.compiled_gaps", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="markdown file to write")
    ap.add_argument("stems", nargs="*", help="instance stems (default: every instance naming a model)")
    ap.add_argument("--limit", type=float, default=LIMIT_S, help="wall-clock seconds per cpsat solve")
    ap.add_argument("--deterministic-time", type=float, default=None,
                    help="CP-SAT's deterministic seconds per solve: rows that do not depend on the machine's load "
                         "(default: the wall clock alone)")
    ap.add_argument("--instances", type=Path, default=Path("instances"))
    a = ap.parse_args(argv)
    paths = [a.instances / f"{s}.json" for s in a.stems] if a.stems else sorted(a.instances.glob("*.json"))
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"error: {missing[0]}: no such instance file", file=sys.stderr)
        return 2
    if "" not in sys.path:
        sys.path.insert(0, "")  # models/ of the checkout
    work = a.deterministic_time
    if work is not None and not work >= 0:
        print(f"error: --deterministic-time must be >= 0, got {work}", file=sys.stderr)
        return 2
    a.out.write_text(markdown(rows(paths, limit=a.limit, work=work), a.limit, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
