"""The policy benchmark: the best ``checkpoint_name`` policy against MaxText's
presets, JAX's stock policies and the unconstrained exact plan, per budget.

Every policy is judged the same way: the plan it implies
(:func:`~rematopt.planners.policies.space.policy_plan`), replayed by the
simulator. The presets are MaxText's ``remat_policy`` values over the names
``models/gpt.py`` carries (``minimal`` saves every named projection, as
``checkpoint_dots_with_no_batch_dims`` does there).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import PlanError
from ..graph import Graph
from ..planners import get
from ..planners.policies.presets import is_dot
from ..planners.policies.space import Space, policy_plan, saved_plan
from ..reference import no_remat_peak
from ..simulate import simulate

QKV = ("query_proj", "key_proj", "value_proj")
PROJECTIONS = QKV + ("out_proj", "mlpwi", "mlpwo")
# (offload, per_layer) -> column
SEARCHES = {(True, False): "best", (True, True): "best per layer",
            (False, False): "best, no offload", (False, True): "best per layer, no offload"}
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
        for (offload, per_layer), key in SEARCHES.items():
            p = get("jax-names")(graph, budget, {"offload": offload, "per_layer": per_layer, "price": False,
                                                 "time_limit": time_limit, "workers": workers})
            row[key] = _figures(graph, p, budget) if len(p) else None
            row[key + " status"] = p.stats["status"]
            row[key + " proven in"] = p.stats.get("optimal_in") or p.stats.get("infeasible_in")
        for name, fates in PRESETS.items():
            fates = {k: f for k, f in fates.items() if k in glob.groups}
            row[name] = _figures(graph, policy_plan(glob, fates, budget, "preset"), budget)
        row["dots_saveable"] = _figures(graph, saved_plan(graph, dots, [], budget, "dots_saveable"), budget)
        row["nothing_saveable"] = _figures(graph, saved_plan(graph, [], [], budget, "nothing_saveable"), budget)
        if cpsat_time_limit > 0:
            p = get("cpsat")(graph, budget, {"offload": True, "time_limit": cpsat_time_limit, "workers": workers,
                                          "lp_bound": False})
            row["cpsat"] = _figures(graph, p, budget) if len(p) else None
            row["cpsat_status"] = p.stats.get("status")
            row["cpsat proven in"] = p.stats.get("optimal_in") or p.stats.get("infeasible_in")
            base = simulate(graph, p).base_cost if len(p) else None
            bound = p.stats.get("best_bound")
            row["cpsat_bound"] = bound / base if bound is not None and base else None
        out.append(row)
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    """Two tables per graph (the searches and cpsat; the presets and JAX's
    policies), ``overhead / peak`` per cell."""
    searches = list(SEARCHES.values())
    fixed = [*PRESETS, "dots_saveable", "nothing_saveable"]
    has_cpsat = any("cpsat" in r for r in records)
    lines = []
    for graph in dict.fromkeys(r["graph"] for r in records):
        mine = [r for r in records if r["graph"] == graph]
        head = ["ratio", "budget B", *searches] + (["cpsat (unconstrained)", "cpsat bound"] if has_cpsat else [])
        lines += [f"### {graph}: the best policies", "", _row(head + ["target"]), _row(["---"] * (len(head) + 1))]
        for r in mine:
            cells = [str(r["ratio"]), f"{r['budget']:,}"] + [_cell(r[k], r[k + " status"], r[k + " proven in"])
                                                             for k in searches]
            if has_cpsat:
                cells += [_cell(r.get("cpsat"), r.get("cpsat_status"), r.get("cpsat proven in")),
                          _pct(r.get("cpsat_bound"))]
            lines.append(_row(cells + [_target(r)]))
        lines += ["", f"### {graph}: MaxText's presets and JAX's policies", "", _row(["ratio", *fixed]),
                  _row(["---"] * (len(fixed) + 1))]
        lines += [_row([str(r["ratio"])] + [_cell(r[k]) for k in fixed]) for r in mine]
        lines.append("")
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _target(r: dict[str, Any]) -> str:
    """met: each search fits and beats or ties every preset of its space that
    fits; where none fits, it fits whenever its space holds a plan (proven)."""
    verdicts = []
    for key, names in (("best", list(PRESETS)),
                       ("best, no offload", [n for n, f in PRESETS.items() if "offload" not in f.values()])):
        fitting = [r[n]["overhead"] for n in names if r[n]["fits"]]
        best = r[key]
        if fitting:
            verdicts.append(best is not None and best["overhead"] <= min(fitting) + 1e-12)
        else:
            verdicts.append(best is not None or bool(r[key + " proven in"]))
    return "met" if all(verdicts) else "MISSED"


def _cell(f: dict[str, Any] | None, status: str | None = None, proven: str | None = None) -> str:
    """A search's plan; ``proven``: where its optimality, or that none fits,
    is proven (``optimal_in`` / ``infeasible_in``: the policy space, cpsat's
    staged space, or all plans), shown as the plain figures or "proven"."""
    if f is None:
        return f"none fits (proven in {proven})" if proven else f"no plan ({status})"
    text = f"{_pct(f['overhead'])} / {f['peak']:,}"
    if not f["fits"]:
        return f"over budget ({text})"
    return text if status is None or proven else f"{text} ({status})"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"
