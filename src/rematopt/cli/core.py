"""Core commands: inspect, simulate, solve, generate, import nodelink, bench."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from .. import planners
from ..errors import GraphError, PlanError, RematoptError
from ..graph import Graph
from ..importers import load as load_graph
from ..plan import Plan
from ..planners.options import command_line
from ..planners.options import parse as parse_options
from ..reference import no_remat_peak, working_set_bound
from ..simulate import base_cost, simulate
from ..sizes import parse_bytes
from ..solve import solve
from .common import (check_writable, drop_unsafe_marks_option, emit_json, figures_table, load_graph_arg,
                     since_start)

NO_PLAN_EXIT = 3  # solve found no plan within the budget (1: invalid plan, 2: bad input)


@click.command()
@click.argument("graph", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@drop_unsafe_marks_option
def inspect(graph: str, as_json: bool, drop_unsafe_marks: bool) -> None:
    """Sizes and reference points of GRAPH (rematopt graph, node-link JSON or MLIR)."""
    g = load_graph_arg(graph, drop_unsafe_marks)
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


@click.command(name="simulate")
@click.argument("graph", type=click.Path(dir_okay=False))
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--timeline", type=click.Path(dir_okay=False), help="Write memory after each event (CSV).")
@drop_unsafe_marks_option
def simulate_cmd(graph: str, plan: str, as_json: bool, timeline: str | None, drop_unsafe_marks: bool) -> None:
    """Replay PLAN against GRAPH: validity, peak, costs, transfers. Exit 1 if invalid."""
    g = load_graph_arg(graph, drop_unsafe_marks)
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


class _FromText(click.ParamType):
    """A planner option read by its own function (``option(from_text=...)``)."""

    name = "text"

    def __init__(self, read):
        self.read = read

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.read(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def planner_options(exclude: tuple[str, ...] = ()):
    """The planners' options as click options (:func:`~rematopt.planners.options.command_line`):
    each defaults to None (not given), so every planner applies its own default,
    and its help names the planners that take it."""

    def decorate(fn):
        for o in reversed(command_line(planners.options_classes(), exclude)):
            if o.spec.from_text is not None:
                kind = _FromText(o.spec.from_text)
            elif o.spec.choices is not None:
                kind = click.Choice(o.spec.choices)
            else:
                kind = o.kind[0]
            if o.kind == (bool,):
                fn = click.option(f"{o.flag}/--no-{o.flag[2:]}", o.name, default=None, help=o.help)(fn)
            else:
                fn = click.option(o.flag, o.name, type=kind, help=o.help)(fn)
        return fn

    return decorate


# Seconds a solve keeps back from --time-limit for what follows the planner:
# the replay that checks its plan, and writing it (the 10,084-node decoder: 0.3 s).
FINISH_S = 0.5


@click.command(name="solve")
@click.argument("graph", required=False, type=click.Path(dir_okay=False))
@click.option("--planner", "-p", default="cpsat", show_default=True,
              help=f"One of: {', '.join(planners.names())}.")
@click.option("--budget", help="Memory budget in bytes (2M, 1E9, 1.5GiB, 512MB... accepted).")
@click.option("--budget-ratio", type=float, help="Budget as a fraction of the no-remat peak.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the plan here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--verify", type=click.Choice(["xla"]),
              help="GRAPH is a JAX MODULE:FACTORY: plan its step, compile each plan with the installed XLA and "
                   "return the cheapest whose compiled peak fits --budget-ratio x the compiled plain step's "
                   "(--time-limit: the whole loop's seconds; --deterministic-time: the loop's deterministic "
                   "seconds, shared out to its rounds, for an answer that does not depend on the load).")
@click.option("--set", "factory_settings", multiple=True, metavar="KEY=VALUE",
              help="--verify: factory keyword argument (repeatable), as for import jax.")
@click.option("--argnums", default="0", show_default=True, help="--verify: differentiated arguments, e.g. 0 or 0,1.")
@planner_options()
@drop_unsafe_marks_option
def solve_cmd(graph: str | None, planner: str, budget: str | None, budget_ratio: float | None,
              output: str | None, as_json: bool, verify: str | None, factory_settings: tuple[str, ...],
              argnums: str, drop_unsafe_marks: bool, **options: Any) -> None:
    """Plan GRAPH (default: a small instance shipped with rematopt) under a budget."""
    if verify:
        return _solve_verified(graph, planner, budget, budget_ratio, output, as_json, factory_settings, argnums,
                               options)
    if factory_settings:
        raise RematoptError("--set configures a JAX factory: it goes with --verify xla (or import jax)")
    g = load_graph_arg(graph, drop_unsafe_marks)
    for path in (output, options.get("log_path"), options.get("export_model")):
        check_writable(path)
    ctx = click.get_current_context()
    given = {k for k in options if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE
             and options[k] is not False}  # --no-offload asks nothing of a planner that never offloads
    ignored = given - planners.options(planner)  # a plan made without them would look like an answer
    if ignored:
        flags = {p.name: p.opts[0] for p in ctx.command.params}
        raise RematoptError(f"planner {planner!r} does not take {', '.join(sorted(flags[k] for k in ignored))}")
    options = {k: v for k, v in options.items() if v is not None}
    if "hint" in options:
        options["hint"] = load_hint(options["hint"], g)
    if "time_limit" in options:  # the whole command's: the planner gets what is left of it
        parse_options(planners.options_class(planner), options, planner)  # as given (-1 is refused, not spent)
        options["time_limit"] = max(0.0, options["time_limit"] - since_start() - FINISH_S)
    options.setdefault("progress", sys.stderr.isatty() and not as_json)
    sol = solve(g, planner, budget=parse_bytes(budget) if budget is not None else None,
                budget_ratio=budget_ratio, **options)
    if output and sol.has_plan:
        sol.plan.save(output)
    info = sol.summary()
    info["plan"] = output if sol.has_plan else None
    if as_json:
        emit_json(info)
    else:
        click.echo(sol.headline())
        figures_table(f"{planner} on {g.name}", {k: v for k, v in info.items()
                                                  if not isinstance(v, (list, dict))})
    if not sol.has_plan:
        why = sol.plan.stats.get("reason")
        click.echo(f"rematopt: {g.source or g.name}: no plan ({sol.status}{f': {why}' if why else ''})"
                   + (f"; {output} not written" if output else ""), err=True)
        sys.exit(NO_PLAN_EXIT)


def _solve_verified(spec: str | None, planner: str, budget: str | None, budget_ratio: float | None,
                    output: str | None, as_json: bool, settings: tuple[str, ...], argnums: str,
                    options: dict[str, Any]) -> None:
    from .jax import parse_argnums
    from .verify import run

    if spec is None or ":" not in spec:
        raise RematoptError(f"{spec or 'GRAPH'}: --verify xla takes a JAX MODULE:FACTORY (e.g. models.gpt:factory)")
    if budget is not None:
        raise RematoptError(f"{spec}: --verify xla takes --budget-ratio (of the compiled plain step), not --budget")
    ctx = click.get_current_context()
    given = {k for k in options if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE
             and options[k] is not False}
    time_limit = options.pop("time_limit", None)  # the whole loop's, not one planning round's
    deterministic_time = options.pop("deterministic_time", None)  # the loop's, shared out to its rounds
    ignored = given - {"time_limit", "deterministic_time"} - planners.options(planner)
    if ignored:
        flags = {p.name: p.opts[0] for p in ctx.command.params}
        raise RematoptError(f"planner {planner!r} does not take {', '.join(sorted(flags[k] for k in ignored))}")
    options = {k: v for k, v in options.items() if v is not None and k in planners.options(planner)}
    if "progress" in planners.options(planner):
        options.setdefault("progress", False)
    run(spec, settings, parse_argnums(argnums), planner, budget_ratio, time_limit, output, as_json, options,
        deterministic_time)


def load_hint(path: str, graph: Graph) -> Plan:
    """The ``--hint`` plan, refused naming its file unless it replays on GRAPH."""
    hint = Plan.load(path)
    replay = simulate(graph, hint)
    if not replay.valid:
        where = f"event {replay.error_event}: " if replay.error_event is not None else ""
        raise PlanError(f"{path}: the hint does not replay on {graph.source or graph.name}: {where}{replay.error}")
    return hint


@click.command()
@click.argument("kind", type=click.Choice(["chain", "linear-train", "unet", "decoder", "random-layered"]))
@click.option("--size", "-n", type=int, required=True,
              help="chain: depth; linear-train: layers; unet: depth; decoder: layers; random-layered: nodes.")
@click.option("--sinks", is_flag=True, help="chain: a late sink per link (greedy stress shape).")
@click.option("--train", is_flag=True, help="unet: add the backward pass.")
@click.option("--width", type=float, default=0.27, show_default=True, help="random-layered: width factor.")
@click.option("--heads", type=int, default=4, show_default=True, help="decoder: attention heads per block.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
def generate(kind: str, size: int, sinks: bool, train: bool, width: float, heads: int, seed: int,
             output: str) -> None:
    """Write a seeded synthetic graph."""
    from ..importers import synthetic

    try:
        if kind == "chain":
            g = synthetic.chain(size, sinks=sinks, seed=seed or None)
        elif kind == "linear-train":
            g = synthetic.linear_training(size, seed=seed or None)
        elif kind == "unet":
            g = synthetic.unet(size, train=train, seed=seed or None)
        elif kind == "decoder":
            g = synthetic.decoder(size, heads=heads)
        else:
            g = synthetic.random_layered(size, width=width, seed=seed)
    except ValueError as e:
        raise GraphError(f"generate {kind}: {e}") from None
    g.save(output)
    click.echo(f"wrote {output}: {g.n} nodes, {len(g.edges)} edges")


@click.group(name="import")
def import_group() -> None:
    """Turn a foreign graph (node-link JSON, JAX, MLIR) into a rematopt graph."""


@click.group(name="export")
def export_group() -> None:
    """Write a plan back into the program it was made for."""


@import_group.command(name="nodelink")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
def import_nodelink(file: str, output: str) -> None:
    """Convert Checkmate / Moccasin node-link JSON."""
    g = load_graph(file)
    if g.meta.get("source") != "nodelink":
        raise RematoptError(f"{file}: not node-link JSON (it is already a rematopt graph)")
    g.save(output)
    click.echo(f"wrote {output}: {g.n} nodes, {len(g.edges)} edges")


@click.command()
@click.argument("what", type=click.Choice(["simulator", "greedy", "cpsat", "peak", "scale", "bounds", "device"]),
                default="simulator")
@click.option("--sizes", default="10000,100000,2000000", show_default=True, help="Event counts to time.")
@click.option("--graphs", default=None, help="scale: the instances (default: gpt12, gpt24, gpt48, gpt96, "
              "gpt48_fused, gpt_scan48, gpt576, decoder480, random_layered_n500, random_layered_n1000); bounds: "
              "graphs by name (default: random_layered_n250, n500, n1000, gpt_l2_w64, gpt48).")
@click.option("--ratios", default=None, help="scale, bounds: budget ratios (default: 0.9,0.8,0.7,0.6; bounds: 0.9,0.8).")
@click.option("--time-limit", type=float, default=120.0, show_default=True,
              help="scale, bounds: cpsat's limit, seconds; device: the whole run's wall clock (default: none), "
              "the rows finished by then kept.")
@click.option("--deterministic-time", type=click.FloatRange(min=0), default=None,
              help="device: each budget's planning, in CP-SAT's deterministic seconds (one worker, seed 0: the "
              "same plans on any load; default 10, quick 5).")
@click.option("--bound-limit", type=float, default=30.0, show_default=True,
              help="bounds: each bound of the table asked alone for this long, seconds.")
@click.option("--workers", type=int, default=2, show_default=True, help="scale: cpsat's threads.")
@click.option("--lns", "lns", default="auto", show_default=True,
              help="scale: cpsat's --lns, or several (e.g. on,off: a row for each).")
@click.option("--folder", type=click.Path(file_okay=False), default="bench-graphs", show_default=True,
              help="scale: where the instances are made (on first use) and kept.")
@click.option("--models", default=None, help="device: models by name (default: gpt, unet, flax_linen, keras_llama).")
@click.option("--quick", is_flag=True, help="device: small sizes, fewer rows, one budget, 3 planning rounds an order (4 min 36 s on 2 idle cores: rows and planning two at a time).")
@click.option("--runs", type=int, default=None, help="device: interleaved timing rounds, one step of every variant each (default 9; 5 quick).")
@click.option("--out", type=click.Path(file_okay=False), default="reports/device", show_default=True,
              help="device: the report goes to OUT/<backend>/.")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="device: keep each model's worker files (traced graph, plans, compiled modules, JAX's compile "
              "cache) in a new folder under WORK (default: a temporary folder, removed at the end).")
def bench(what: str, sizes: str, graphs: str | None, ratios: str | None, time_limit: float,
          deterministic_time: float | None, bound_limit: float, workers: int, lns: str, folder: str, models: str | None,
          quick: bool, runs: int | None, out: str, work: str | None) -> None:
    """Print timing tables (simulator: replay, save and load at several plan sizes;
    greedy: the d=2000 chain-with-sinks stress case and the clone projection check;
    cpsat: the exact planner on ../shared/benchmarks/nodelink at ratios 0.9 and 0.8;
    peak: --objective peak there and on instances/, overhead unlimited and capped at 10%;
    scale: cpsat on training steps of 12 to 96 layers, a 100,000-node chain of
    blocks and 1,000-node random graphs, each run in its own process, against
    dtr and the best fast plan: run it from a checkout, whose models/ the JAX
    instances are traced from;
    bounds: per graph and budget, cpsat's plan, bound and gap, and each
    whole-space bound asked alone;
    device: the models' training steps compiled and run on the backend present, plain, with JAX's
    policies per layer and on the whole step, XLA's GPU remat (on a GPU) and rematopt's plans at
    --ratios of the plain compiled peak (default 0.8,0.6,0.5), each in a fresh process, written to
    OUT/<backend>/ with the verdict on top; run it from a checkout, whose models/ it imports)."""
    if what == "device":
        from ..studies.device.bench import run_bench
        from ..studies.device.settings import DEFAULT_MODELS, MODELS, unimportable

        names = tuple(models.split(",")) if models else DEFAULT_MODELS
        unknown = [n for n in names if n not in MODELS]
        if unknown:
            raise RematoptError(f"bench device: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
        missing = unimportable(names)
        if missing:
            raise RematoptError(f"bench device: cannot import {', '.join(missing)} from {Path.cwd()}: run it from a "
                                "checkout of rematopt, whose models/ it imports")
        bench_ = run_bench(names, quick=quick, runs=runs,
                           ratios=tuple(float(r) for r in ratios.split(",")) if ratios else None,
                           time_limit=None if click.get_current_context().get_parameter_source("time_limit")
                           == ParameterSource.DEFAULT else time_limit, out=Path(out),
                           progress=lambda line: click.echo(line, err=True), deterministic_time=deterministic_time,
                           work=Path(work) if work else None)
        click.echo(f"wrote {Path(out) / bench_.backend}/device.md, device.csv, device.png ({len(bench_.rows)} rows)")
        return
    if what == "bounds":
        from ..studies.bench import BOUNDS_GRAPHS, bounds_rows, bounds_table

        names = tuple(graphs.split(",")) if graphs else BOUNDS_GRAPHS
        rows = bounds_rows(names, tuple(float(r) for r in (ratios or "0.9,0.8").split(",")), time_limit, bound_limit,
                           workers, Path(folder), Console(stderr=True).print)
        Console(width=max(Console().width, 200)).print(bounds_table(rows, time_limit, bound_limit, workers))
        return
    graphs = graphs or ("gpt12,gpt24,gpt48,gpt96,gpt48_fused,gpt_scan48,gpt576,decoder480,random_layered_n500,"
                        "random_layered_n1000")
    ratios = ratios or "0.9,0.8,0.7,0.6"
    if what == "scale":
        from ..studies.bench import SCALE, scale_rows, scale_table

        unknown = [n for n in graphs.split(",") if n not in SCALE]
        if unknown:
            raise RematoptError(f"bench scale: unknown instance(s) {', '.join(unknown)}; known: {', '.join(SCALE)}")
        settings = tuple(lns.split(","))
        if not set(settings) <= {"auto", "on", "off"}:
            raise RematoptError(f"bench scale: --lns takes auto, on, off or a list of them, got {lns!r}")
        rows = scale_rows(tuple(graphs.split(",")), tuple(float(r) for r in ratios.split(",")), time_limit, workers,
                          Path(folder), settings, Console(stderr=True).print)
        Console(width=max(Console().width, 180)).print(scale_table(rows, time_limit, workers))
        return
    if what == "peak":
        from ..studies.bench import peak_table

        Console(width=max(Console().width, 150)).print(peak_table())
        return
    if what == "cpsat":
        from ..studies.bench import cpsat_table

        Console(width=max(Console().width, 150)).print(cpsat_table())
        return
    if what == "greedy":
        from ..studies.bench import greedy_exactness_table, greedy_table

        console = Console(width=max(Console().width, 150))  # keep the wide table whole in logs
        console.print(greedy_table())
        console.print(greedy_exactness_table())
        return
    from ..studies.bench import simulator_table

    Console().print(simulator_table([int(s) for s in sizes.split(",")]))
