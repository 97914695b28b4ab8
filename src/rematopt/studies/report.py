"""``rematopt report``: tables, figures and an index from a batch's results.

Gaps are measured on the batch objective's figure against a reference per
(graph, budget): the exact planner's proven optimum where it has one
(``optimal_in``: over all plans, status OPTIMAL, or over its staged space,
which plans outside it may beat), else the best lower bound known. The figure is
the total cost (compute cost plus transfer cost, if the options price
transfers) under ``--objective overhead``, the peak under ``--objective
peak``. The exact planner's bound is on its objective (recompute plus
transfer cost, or the peak), so base cost + bound bounds the total cost; the
trivial bounds are the base cost and the working-set bound. Only plans that
meet the budget have a gap.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .batch import EXACT, RESULTS, read_rows, write_tables
from ..errors import RematoptError

MEETS = ("OPTIMAL", "FEASIBLE")  # statuses of a plan that meets its budget


# -- loading ------------------------------------------------------------------------


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """All rows of ``results.jsonl`` (else ``results.csv``) with derived
    columns: ``objective``, ``meets`` (a plan within budget), ``metric`` (the
    figure gaps are measured on), ``ref`` / ``ref_kind`` and ``gap_to_ref``."""
    results_dir = Path(results_dir)
    rows = read_rows(results_dir)
    if rows:
        df = pd.DataFrame(rows)
    elif (results_dir / "results.csv").exists():
        df = pd.read_csv(results_dir / "results.csv")
    else:
        raise RematoptError(f"{results_dir}: no results (expected {RESULTS} or results.csv from rematopt batch)")
    if df.empty:
        raise RematoptError(f"{results_dir}: the results table is empty")
    return add_references(df.drop_duplicates("key", keep="last"))  # a CSV of an older batch may hold a rerun job twice


def _options(options: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(options)
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _per_byte(options: dict[str, Any]) -> float:
    """Transfer cost per byte, as the planners read it from the options."""
    if options.get("host_bandwidth"):
        return 1.0 / float(options["host_bandwidth"])
    return float(options.get("transfer_cost_per_byte") or 0.0)


def add_references(df: pd.DataFrame) -> pd.DataFrame:
    """Derive the reference each row's gap is measured against (see module doc)."""
    df = df.copy()
    for col in ("peak_bytes", "budget", "compute_cost", "base_cost", "overhead", "bound", "wall_s",
                "working_set_bound_bytes", "no_remat_peak_bytes", "transfer_bytes", "nodes"):
        if col not in df:
            df[col] = np.nan
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # rows from before the field: their OPTIMAL spoke of the staged space
    known = df.get("optimal_in", pd.Series(None, index=df.index, dtype=object))
    df["optimal_in"] = known.where(known.notna() | (df["status"] != "OPTIMAL"), "staged space")
    options = df.get("options", pd.Series(index=df.index, dtype=object)).map(_options)
    df["objective"] = options.map(lambda o: o.get("objective") or "overhead")
    df["meets"] = df["status"].isin(MEETS) & (df["peak_bytes"] <= df["budget"])
    by_peak = (df["objective"] == "peak").to_numpy()
    total = df["compute_cost"] + options.map(_per_byte) * df["transfer_bytes"].fillna(0)
    df["metric"] = np.where(by_peak, df["peak_bytes"], total).astype(float)
    df.loc[~df["meets"], "metric"] = np.nan
    trivial = np.where(by_peak, df["working_set_bound_bytes"], df["base_cost"]).astype(float)
    df["exact"] = df["planner"].isin(EXACT)
    df["metric_bound"] = np.where(by_peak, df["bound"], df["base_cost"] + df["bound"])
    group = ["graph_sha256", "budget_ratio", "objective"]
    optimum = df[df["exact"] & df["optimal_in"].notna() & df["meets"]].groupby(group)["metric"].min()
    bound = df[df["exact"]].groupby(group)["metric_bound"].max()
    keys = pd.MultiIndex.from_frame(df[group])
    df["optimum"] = optimum.reindex(keys).to_numpy()
    df["ref_bound"] = np.fmax(bound.reindex(keys).to_numpy(), trivial)
    df["ref_bound"] = df.groupby(group)["ref_bound"].transform("max")
    has_opt = df["optimum"].notna()
    df["ref"] = np.where(has_opt, df["optimum"], df["ref_bound"])
    df["ref_kind"] = np.where(has_opt, "optimum", "bound")
    with np.errstate(divide="ignore", invalid="ignore"):
        df["gap_to_ref"] = np.where(df["ref"] > 0, (df["metric"] - df["ref"]) / df["ref"],
                                    np.where(df["metric"] == df["ref"], 0.0, np.nan))
    return df


# -- tables ---------------------------------------------------------------------------


def _cell_overhead(row: pd.Series) -> str:
    if row["meets"]:
        proven = {"all plans": " *", "staged space": " s*"}.get(row["optimal_in"], "")
        return f"{100 * row['overhead']:.2f}%" + proven
    if row["status"] == "OVER_BUDGET" and pd.notna(row["overhead"]):
        return f"over ({100 * row['overhead']:.2f}%)"
    return str(row["status"]).lower()


def _cell_peak(row: pd.Series) -> str:
    if pd.isna(row["peak_bytes"]) or not row["no_remat_peak_bytes"]:
        return ""
    return f"{row['peak_bytes'] / row['no_remat_peak_bytes']:.3f}"


def budget_table(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per graph and budget, each planner's overhead and peak. Returns (raw
    numbers for CSV, formatted cells for Markdown)."""
    index = ["graph", "budget_ratio", "budget"]
    raw = df.pivot_table(index=index, columns="planner", values=["overhead", "peak_bytes"], aggfunc="first")
    status = df.pivot_table(index=index, columns="planner", values="status", aggfunc="first")
    raw = pd.concat([raw, pd.concat({"status": status}, axis=1)], axis=1)
    raw.columns = [f"{planner} {what}" for what, planner in raw.columns]
    raw = raw[sorted(raw.columns)].reset_index().sort_values(["graph", "budget_ratio"], ascending=[True, False])
    cells = df.assign(o=df.apply(_cell_overhead, axis=1), p=df.apply(_cell_peak, axis=1))
    shown = cells.pivot_table(index=["graph", "budget_ratio"], columns="planner", values=["o", "p"],
                              aggfunc="first")
    shown.columns = [f"{planner} {'overhead' if what == 'o' else 'peak'}" for what, planner in shown.columns]
    shown = shown[sorted(shown.columns)].reset_index().sort_values(["graph", "budget_ratio"],
                                                                   ascending=[True, False])
    return raw, shown.fillna("")


def gap_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per heuristic and graph family (and over all): instances, plans within
    budget, how many are measured against a proven optimum, median and worst gap."""
    heur = df[~df["exact"]]
    out = []
    for (planner, family), g in heur.groupby(["planner", "family"]):
        out.append(_gap_stats(planner, family, g))
    for planner, g in heur.groupby("planner"):
        if g["family"].nunique() > 1:
            out.append(_gap_stats(planner, "(all)", g))
    cols = ["planner", "family", "instances", "within budget", "vs optimum", "median gap %", "worst gap %"]
    return pd.DataFrame(out, columns=cols).sort_values(["planner", "family"]).reset_index(drop=True)


def _gap_stats(planner: str, family: str, g: pd.DataFrame) -> list[Any]:
    gaps = g["gap_to_ref"].dropna()
    return [planner, family, len(g), int(g["meets"].sum()), int((g["meets"] & (g["ref_kind"] == "optimum")).sum()),
            round(100 * gaps.median(), 3) if len(gaps) else np.nan,
            round(100 * gaps.max(), 3) if len(gaps) else np.nan]


def status_table(df: pd.DataFrame) -> pd.DataFrame:
    t = pd.crosstab(df["planner"], df["status"])
    t.columns.name = None
    return t.reset_index()


# Planner stats worth a column in the exact table (cpsat: the plan space
# solved, and its status there when that is only a subspace; whose plan it
# returned when a fast planner's was better than its own).
EXACT_STATS = ("space", "space_status", "space_gap", "warm_start", "plan_from")


def exact_table(df: pd.DataFrame) -> pd.DataFrame:
    """The exact planner's runs: size, status, time, gap to its own bound."""
    cols = ["graph", "nodes", "budget_ratio", "planner", "status", "optimal_in", "overhead", "gap", "wall_s",
            "time_to_first_s", "time_to_best_s", "hint_from", *EXACT_STATS]
    ex = df[df["exact"]]
    stats = ex.get("stats", pd.Series(index=ex.index, dtype=object)).map(_options)
    ex = ex.assign(**{k: stats.map(lambda d, k=k: d.get(k)) for k in EXACT_STATS}).reindex(columns=cols)
    # optional columns nobody filled go; the key columns stay even with no exact runs
    ex = ex.drop(columns=[c for c in ("hint_from", *EXACT_STATS) if ex[c].isna().all()])
    return ex.sort_values(["nodes", "graph", "budget_ratio"], ascending=[True, True, False]).reset_index(drop=True)


VERIFIED_COLUMNS = ["graph", "budget_ratio", "planner", "fits", "budget", "xla_peak_bytes", "xla_plain_peak_bytes",
                    "chosen", "predicted_peak_bytes", "model_status", "overhead", "rounds"]


def verified_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``batch --verify xla`` jobs (none in a batch of graphs)."""
    return df[df["verify"] == "xla"] if "verify" in df else df.iloc[0:0]


def verified_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per --verify xla job: whether the compiled step fits, the chosen
    candidate, its compiled and predicted peaks, what the model said of it."""
    v = verified_rows(df).reindex(columns=VERIFIED_COLUMNS)
    return v.sort_values(["graph", "budget_ratio", "planner"], ascending=[True, False, True]).reset_index(drop=True)


def verified_lines(df: pd.DataFrame) -> list[str]:
    v = verified_rows(df)
    if v.empty:
        return []
    from ..xla.flags import describe

    told = sorted({describe(json.loads(x)) for x in v["xla_settings"].dropna()})
    fit = v["fits"].astype("boolean")
    return [f"{len(v)} jobs ran with --verify xla ({'; '.join(told) or 'XLA settings not recorded'}): their budget, "
            f"peak and overhead are the compiled step's (peak: XLA's own figure; budget: the ratio x the compiled "
            f"plain step's peak; overhead: XLA's FLOPs over the plain step's), FEASIBLE meaning the compiled step "
            f"fits and OVER_BUDGET that no candidate does; their gaps are measured against the plain step's FLOPs. "
            f"{int(fit.sum())} of {len(v)} fit as compiled."]


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub table (pandas' own needs the optional ``tabulate``)."""
    def fmt(v):
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.6g}"
        return str(v).replace("|", "\\|")

    cols = [str(c) for c in df.columns]
    num = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |",
             "| " + " | ".join("---:" if n else "---" for n in num) + " |"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


# -- the report ---------------------------------------------------------------------------


def write_report(results_dir: str | Path, out: str | Path, title: str | None = None,
                 command: str | None = None, setup: list[str] | None = None) -> Path:
    """Write tables (CSV + Markdown), figures (PNG), ``index.md`` and a
    self-contained ``index.html`` into ``out``; returns the index.md path."""
    from .figures import draw_figures

    results_dir, out = Path(results_dir), Path(out)
    df = load_results(results_dir)
    if (results_dir / RESULTS).exists():
        write_tables(results_dir)  # refresh them: a batch that died never derived its own
    out.mkdir(parents=True, exist_ok=True)
    raw, shown = budget_table(df)
    tables = {
        "status_counts": ("Solve status counts per planner", status_table(df), None),
        "gaps": ("Gap of each heuristic to the optimum (or best bound), by graph family", gap_table(df), None),
        "exact": ("Exact-solver runs", exact_table(df), None),
        "budgets": ("Overhead and peak of each planner, per graph and budget", raw, shown),
    }
    if not verified_rows(df).empty:
        tables["verified"] = ("--verify xla jobs: the compiled step against its budget", verified_table(df), None)
    for name, (_, table, md) in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
        (out / f"{name}.md").write_text(to_markdown(md if md is not None else table))
    df.drop(columns=[c for c in ("stats",) if c in df]).to_csv(out / "results.csv", index=False)
    figures = draw_figures(df, results_dir, out)
    index = out / "index.md"
    made = commands(results_dir, command, setup)
    index.write_text(_index_md(df, title or out.name, tables, figures, made))
    (out / "index.html").write_text(page_html(title or out.name, summary_lines(df), made, figures,
                                              [(caption, md if md is not None else table)
                                               for caption, table, md in tables.values()], out))
    return index


def commands(results_dir: Path, command: str | None = None, setup: list[str] | None = None) -> list[str]:
    """What made the report, in order: the commands that made input graphs
    (``setup``: the batch does not see them), the batch runs, the report's."""
    made = results_dir / "batch.json"
    cmds = [entry["command"] for entry in json.loads(made.read_text())] if made.exists() else []
    return list(setup or []) + cmds + ([command] if command else [])


def model_infeasible(df: pd.DataFrame) -> pd.DataFrame:
    """Exact runs that report INFEASIBLE although another planner's replayed
    plan meets the same budget: a wrong claim, as INFEASIBLE speaks of every
    plan (one empty in the staged space only is UNKNOWN)."""
    met = df[df["meets"]].groupby(["graph_sha256", "budget_ratio"])["planner"].agg(lambda p: ", ".join(sorted(p)))
    ex = df[df["exact"] & (df["status"] == "INFEASIBLE")]
    keys = pd.MultiIndex.from_frame(ex[["graph_sha256", "budget_ratio"]])
    ex = ex.assign(met_by=met.reindex(keys).to_numpy())
    return ex[ex["met_by"].notna()][["graph", "budget_ratio", "planner", "met_by"]]


def exact_origin_lines(df: pd.DataFrame) -> list[str]:
    """The exact planner's time per job, and whose plans its rows hold: its
    own, or a fast planner's that it did not beat in that time (the batch
    hints it with the best one; ``plan_from``)."""
    ex = df[df["exact"] & df["meets"]]
    if ex.empty:
        return []
    options = df[df["exact"]]["options"].map(_options)
    limits = sorted({o.get("time_limit") for o in options} - {None})
    work = sorted({o.get("deterministic_time") for o in options} - {None})
    origin = ex.get("stats", pd.Series(index=ex.index, dtype=object)).map(_options).map(lambda d: d.get("plan_from"))
    theirs = ex[origin.notna()]
    limit = f"{', '.join(f'{t:g}' for t in limits)} s per job" if limits else "its default time limit"
    if work:  # cpsat --deterministic-time: the same rows on any load, unless the wall clock came first
        limit += (f" and {', '.join(f'{t:g}' for t in work)} s of CP-SAT's deterministic time on one worker "
                  "(rows whose stats say deterministic false were cut by the wall clock)")
    line = (f"The exact planner ran with {limit}: its rows hold its own plan on {len(ex) - len(theirs)} of "
            f"{len(ex)} instances it met")
    if len(theirs):
        line += ("; on the others a fast planner's plan that it did not beat: " +
                 "; ".join(f"{r.graph} r={r.budget_ratio:g} ({o})" for r, o in zip(theirs.itertuples(),
                                                                                   origin[origin.notna()])))
    return [line + "."]


def summary_lines(df: pd.DataFrame) -> list[str]:
    n_graphs = df["graph"].nunique()
    ratios = ", ".join(f"{r:g}" for r in sorted(df["budget_ratio"].unique(), reverse=True))
    versions = sorted({f"rematopt {a}, OR-Tools {b}" for a, b in
                       zip(df.get("rematopt_version", []), df.get("ortools_version", []))})
    lines = [f"{len(df)} jobs: {n_graphs} graphs x budget ratios {ratios} x planners "
             f"{', '.join(sorted(df['planner'].unique()))}.",
             f"Versions: {'; '.join(versions) or 'unknown'}."]
    lines += exact_origin_lines(df)
    lines += verified_lines(df)
    beat = df[~df["exact"] & (df["ref_kind"] == "optimum") & (df["gap_to_ref"] < 0)]
    if len(beat):
        which = "; ".join(f"{r.planner} on {r.graph} r={r.budget_ratio:g} ({100 * r.gap_to_ref:.3f}%)"
                          for r in beat.itertuples())
        lines.append(f"{len(beat)} heuristic plans beat the exact planner's optimum in its staged space (plans "
                     f"outside it; negative gaps): {which}.")
    odd = model_infeasible(df)
    if len(odd):
        lines.append(f"Warning: the exact planner reports INFEASIBLE on {len(odd)} (graph, budget) instances where "
                     f"another planner's replayed plan meets the budget, a claim that plan refutes: "
                     f"{'; '.join(f'{r.graph} r={r.budget_ratio:g}' for r in odd.itertuples())}.")
    return lines


def _index_md(df, title, tables, figures, commands) -> str:
    parts = [f"# {title}\n", *(f"{line}\n" for line in summary_lines(df)), "\n## How it was made\n",
             "```bash\n" + ("\n".join(commands) or "(commands not recorded)") + "\n```\n",
             "\nOverhead = (compute cost - base cost) / base cost, from the simulator's replay of each plan. "
             "Budget ratio r = floor(r x no-remat peak) bytes. Gap = (cost - reference) / reference, where the "
             "reference is the exact planner's proven optimum (over all plans, or over its staged space) or else "
             "the best lower bound known; only plans within budget have a gap. `*` marks a plan proven optimal over "
             "all plans (status OPTIMAL), `s*` one proven optimal in the exact planner's staged space only "
             "(`optimal_in`), `over (x%)` a valid plan that misses the budget.\n", "\n## Figures\n"]
    for fig in figures:
        parts.append(f"\n### {fig['title']}\n\n![{fig['title']}]({fig['file']})\n\n{fig['reading']}\n")
    if not figures:
        parts.append("\n(no figures: no rows with plans)\n")
    parts.append("\n## Tables\n")
    for name, (caption, table, md) in tables.items():
        parts.append(f"\n### {caption}\n\n[{name}.md]({name}.md) · [{name}.csv]({name}.csv)"
                     f" · all rows: [results.csv](results.csv)\n\n")
        if name != "budgets" or len(table) <= 40:
            parts.append(to_markdown(md if md is not None else table))
    return "".join(parts)


def page_html(title: str, lines: list[str], commands: list[str], figures: list[dict[str, str]],
              tables: list[tuple[str, pd.DataFrame]], out: Path) -> str:
    """A self-contained page: the summary lines, the commands, the figures
    (PNGs in ``out``, embedded) with their readings, and the tables."""
    def img(fig):
        data = base64.b64encode((out / fig["file"]).read_bytes()).decode()
        return f'<img alt="{html.escape(fig["title"])}" src="data:image/png;base64,{data}">'

    body = [f"<h1>{html.escape(title)}</h1>", *(f"<p>{html.escape(line)}</p>" for line in lines),
            "<h2>How it was made</h2>", f"<pre>{html.escape(chr(10).join(commands))}</pre>", "<h2>Figures</h2>"]
    for fig in figures:
        body += [f"<h3>{html.escape(fig['title'])}</h3>", img(fig), f"<p>{html.escape(fig['reading'])}</p>"]
    body.append("<h2>Tables</h2>")
    for caption, table in tables:
        body += [f"<h3>{html.escape(caption)}</h3>",
                 table.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.6g}")]
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
             "table{border-collapse:collapse;font-size:85%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "img{max-width:100%}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
