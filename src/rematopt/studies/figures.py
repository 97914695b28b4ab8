"""The report's figures (matplotlib, Agg, PNG). Each function draws one figure
from the results frame of :func:`rematopt.studies.report.load_results` and returns
``{"file", "title", "reading"}``, the reading being one sentence computed from
the same data, or None when there is nothing to draw."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

MARKERS = "os^Dv<>pPX*h"
STATUS_STYLE = {"OPTIMAL": ("o", "tab:green"), "FEASIBLE": ("s", "tab:orange"), "UNKNOWN": ("x", "tab:red"),
                "INFEASIBLE": ("v", "tab:purple"), "TIMEOUT": ("X", "black")}
HARDEST = 4  # instances drawn in the solver-progress figure


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display): every figure of the studies draws with it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_figures(df: pd.DataFrame, results_dir: Path, out: Path) -> list[dict[str, str]]:
    figs = [pareto(df, out), proven_curve(results_dir, out), gaps(df, out), exact_time(df, out),
            solver_progress(df, results_dir, out)]
    return [f for f in figs if f]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (peak, overhead) points, peak ascending, overhead descending."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def pareto(df: pd.DataFrame, out: Path) -> dict[str, str] | None:
    ok = df[df["meets"]]
    if ok.empty:
        return None
    plt = pyplot()
    graphs = sorted(ok["graph"].unique())
    planners = sorted(df["planner"].unique())
    cols = min(3, len(graphs))
    rows = math.ceil(len(graphs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    on_front: dict[str, int] = {p: 0 for p in planners}
    for ax, graph in zip(axes.flat, graphs):
        g = ok[ok["graph"] == graph]
        x = g["peak_bytes"] / g["no_remat_peak_bytes"]
        y = 100 * g["overhead"]
        for k, planner in enumerate(planners):
            sel = (g["planner"] == planner).to_numpy()
            if sel.any():
                ax.scatter(x[sel], y[sel], marker=MARKERS[k % len(MARKERS)], color=f"C{k % 10}", s=36,
                           alpha=0.8, label=planner)
        front = pareto_front(list(zip(x, y)))
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", lw=0.8)
        for px, py in front:
            winners = g[(np.isclose(x, px)) & (np.isclose(y, py))]["planner"].unique()
            for w in winners:
                on_front[w] += 1
        wsb = g["working_set_bound_bytes"].iloc[0] / g["no_remat_peak_bytes"].iloc[0]
        ax.axvline(wsb, color="grey", ls=":", lw=0.8)
        ax.set_title(graph, fontsize=9)
        ax.set_yscale("symlog", linthresh=1)  # 0.1% and 1000% on one axis
        ax.set_ylim(bottom=0, top=max(2.0, 1.5 * y.max()))
        ax.set_xlabel("peak / no-remat peak", fontsize=8)
        ax.set_ylabel("overhead % (symlog)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(graphs):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)
    best = max(on_front, key=on_front.get)
    return {"file": "pareto.png", "title": "Peak / overhead Pareto frontier per graph",
            "reading": f"Each panel plots every plan within budget (peak as a fraction of the no-remat peak "
                       f"against recompute overhead; the dotted line is the working-set bound, the black step "
                       f"the frontier); {best} contributes the most frontier points ({on_front[best]} over "
                       f"{len(graphs)} graphs)."}


CURVE = "pareto_curve.csv"  # written by ``rematopt pareto --out DIR``


def proven_curve(results_dir: Path, out: Path) -> dict[str, str] | None:
    """cpsat's peak at each overhead cap (``rematopt pareto``), each point
    with a bar down to its proven lower bound (filled: proven optimal), and
    the heuristics' plans beside it."""
    path = results_dir / CURVE
    if not path.exists():
        return None
    df = pd.read_csv(path)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ex = df[df["planner"] == "cpsat"].sort_values("overhead")
    mb = 1 / 2**20
    proven = ex["optimal_in"].notna().to_numpy()  # over all plans, or at least the staged space
    ax.step(100 * ex["overhead"], ex["peak_bytes"] * mb, where="post", color="black", lw=0.8)
    ax.vlines(100 * ex["overhead"], ex["bound_bytes"] * mb, ex["peak_bytes"] * mb, color="black", lw=2, alpha=0.4)
    ax.scatter(100 * ex["overhead"][proven], ex["peak_bytes"][proven] * mb, color="black", s=40,
               label="cpsat, proven (in the staged space at least)", zorder=3)
    ax.scatter(100 * ex["overhead"][~proven], ex["peak_bytes"][~proven] * mb, facecolors="white",
               edgecolors="black", s=40, label="cpsat, bar to its bound", zorder=3)
    heur = df[df["planner"] != "cpsat"]
    for k, planner in enumerate(sorted(heur["planner"].unique())):
        h = heur[heur["planner"] == planner]
        ax.scatter(100 * h["overhead"], h["peak_bytes"] * mb, marker=MARKERS[k % len(MARKERS)],
                   color=f"C{k % 10}", s=30, alpha=0.8, label=planner, zorder=4)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("overhead % (symlog)")
    ax.set_ylabel("peak (MiB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pareto_curve.png", dpi=110)
    plt.close(fig)
    graph = str(df["graph"].iloc[0]) if "graph" in df else ""
    worst = ex["gap"].fillna(0).max()
    return {"file": "pareto_curve.png", "title": f"Lowest peak at each overhead cap, {graph}",
            "reading": f"{int(proven.sum())} of {len(ex)} cpsat points are proven optimal in the staged space "
                       f"(largest gap {100 * worst:.1f}%); {len(heur)} heuristic plans beside them."}


def gaps(df: pd.DataFrame, out: Path) -> dict[str, str] | None:
    heur = df[~df["exact"] & df["gap_to_ref"].notna()]
    if heur.empty:
        return None
    plt = pyplot()
    planners = sorted(heur["planner"].unique())
    data = [100 * heur.loc[heur["planner"] == p, "gap_to_ref"].to_numpy() for p in planners]
    fig, ax = plt.subplots(figsize=(1.4 * len(planners) + 3, 3.6))
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(planners) + 1), planners, fontsize=8)
    rng = np.random.default_rng(0)  # jitter only
    for k, d in enumerate(data, start=1):
        proven = heur.loc[heur["planner"] == planners[k - 1], "ref_kind"].to_numpy() == "optimum"
        xs = k + rng.uniform(-0.15, 0.15, len(d))
        ax.scatter(xs[proven], d[proven], s=12, color="tab:blue", label="vs optimum" if k == 1 else None)
        ax.scatter(xs[~proven], d[~proven], s=12, color="tab:grey", marker="^",
                   label="vs bound" if k == 1 else None)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("gap % (symlog)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gaps.png", dpi=110)
    plt.close(fig)
    med = {p: float(np.median(d)) for p, d in zip(planners, data)}
    best = min(med, key=med.get)
    n_opt = int((heur["ref_kind"] == "optimum").sum())
    return {"file": "gaps.png", "title": "Gap of each heuristic to the optimum or best bound",
            "reading": f"Lowest median gap: {best} at {med[best]:.2f}% "
                       f"({', '.join(f'{p} {m:.2f}%' for p, m in med.items())}); {n_opt} of {len(heur)} "
                       f"plans are measured against a proven optimum, the rest against a bound (an upper "
                       f"estimate of the gap)."}


def exact_time(df: pd.DataFrame, out: Path) -> dict[str, str] | None:
    ex = df[df["exact"]].copy()
    if "job_s" in ex:  # a killed job has no solver time, only the time it was given
        ex["wall_s"] = ex["wall_s"].fillna(pd.to_numeric(ex["job_s"], errors="coerce"))
    ex = ex[ex["wall_s"].notna() & ~ex["status"].isin(["SKIPPED", "INFEASIBLE_BUDGET"])]
    if ex.empty:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for status, g in ex.groupby("status"):
        marker, color = STATUS_STYLE.get(status, ("d", "tab:grey"))
        ax.scatter(g["nodes"], g["wall_s"], marker=marker, color=color, label=f"{status} ({len(g)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("graph nodes")
    ax.set_ylabel("solver wall time, s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "exact_time.png", dpi=110)
    plt.close(fig)
    opt = ex[ex["optimal_in"].notna()]
    largest = f", the largest with {int(opt['nodes'].max())} nodes" if len(opt) else ""
    largest += f"; {int((ex['status'] == 'OPTIMAL').sum())} of them over all plans, the others over the staged space"
    space = ex.get("stats", pd.Series(index=ex.index, dtype=object)).map(_stats).map(lambda d: d.get("space_status"))
    sub = int((ex["optimal_in"].isna() & (space == "OPTIMAL")).sum())
    if sub:
        largest += f" (and {sub} more optimal within the restricted plan space it solved)"
    return {"file": "exact_time.png", "title": "Exact-solver time against graph size",
            "reading": f"The exact planner proved {len(opt)} of {len(ex)} instances optimal{largest}; "
                       f"median time {ex['wall_s'].median():.1f} s, longest {ex['wall_s'].max():.1f} s."}


def read_solver_log(path: Path) -> pd.DataFrame | None:
    """A solver log (CSV) as columns ``time``, ``incumbent``, ``bound``;
    None when the file is missing or its columns are not recognisable."""
    try:
        log = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    cols = {c.lower(): c for c in log.columns}

    def pick(*words):
        return next((cols[c] for c in cols for w in words if w in c), None)

    t, inc, bnd = pick("time", "wall", "elapsed"), pick("incumbent", "objective", "best", "cost"), pick("bound")
    if not (t and inc and bnd) or inc == bnd:
        return None
    if "phase" in cols:  # cpsat's peak search and tie-break optimise other figures
        log = log[log[cols["phase"]].astype(str) == "primary"]
    frame = log[[t, inc, bnd]].apply(pd.to_numeric, errors="coerce").dropna(subset=[t])
    frame.columns = ["time", "incumbent", "bound"]
    frame[["incumbent", "bound"]] = frame[["incumbent", "bound"]].ffill()  # bound-only rows keep the incumbent
    return frame if frame["incumbent"].notna().any() else None


def _stats(text: Any) -> dict[str, Any]:
    """A row's planner stats (JSON text in the results)."""
    try:
        stats = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return stats if isinstance(stats, dict) else {}


def with_final_point(log: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The solver reports no bound event when it proves optimality, so end the
    trace at the row's own objective and bound (at the primary solve's end)."""
    stats = _stats(row.get("stats"))
    # The trace is of the space the solver searched: end it at that space's bound.
    bound = stats.get("space_bound") if stats.get("space_bound") is not None else row.get("bound")
    if bound is None or pd.isna(bound) or stats.get("objective") is None:
        return log
    end = max(float(stats.get("primary_s") or 0.0), float(log["time"].max()))
    return pd.concat([log, pd.DataFrame({"time": [end], "incumbent": [float(stats["objective"])],
                                         "bound": [float(bound)]})], ignore_index=True)


def solver_progress(df: pd.DataFrame, results_dir: Path, out: Path) -> dict[str, Any] | None:
    ex = df[df["exact"] & df.get("log_path", pd.Series(index=df.index, dtype=object)).notna()]
    logs = []
    for _, row in ex.sort_values("wall_s", ascending=False).iterrows():
        path = Path(row["log_path"])
        log = read_solver_log(path if path.is_absolute() else results_dir / path)
        if log is not None:
            logs.append((row, with_final_point(log, row)))
    # Hardest: not proven optimal first, then the longest runs.
    logs.sort(key=lambda rl: (rl[0]["status"] == "OPTIMAL", -(rl[0]["wall_s"] or 0)))
    logs = logs[:HARDEST]
    if not logs:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(logs), figsize=(4.2 * len(logs), 3.2), squeeze=False)
    finals = []
    for ax, (row, log) in zip(axes.flat, logs):
        ax.step(log["time"], log["incumbent"], where="post", label="incumbent")
        ax.step(log["time"], log["bound"], where="post", label="bound")
        space = _stats(row.get("stats")).get("space")
        ax.set_title(f"{row['graph']} r={row['budget_ratio']:g} ({row['status']}"
                     + (f", {space} space)" if space else ")"), fontsize=8)
        ax.set_xlabel("s", fontsize=8)
        ax.set_ylabel("objective", fontsize=8)
        ax.tick_params(labelsize=7)
        last = log.dropna().iloc[-1] if len(log.dropna()) else None
        if last is not None and last["incumbent"]:
            finals.append((row["graph"], row["budget_ratio"], (last["incumbent"] - last["bound"]) / abs(last["incumbent"])))
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "solver_progress.png", dpi=110)
    plt.close(fig)
    worst = max(finals, key=lambda f: f[2], default=None)
    tail = (f"; the widest final gap is {100 * worst[2]:.2f}% on {worst[0]} at r={worst[1]:g}" if worst else "")
    return {"file": "solver_progress.png", "title": "CP-SAT incumbent and bound over time, hardest instances",
            "reading": f"Incumbent (upper) and bound (lower) of the exact solver's objective on the "
                       f"{len(logs)} hardest instance{'s' if len(logs) > 1 else ''} with a solver log, in the plan "
                       f"space it searched{tail}."}
