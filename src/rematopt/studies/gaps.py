"""``rematopt study gaps``: every heuristic certified against cpsat's bound.

One batch (:mod:`.batch`) runs every registered planner over the published
graphs, ``instances/`` and the 48-layer decoders at budget ratios 0.9-0.5;
the report then holds each heuristic's plan against the whole-space lower
bound cpsat reports for the same (graph, budget) (its ``best_bound``, on the
recompute cost: the objective without offload) and against cpsat's own plan:

- **excess <=** ``(h - bound) / h``, h the heuristic's recompute cost from its
  replay: at most this share of what it recomputes is avoidable by a staged
  plan (the issue's "at most Y% above optimal", on the recompute cost);
- **excess >=** ``(h - cpsat) / h``: at least this share is, as cpsat's plan
  shows;
- **step <=** ``(compute cost - (base + bound)) / (base + bound)``: the whole
  step costs at most this much more than the optimum's.

The bound holds for every plan in cpsat's staged space (first computations
in program order, each stage computing a node at most once and in program
order; docs/cpsat.md, "The plan space"; on graphs where cpsat searched the
order of an outside plan's first computations, ``order_from``, that order)
without host transfers, so every
figure compares a heuristic with the best staged plan. A plan outside that
space (xla-remat moves a value's first computation later; dtr may recompute
a value twice in a stage) can cost less than the bound: it is listed, not
counted; a staged plan below it would be a wrong bound, and the report says
so first. Plans with host transfers are listed too (cpsat runs without
offload here). Every figure is read from a
replay the batch recorded and a bound cpsat reported; none is typed in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from ..graph import Graph
from ..importers import load as load_graph
from ..plan import Plan
from ..planners.staged.order import in_order_of, in_staged_space
from .batch import BatchPlan, GraphInput, plan_batch
from .report import load_results, page_html, to_markdown

REFERENCE = "no-remat"  # the plan every ratio is measured from: not a heuristic
SOURCES = ("../shared/benchmarks/nodelink", "instances")
DECODERS = ("gpt48", "gpt48_fused")
RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5)
MEETS = ("OPTIMAL", "FEASIBLE")


# -- running ---------------------------------------------------------------------------


def graph_paths(paths: Iterable[str | Path], decoders: Iterable[str], folder: Path,
                warn: Callable[[str], None]) -> list[Path]:
    """The graph files and folders that exist, and the decoders (made in
    ``folder`` with JAX on first use, as ``rematopt bench scale`` makes them);
    whatever is missing is skipped with a warning naming how to make it."""
    out = []
    for p in map(Path, paths):
        if p.exists():
            out.append(p)
        else:
            warn(f"skipped {p}: not found (the published graphs live outside the repository, in "
                 f"../shared/benchmarks; see shared/benchmarks/README.md)")
    for name in decoders:
        from .bench import SCALE, scale_graph

        if name not in SCALE:
            warn(f"skipped decoder {name!r}: not one of {', '.join(SCALE)}")
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            out.append(scale_graph(name, folder))
        except Exception as e:  # noqa: BLE001  (JAX missing or the model not on the path: skip, loudly)
            warn(f"skipped decoder {name}: {type(e).__name__}: {e} (it is traced from models/ with JAX: run from "
                 f"the checkout with the jax extra installed)")
    return out


def jobs(inputs: list[GraphInput], ratios: Iterable[float], results: Path, time_limit: float, resume: bool,
         timeout_margin: float, workers: int, deterministic_time: float | None = None) -> BatchPlan:
    """The study's batch: every available planner (the reference included, so
    the same results make ``reports/benchmarks``) on every graph and ratio;
    jax-names without its own cpsat run (``price``), which cpsat's rows give.
    ``deterministic_time``: cpsat's ``--deterministic-time`` (one worker), so
    that its bounds do not depend on the machine's load; None: the wall clock
    alone (the published report's runs)."""
    from .. import planners

    options = {"time_limit": time_limit, "price": False, "deterministic_time": deterministic_time}
    return plan_batch(inputs, planners.available(), list(ratios), results, options,
                      resume=resume, timeout_margin=timeout_margin, default_workers=workers)


# -- the tables ------------------------------------------------------------------------


def _stats(text: Any) -> dict[str, Any]:
    try:
        d = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def certified(df: pd.DataFrame, results: Path) -> pd.DataFrame:
    """One row per heuristic job, with cpsat's figures for the same (graph,
    budget) and the certified gaps (see the module docstring)."""
    df = df[df["planner"] != REFERENCE]
    key = ["graph_sha256", "budget_ratio"]
    cp = df[df["exact"]].drop_duplicates(key, keep="last").set_index(key)
    heur = df[~df["exact"] & (df["status"] != "SKIPPED")].copy()
    idx = pd.MultiIndex.from_frame(heur[key])

    def take(col: str) -> np.ndarray:
        return cp[col].reindex(idx).to_numpy() if col in cp else np.full(len(heur), np.nan)

    heur["cpsat_status"] = take("status")
    heur["bound"] = pd.to_numeric(pd.Series(take("bound"), index=heur.index), errors="coerce")
    cp_meets = pd.Series(take("meets"), index=heur.index).fillna(False).astype(bool)
    cp_rc = pd.to_numeric(pd.Series(take("recompute_cost"), index=heur.index), errors="coerce")
    heur["cpsat_meets"] = cp_meets
    heur["cpsat_recompute"] = cp_rc.where(cp_meets)
    heur["cpsat_overhead"] = pd.to_numeric(pd.Series(take("overhead"), index=heur.index), errors="coerce").where(
        cp_meets)
    cpsat_stats = pd.Series(take("stats"), index=heur.index).map(_stats)
    resolution = cpsat_stats.map(lambda d: float(d.get("cost_resolution") or 0.0))
    heur["recompute"] = pd.to_numeric(heur.get("recompute_cost"), errors="coerce")
    heur["transfers"] = pd.to_numeric(heur["transfer_bytes"], errors="coerce").fillna(0) > 0
    h, lb, base = heur["recompute"], heur["bound"], heur["base_cost"]
    tol = resolution + 1e-9 * base.abs()
    comparable = heur["meets"] & ~heur["transfers"] & lb.notna()
    below = comparable & (h < lb - tol)
    heur["below_bound"] = below
    # every compared plan's space: staged and below the bound, the bound is
    # wrong; outside it, excess <= speaks of the best staged plan, not the best
    heur["staged"] = None
    cp_plan = pd.Series(take("plan_path"), index=heur.index)
    for path, of_graph in heur[comparable].groupby("graph_file"):
        graph = load_graph(path)
        for _, rows in of_graph.groupby("budget_ratio"):
            space = _space(results, graph, cpsat_stats.loc[rows.index[0]], cp_plan.loc[rows.index[0]])
            heur.loc[rows.index, "staged"] = [_staged(results, space, p) for p in rows["plan_path"]]
    heur["wrong_bound"] = below & (heur["staged"] == True)  # noqa: E712  (None: no plan file to check)
    counted = comparable & ~below
    with np.errstate(divide="ignore", invalid="ignore"):
        hi = np.where(h > 0, (h - lb) / h, 0.0)
        lo = np.where(h > 0, np.maximum(0.0, (h - heur["cpsat_recompute"]) / h), 0.0)
        step = (heur["compute_cost"] - (base + lb)) / (base + lb)
    heur["excess_at_most"] = np.where(counted, np.maximum(hi, 0.0), np.nan)
    heur["excess_at_least"] = np.where(counted & heur["cpsat_recompute"].notna(), lo, np.nan)
    heur["step_at_most"] = np.where(counted, np.maximum(step, 0.0), np.nan)
    heur["counted"] = counted
    heur["outside"] = counted & (heur["staged"] == False)  # noqa: E712
    return heur


def _plan_file(results: Path, plan_path: Any) -> Path | None:
    if not isinstance(plan_path, str):
        return None
    plan_file = Path(plan_path) if Path(plan_path).is_absolute() else results / plan_path
    return plan_file if plan_file.exists() else None


def _space(results: Path, graph: Graph, stats: dict[str, Any], plan_path: Any) -> Graph:
    """The graph in the order of the staged space cpsat's bound covers: its
    own plan's order of first computations where it searched another order
    than the program's (``order_from``)."""
    plan_file = _plan_file(results, plan_path)
    if not stats.get("order_from") or plan_file is None:
        return graph
    return in_order_of(graph, Plan.load(plan_file))


def _staged(results: Path, graph: Graph, plan_path: Any) -> bool | None:
    """Whether the plan file lies in the staged space over ``graph.order``
    (None: no plan file)."""
    plan_file = _plan_file(results, plan_path)
    return None if plan_file is None else in_staged_space(graph, Plan.load(plan_file))


def _pct(x: float) -> float:
    return round(100 * x, 3) if pd.notna(x) else np.nan


def summary_table(c: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Per heuristic: how often it meets the budget, its certified excess,
    the budgets it misses that cpsat meets, its time."""
    out = []
    for planner, g in c.groupby("planner"):
        hi, lo, st = g["excess_at_most"].dropna(), g["excess_at_least"].dropna(), g["step_at_most"].dropna()
        out.append([planner, len(g), int(g["meets"].sum()), int(g["counted"].sum()),
                    _pct(hi.median()) if len(hi) else np.nan, _pct(hi.quantile(0.9)) if len(hi) else np.nan,
                    _pct(hi.max()) if len(hi) else np.nan, _pct(lo.median()) if len(lo) else np.nan,
                    _pct(st.median()) if len(st) else np.nan,
                    int(g["outside"].sum()), int((~g["meets"] & g["cpsat_meets"]).sum()),
                    int((g["below_bound"] & ~g["wrong_bound"]).sum()) + int((g["meets"] & g["transfers"]).sum()),
                    round(float(g["wall_s"].median()), 3), round(float(g["wall_s"].max()), 3)])
    ex = df[df["exact"]]
    out.append(["cpsat", len(ex), int(ex["meets"].sum()), int(ex["optimal_in"].notna().sum()),
                np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, 0, 0,
                round(float(ex["wall_s"].median()), 3) if len(ex) else np.nan,
                round(float(ex["wall_s"].max()), 3) if len(ex) else np.nan])
    cols = ["planner", "instances", "within budget", "certified", "median excess <= %", "p90 excess <= %",
            "worst excess <= %", "median excess >= %", "median step <= %", "certified outside staged space",
            "misses cpsat meets",
            "not covered", "median s", "max s"]
    return pd.DataFrame(out, columns=cols)


def rows_table(c: pd.DataFrame) -> pd.DataFrame:
    """Every certified row, largest upper bound first."""
    t = c[c["counted"]].sort_values(["planner", "excess_at_most"], ascending=[True, False])
    return pd.DataFrame({
        "planner": t["planner"], "graph": t["graph"], "ratio": t["budget_ratio"],
        "overhead %": (100 * t["overhead"]).round(4), "cpsat overhead %": (100 * t["cpsat_overhead"]).round(4),
        "bound % of base": (100 * t["bound"] / t["base_cost"]).round(4),
        "excess >= %": (100 * t["excess_at_least"]).round(3), "excess <= %": (100 * t["excess_at_most"]).round(3),
        "step <= %": (100 * t["step_at_most"]).round(3), "staged": t["staged"].map({True: "yes", False: "no"}),
        "cpsat status": t["cpsat_status"],
        "wall s": t["wall_s"].round(3)})


def misses_table(c: pd.DataFrame) -> pd.DataFrame:
    """Budgets a heuristic misses (or fails on) that cpsat meets."""
    t = c[~c["meets"] & c["cpsat_meets"]].sort_values(["graph", "budget_ratio", "planner"],
                                                      ascending=[True, False, True])
    return pd.DataFrame({
        "graph": t["graph"], "ratio": t["budget_ratio"], "planner": t["planner"], "status": t["status"],
        "peak / budget": (t["peak_bytes"] / t["budget"]).round(4),
        "cpsat overhead %": (100 * t["cpsat_overhead"]).round(4), "cpsat status": t["cpsat_status"]})


def uncovered_table(c: pd.DataFrame) -> pd.DataFrame:
    """Plans the bound does not speak of: with host transfers, or outside the
    staged space and below the bound (staged ones below it: a wrong bound)."""
    t = c[(c["meets"] & c["transfers"]) | c["below_bound"]]
    why = np.where(t["transfers"], "host transfers",
                   np.where(t["wrong_bound"], "WRONG BOUND: staged plan below it",
                            np.where(t["staged"] == False, "outside the staged space, below the bound",  # noqa: E712
                                     "below the bound, no plan file to check")))
    return pd.DataFrame({"planner": t["planner"], "graph": t["graph"], "ratio": t["budget_ratio"],
                         "recompute": t["recompute"], "bound": t["bound"], "transfer bytes": t["transfer_bytes"],
                         "why": why})


# -- figures ------------------------------------------------------------------------------


def gap_figure(c: pd.DataFrame, out: Path) -> dict[str, str] | None:
    from .figures import pyplot

    t = c[c["counted"]]
    if t.empty:
        return None
    plt = pyplot()
    planners = sorted(t["planner"].unique())
    hi = [100 * t.loc[t["planner"] == p, "excess_at_most"].to_numpy() for p in planners]
    lo = [100 * t.loc[t["planner"] == p, "excess_at_least"].dropna().to_numpy() for p in planners]
    fig, ax = plt.subplots(figsize=(1.3 * len(planners) + 3, 4.0))
    x = np.arange(1, len(planners) + 1)
    ax.boxplot(hi, positions=x + 0.18, widths=0.3, showfliers=False, patch_artist=True,
               boxprops={"facecolor": "#f4c7a1"}, medianprops={"color": "black"})
    ax.boxplot([d if len(d) else [np.nan] for d in lo], positions=x - 0.18, widths=0.3, showfliers=False,
               patch_artist=True, boxprops={"facecolor": "#a9cbe8"}, medianprops={"color": "black"})
    rng = np.random.default_rng(0)  # jitter only
    for k, (a, b) in enumerate(zip(lo, hi)):
        ax.scatter(x[k] - 0.18 + rng.uniform(-0.08, 0.08, len(a)), a, s=8, color="tab:blue", zorder=3)
        ax.scatter(x[k] + 0.18 + rng.uniform(-0.08, 0.08, len(b)), b, s=8, color="tab:red", zorder=3)
    ax.set_xticks(x, planners, fontsize=8, rotation=20)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("share of the heuristic's recompute cost, %")
    ax.plot([], [], "s", color="#a9cbe8", label="avoidable at least (cpsat's plan)")
    ax.plot([], [], "s", color="#f4c7a1", label="avoidable at most (cpsat's bound)")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(out / "gaps.png", dpi=110)
    plt.close(fig)
    med = {p: float(np.median(d)) for p, d in zip(planners, hi)}
    best = min(med, key=med.get)
    share = float(t.loc[t["planner"] == best, "outside"].mean())
    caveat = (f" {100 * share:.0f}% of {best}'s plans lie outside the staged space: there the upper bound says "
              "how much a staged plan could save, not how far the plan is from the best of all plans."
              if share else "")
    return {"file": "gaps.png", "title": "How much of each heuristic's recompute is avoidable",
            "reading": f"Per heuristic, over {len(t)} plans within budget that the bound covers: the share of its "
                       f"recompute cost that cpsat's plan avoids (blue, at least) and that the bound allows to "
                       f"avoid (red, at most). Lowest median upper bound: {best} at {med[best]:.1f}% "
                       f"({', '.join(f'{p} {m:.1f}%' for p, m in med.items())}).{caveat}"}


def time_figure(c: pd.DataFrame, df: pd.DataFrame, out: Path) -> dict[str, str] | None:
    from .figures import pyplot

    t = pd.concat([c[["planner", "wall_s"]], df[df["exact"]][["planner", "wall_s"]]]).dropna()
    if t.empty:
        return None
    plt = pyplot()
    planners = sorted(t["planner"].unique())
    data = [t.loc[t["planner"] == p, "wall_s"].clip(lower=1e-4).to_numpy() for p in planners]
    fig, ax = plt.subplots(figsize=(1.3 * len(planners) + 3, 3.6))
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(planners) + 1), planners, fontsize=8, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("planner wall time, s")
    fig.tight_layout()
    fig.savefig(out / "time.png", dpi=110)
    plt.close(fig)
    med = {p: float(np.median(d)) for p, d in zip(planners, data)}
    return {"file": "time.png", "title": "Time each planner took",
            "reading": "Median planner wall time per job (the planner alone, in its own process): "
                       + ", ".join(f"{p} {m:.2f} s" for p, m in med.items()) + "."}


# -- the report ------------------------------------------------------------------------------


def write(results: Path, out: Path, commands: list[str]) -> Path:
    """The gap study's tables, figures, ``index.md`` and ``index.html``."""
    df = load_results(results)
    out.mkdir(parents=True, exist_ok=True)
    c = certified(df, results)
    tables = {
        "summary": ("Per heuristic: certified excess, misses, time", summary_table(c, df)),
        "misses": ("Budgets a heuristic misses that cpsat meets", misses_table(c)),
        "certified": ("Every certified plan", rows_table(c)),
        "not_covered": ("Plans the bound does not cover", uncovered_table(c)),
    }
    for name, (_, table) in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
        (out / f"{name}.md").write_text(to_markdown(table))
    figures = [f for f in (gap_figure(c, out), time_figure(c, df, out)) if f]
    lines = summary_lines(c, df)
    (out / "index.md").write_text(_index_md(lines, tables, figures, commands))
    (out / "index.html").write_text(page_html("Certified gaps of the heuristics", lines, commands, figures,
                                              [(cap, t) for cap, t in tables.values()], out))
    return out / "index.md"


def summary_lines(c: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    ex = df[df["exact"]]
    bounded = ex["bound"].notna().sum()
    lines = [f"{df['graph'].nunique()} graphs x budget ratios "
             f"{', '.join(f'{r:g}' for r in sorted(df['budget_ratio'].unique(), reverse=True))}: "
             f"{len(c)} heuristic jobs ({c['planner'].nunique()} heuristics), {len(ex)} cpsat jobs "
             f"({int(ex['optimal_in'].notna().sum())} proven optimal in the staged space, "
             f"{int((ex['status'] == 'OPTIMAL').sum())} of them over all plans; {int(bounded)} with a bound).",
             f"{int(c['counted'].sum())} plans within budget are certified against the bound; "
             f"{int((~c['meets'] & c['cpsat_meets']).sum())} times a heuristic misses a budget cpsat meets."]
    wrong = c[c["wrong_bound"]]
    if len(wrong):
        lines.insert(0, f"WRONG BOUND: {len(wrong)} staged plans cost less than cpsat's bound: "
                        + "; ".join(f"{r.planner} on {r.graph} r={r.budget_ratio:g}" for r in wrong.itertuples()))
    beyond = c[c["outside"]].groupby("planner").size()
    if len(beyond):
        lines.append(f"{int(beyond.sum())} certified plans lie outside the staged space ("
                     + ", ".join(f"{p} {n}" for p, n in beyond.items()) + "): they reorder first computations or "
                     "recompute a value twice in a stage, so for them excess <= is how much a staged plan could "
                     "save, not a distance to the best plan of all.")
    outside = c[c["below_bound"] & ~c["wrong_bound"]]
    if len(outside):
        lines.append(f"{len(outside)} plans cost less than the bound but are not staged plans (not counted): "
                     + "; ".join(f"{r.planner} on {r.graph} r={r.budget_ratio:g}" for r in outside.itertuples()))
    return lines


EXPLAIN = ("h is a heuristic's recompute cost (compute cost - base cost) from the replay of its plan; bound is "
           "cpsat's best_bound for the same graph and budget, a lower bound on the recompute cost of every staged "
           "plan without host transfers (docs/cpsat.md, \"The plan space\"); cpsat is its own plan's recompute "
           "cost. excess <= (h - bound) / h: at most that share of the heuristic's recompute is avoidable by a "
           "staged plan; excess >= (h - cpsat) / h: at least that share is; step <= (compute cost - base - bound) "
           "/ (base + bound): the step costs at most that much more than the best staged plan's. Counted: plans "
           "within budget without transfers; 'not covered' lists plans with transfers and plans outside the staged "
           "space that cost less than the bound (a staged one there would be a wrong bound, named first). A counted "
           "plan outside the staged space (column 'staged': no) is compared with the best staged plan only: "
           "cpsat's bound says nothing of the plans it does not cover. Times "
           "are each planner's own wall time in its job.")


def _index_md(lines: list[str], tables: dict, figures: list[dict], commands: list[str]) -> str:
    parts = ["# Certified gaps of the heuristics\n", *(f"{line}\n" for line in lines),
             "\n## How it was made\n", "```bash\n" + "\n".join(commands) + "\n```\n", f"\n{EXPLAIN}\n",
             "\n## Figures\n"]
    for fig in figures:
        parts.append(f"\n### {fig['title']}\n\n![{fig['title']}]({fig['file']})\n\n{fig['reading']}\n")
    parts.append("\n## Tables\n")
    for name, (caption, table) in tables.items():
        parts.append(f"\n### {caption}\n\n[{name}.md]({name}.md) · [{name}.csv]({name}.csv)\n\n")
        parts.append(to_markdown(table) if len(table) <= 60 else f"({len(table)} rows: see {name}.md)\n")
    return "".join(parts)

