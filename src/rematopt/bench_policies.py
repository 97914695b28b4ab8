"""The policy benchmark: the best ``checkpoint_name`` policy against MaxText's
presets, JAX's stock policies and the unconstrained exact plan, per budget.

Every policy is judged the same way: the plan it implies
(:func:`~rematopt.planners.name_policy.policy_plan`), replayed by the
simulator. The presets are MaxText's ``remat_policy`` values over the names
``models/gpt.py`` carries (``minimal`` saves every named projection, as
``checkpoint_dots_with_no_batch_dims`` does there).
"""

from __future__ import annotations

import math
from typing import Any

from .errors import PlanError
from .graph import Graph
from .planners import get
from .planners.jax_policies import is_dot
from .planners.name_policy import Space, policy_plan, saved_plan
from .reference import no_remat_peak
from .simulate import simulate

QKV = ("query_proj", "key_proj", "value_proj")
PROJECTIONS = QKV + ("out_proj", "mlpwi", "mlpwo")
PRESETS: dict[str, dict[str, str]] = {
    "full": {},
    "save_out_proj": {"out_proj": "device"},
    "save_qkv_proj": {n: "device" for n in QKV},
    "save_dot_except_mlp": {n: "device" for n in QKV + ("out_proj",)},
    "save_dot_except_mlpwi": {n: "device" for n in QKV + ("out_proj", "mlpwo")},
    "minimal": {n: "device" for n in PROJECTIONS},
    "qkv_proj_offloaded": {n: "offload" for n in QKV},
    "minimal_offloaded": {n: "offload" for n in PROJECTIONS},
}


def _figures(graph: Graph, plan, budget: int) -> dict[str, Any]:
    r = simulate(graph, plan)
    if not r.valid:  # every plan here is built to be valid; the replay is the judge
        raise PlanError(f"{graph.name}: {plan.planner} plan invalid at event {r.error_event}: {r.error}")
    return {"overhead": r.overhead, "peak": r.peak_bytes, "fits": r.peak_bytes <= budget,
            "transfer": r.transfer_bytes}


def rows(graph: Graph, ratios: list[float], time_limit: float, cpsat_time_limit: float,
         workers: int = 2) -> list[dict[str, Any]]:
    """One record per ratio: every policy's figures (None: no plan)."""
    ref = no_remat_peak(graph)
    glob = Space(graph, False)
    dots = [v.id for v in graph.nodes if v.phase == "forward" and is_dot(v.op)]
    out = []
    for ratio in ratios:
        budget = math.floor(ratio * ref)
        row: dict[str, Any] = {"graph": graph.name, "ratio": ratio, "budget": budget}
        for per_layer in (False, True):
            p = get("jax-names")(graph, budget, {"offload": True, "per_layer": per_layer, "price": False,
                                                 "time_limit": time_limit, "workers": workers})
            key = "best per layer" if per_layer else "best"
            row[key] = _figures(graph, p, budget) if len(p) else None
            if row[key] is not None:
                row[key]["status"] = p.stats["status"]
        for name, fates in PRESETS.items():
            fates = {k: f for k, f in fates.items() if k in glob.groups}
            row[name] = _figures(graph, policy_plan(glob, fates, budget, "preset"), budget)
        row["dots_saveable"] = _figures(graph, saved_plan(graph, dots, [], budget, "dots_saveable"), budget)
        row["nothing_saveable"] = _figures(graph, saved_plan(graph, [], [], budget, "nothing_saveable"), budget)
        if cpsat_time_limit > 0:
            p = get("cpsat")(graph, budget, {"offload": True, "time_limit": cpsat_time_limit, "workers": workers})
            row["cpsat"] = _figures(graph, p, budget) if len(p) else None
            row["cpsat_status"] = p.stats.get("status")
            base = simulate(graph, p).base_cost if len(p) else None
            bound = p.stats.get("best_bound")
            row["cpsat_bound"] = bound / base if bound is not None and base else None
        out.append(row)
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    """One table per graph: a column per policy, ``overhead / peak`` per cell."""
    names = ["best", "best per layer", *PRESETS, "dots_saveable", "nothing_saveable"]
    has_cpsat = any("cpsat" in r for r in records)
    lines = []
    for graph in dict.fromkeys(r["graph"] for r in records):
        lines += [f"### {graph}", "", "| ratio | budget B | " + " | ".join(names)
                  + (" | cpsat (unconstrained) | cpsat bound" if has_cpsat else "") + " | target |",
                  "|" + " --- |" * (len(names) + 3 + 2 * has_cpsat)]
        for r in (r for r in records if r["graph"] == graph):
            cells = [_cell(r[n]) for n in names]
            if has_cpsat:
                cells += [_cell(r.get("cpsat")) + (f" ({r['cpsat_status']})" if r.get("cpsat") else ""),
                          _pct(r.get("cpsat_bound"))]
            lines.append(f"| {r['ratio']} | {r['budget']:,} | " + " | ".join(cells) + f" | {_target(r)} |")
        lines.append("")
    return "\n".join(lines)


def _target(r: dict[str, Any]) -> str:
    """met: the found policy fits and beats or ties every preset that fits;
    where none fits, it fits whenever the policy space holds a plan."""
    fitting = [r[n]["overhead"] for n in PRESETS if r[n]["fits"]]
    best = r["best"]
    if fitting:
        return "met" if best is not None and best["overhead"] <= min(fitting) + 1e-12 else "MISSED"
    return "met (no preset fits)" if best is not None else "met (no policy fits: proven)"


def _cell(f: dict[str, Any] | None) -> str:
    if f is None:
        return "no policy fits"
    text = f"{_pct(f['overhead'])} / {f['peak']:,}"
    return text if f["fits"] else f"over budget ({text})"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"
