"""Core commands: inspect, simulate, solve, generate, import nodelink, bench."""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from .. import planners
from ..errors import BudgetError, GraphError, RematoptError
from ..graph import Graph
from ..plan import Plan
from ..reference import no_remat_peak, working_set_bound
from ..simulate import base_cost, simulate
from ..solve import solve
from . import cli

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str) -> int:
    """``"1048576"``, ``"512MiB"``, ``"1.5GB"`` -> bytes (floored)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"cannot read {text!r} as a size in bytes (e.g. 1048576, 512MiB, 1.5GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def default_graph_path() -> Path:
    """The small instance shipped inside the package, for ``solve`` with no GRAPH."""
    return Path(str(resources.files("rematopt") / "data" / "default.json"))


def load_graph_arg(path: str | None) -> Graph:
    return Graph.load(path if path is not None else default_graph_path())


def check_writable(path: str | None) -> None:
    """Refuse an output path whose directory is missing or read-only before
    the work that would be written there, not after it."""
    if path is None:
        return
    where = Path(path).parent
    if not where.is_dir():
        raise RematoptError(f"{path}: no such directory {str(where)!r}")
    if not os.access(where, os.W_OK):
        raise RematoptError(f"{path}: directory {str(where)!r} is not writable")


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, default=str))


def figures_table(title: str, rows: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        table.add_row(key, str(value))
    Console().print(table)


@cli.command()
@click.argument("graph", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inspect(graph: str, as_json: bool) -> None:
    """Sizes and reference points of GRAPH (rematopt graph, node-link JSON or MLIR)."""
    g = Graph.load(graph)
    info = {
        "graph": g.name,
        "nodes": g.n,
        "edges": len(g.edges),
        "compute_nodes": len(g.compute_ids),
        "inputs": g.n - len(g.compute_ids),
        "total_bytes": sum(g.bytes),
        "no_remat_peak_bytes": no_remat_peak(g),
        "working_set_bound_bytes": working_set_bound(g),
        "base_cost": base_cost(g),
        "cost_unit": g.cost_unit,
        "phases": g.has_phases,
    }
    if g.meta.get("budget_bytes") is not None:
        info["default_budget_bytes"] = g.meta["budget_bytes"]
    emit_json(info) if as_json else figures_table(f"{graph}", info)


@cli.command(name="simulate")
@click.argument("graph", type=click.Path(dir_okay=False))
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--timeline", type=click.Path(dir_okay=False), help="Write memory after each event (CSV).")
def simulate_cmd(graph: str, plan: str, as_json: bool, timeline: str | None) -> None:
    """Replay PLAN against GRAPH: validity, peak, costs, transfers. Exit 1 if invalid."""
    g = Graph.load(graph)
    p = Plan.load(plan)
    r = simulate(g, p)
    info = {"graph": g.name, "planner": p.planner, **r.summary(), "no_remat_peak_bytes": no_remat_peak(g)}
    if timeline:
        Path(timeline).write_text("event,op,node,bytes\n" + "".join(
            f"{k},{op},{node},{mem}\n" for k, ((op, node), mem) in enumerate(zip(p.events(), r.timeline.tolist()))))
    if as_json:
        emit_json(info)
    else:
        figures_table(f"{plan} on {graph}", info)
    if not r.valid:
        sys.exit(1)


def _depth_arg(value: str | None) -> str | int | None:
    if value in (None, "auto", "full"):
        return value
    if not value.isdigit():
        raise click.BadParameter(f"expected auto, full or an integer >= 0, got {value!r}")
    return int(value)


@cli.command(name="solve")
@click.argument("graph", required=False, type=click.Path(dir_okay=False))
@click.option("--planner", "-p", default="cpsat", show_default=True,
              help=f"One of: {', '.join(planners.names())}.")
@click.option("--budget", help="Memory budget in bytes (512MiB, 1.5GB... accepted).")
@click.option("--budget-ratio", type=float, help="Budget as a fraction of the no-remat peak.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the plan here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--objective", type=click.Choice(["overhead", "peak"]),
              help="cpsat: minimise overhead under the budget, or the peak.")
@click.option("--max-overhead", type=float, help="cpsat --objective peak: overhead cap.")
@click.option("--offload/--no-offload", default=False, help="cpsat: allow host offload.")
@click.option("--host-bandwidth", type=float, help="Transfer cost = bytes / this (bytes per cost unit).")
@click.option("--transfer-cost-per-byte", type=float, help="Transfer cost = bytes x this.")
@click.option("--max-clone-expansion", type=float, help="Compute events <= X x compute nodes (0: unbounded).")
@click.option("--time-limit", type=float, help="Solver time limit, seconds.")
@click.option("--workers", type=int, help="Solver threads (default: all cores).")
@click.option("--seed", type=int, help="Solver random seed.")
@click.option("--hint", type=click.Path(dir_okay=False), help="A plan to start the solver from.")
@click.option("--warm-start", type=click.Choice(["auto", "none"]), help="cpsat: run fast planners first.")
@click.option("--recompute-depth", type=str, callback=lambda c, p, v: _depth_arg(v),
              help="cpsat: auto, full, or recompute only within N producer hops of each stage's node.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="Write incumbent/bound over time (CSV).")
@click.option("--export-model", type=click.Path(dir_okay=False),
              help="cpsat: write the first round's CP-SAT model (proto text) here and its LP beside it (.mps).")
@click.option("--peak-model", type=click.Choice(["memory", "residual"]), help="greedy: peak estimate.")
@click.option("--trim", type=click.Choice(["midpoint", "max-clone"]), help="greedy: clone-bound trimming rule.")
def solve_cmd(graph: str | None, planner: str, budget: str | None, budget_ratio: float | None,
              output: str | None, as_json: bool, hint: str | None, **options: Any) -> None:
    """Plan GRAPH (default: a small instance shipped with rematopt) under a budget."""
    g = load_graph_arg(graph)
    for path in (output, options.get("log_path"), options.get("export_model")):
        check_writable(path)
    ctx = click.get_current_context()
    given = {k for k in [*options, "hint"] if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE
             and options.get(k) is not False}  # --no-offload asks nothing of a planner that never offloads
    ignored = given - planners.options(planner)  # a plan made without them would look like an answer
    if ignored:
        flags = ", ".join(sorted({"log_path": "--log"}.get(k, "--" + k.replace("_", "-")) for k in ignored))
        raise RematoptError(f"planner {planner!r} does not take {flags}")
    options = {k: v for k, v in options.items() if v is not None}
    if hint:
        options["hint"] = Plan.load(hint)
    options.setdefault("progress", sys.stderr.isatty() and not as_json)
    sol = solve(g, planner, budget=parse_bytes(budget) if budget is not None else None,
                budget_ratio=budget_ratio, **options)
    if output:
        sol.plan.save(output)
    info = sol.summary()
    info["plan"] = output
    if as_json:
        emit_json(info)
    else:
        figures_table(f"{planner} on {g.name}", {k: v for k, v in info.items()
                                                  if not isinstance(v, (list, dict))})


@cli.command()
@click.argument("kind", type=click.Choice(["chain", "linear-train", "unet", "random-layered"]))
@click.option("--size", "-n", type=int, required=True,
              help="chain: depth; linear-train: layers; unet: depth; random-layered: nodes.")
@click.option("--sinks", is_flag=True, help="chain: a late sink per link (greedy stress shape).")
@click.option("--train", is_flag=True, help="unet: add the backward pass.")
@click.option("--width", type=float, default=0.27, show_default=True, help="random-layered: width factor.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
def generate(kind: str, size: int, sinks: bool, train: bool, width: float, seed: int, output: str) -> None:
    """Write a seeded synthetic graph."""
    from ..importers import synthetic

    try:
        if kind == "chain":
            g = synthetic.chain(size, sinks=sinks, seed=seed or None)
        elif kind == "linear-train":
            g = synthetic.linear_training(size, seed=seed or None)
        elif kind == "unet":
            g = synthetic.unet(size, train=train, seed=seed or None)
        else:
            g = synthetic.random_layered(size, width=width, seed=seed)
    except ValueError as e:
        raise GraphError(f"generate {kind}: {e}") from None
    g.save(output)
    click.echo(f"wrote {output}: {g.n} nodes, {len(g.edges)} edges")


@cli.group(name="import")
def import_group() -> None:
    """Turn a foreign graph (node-link JSON, JAX, MLIR) into a rematopt graph."""


@import_group.command(name="nodelink")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
def import_nodelink(file: str, output: str) -> None:
    """Convert Checkmate / Moccasin node-link JSON."""
    from ..importers import read_graph

    g = read_graph(file)
    if g.meta.get("source") != "nodelink":
        raise RematoptError(f"{file}: not node-link JSON (it is already a rematopt graph)")
    g.save(output)
    click.echo(f"wrote {output}: {g.n} nodes, {len(g.edges)} edges")


@cli.command()
@click.argument("what", type=click.Choice(["simulator", "greedy", "cpsat", "peak"]), default="simulator")
@click.option("--sizes", default="10000,100000,2000000", show_default=True, help="Event counts to time.")
def bench(what: str, sizes: str) -> None:
    """Print timing tables (simulator: replay, save and load at several plan sizes;
    greedy: the d=2000 chain-with-sinks stress case and the clone projection check;
    cpsat: the exact planner on ../shared/benchmarks/nodelink at ratios 0.9 and 0.8;
    peak: --objective peak there and on instances/, overhead unlimited and capped at 10%)."""
    if what == "peak":
        from ..bench import peak_table

        Console(width=max(Console().width, 150)).print(peak_table())
        return
    if what == "cpsat":
        from ..bench import cpsat_table

        Console(width=max(Console().width, 150)).print(cpsat_table())
        return
    if what == "greedy":
        from ..bench import greedy_exactness_table, greedy_table

        console = Console(width=max(Console().width, 150))  # keep the wide table whole in logs
        console.print(greedy_table())
        console.print(greedy_exactness_table())
        return
    from ..bench import simulator_table

    Console().print(simulator_table([int(s) for s in sizes.split(",")]))
