"""Memory-optimal schedules and what users ask with them: ``pareto`` (the
peak / overhead curve, each point proven or with its gap) and ``max-batch``
(the largest batch or sequence length that fits, per planner)."""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd
from rich.console import Console
from rich.table import Table

from ..errors import RematoptError
from ..stats import verdict
from ..sizes import parse_bytes
from .common import emit_json, load_graph_arg


@click.command(name="pareto")
@click.argument("graph", type=click.Path(dir_okay=False))
@click.option("--points", type=int, default=5, show_default=True, help="cpsat points (overhead caps), the uncapped one included.")
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="cpsat time limit per point, seconds.")
@click.option("--workers", type=int, default=2, show_default=True, help="Solver threads.")
@click.option("--out", type=click.Path(file_okay=False), help="Write pareto_curve.csv and pareto_curve.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print the points as JSON.")
def pareto_cmd(graph: str, points: int, time_limit: float, workers: int, out: str | None, as_json: bool) -> None:
    """The peak / overhead Pareto curve of GRAPH: cpsat's lowest peak at POINTS
    overhead caps (proven, or with its gap), beside the heuristics' plans."""
    from ..studies.pareto import curve, heuristic_points
    from ..studies.figures import CURVE, proven_curve

    g = load_graph_arg(graph)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
    rows = [p.row() for p in curve(g, points, time_limit=time_limit, workers=workers,
                                   log=lambda s: click.echo(s, err=True))]
    rows += [p.row() for p in heuristic_points(g)]
    if out:
        pd.DataFrame([{"graph": g.name, **r} for r in rows]).to_csv(Path(out) / CURVE, index=False)
        proven_curve(Path(out), Path(out))
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"peak / overhead on {g.name}")
    for col in ("planner", "max overhead %", "peak B", "overhead %", "bound B", "gap %", "status", "bound by"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["planner"], "" if r["max_overhead"] is None else f"{100 * r['max_overhead']:.2f}",
                      f"{r['peak_bytes']:,}", f"{100 * r['overhead']:.2f}",
                      "" if r["bound_bytes"] is None else f"{int(r['bound_bytes']):,}",
                      "" if r["gap"] is None else f"{100 * r['gap']:.2f}", verdict(r), r["bound_by"])
    Console(width=max(Console().width, 120)).print(table)


@click.command(name="max-batch")
@click.argument("spec", metavar="MODULE:FACTORY|GRAPH")
@click.option("--memory", required=True, help="Device memory in bytes (16GB, 512MiB... accepted).")
@click.option("--max-overhead", type=float, help="Accepted overhead (recompute cost / base cost); default: any.")
@click.option("--knob", default="batch", show_default=True,
              help="MODULE:FACTORY: the factory keyword that is the size (batch, seq...).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Other factory keywords (repeatable).")
@click.option("--scale-factor", "base", type=int, default=1, show_default=True,
              help="GRAPH: the size GRAPH was traced at; size s scales every activation's bytes by s / this "
                   "(parameters, i.e. persistent values, stay).")
@click.option("--max-size", type=int, default=1 << 16, show_default=True, help="Largest size tried.")
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="cpsat time limit per size, seconds.")
@click.option("--workers", type=int, default=2, show_default=True, help="Solver threads.")
@click.option("--json", "as_json", is_flag=True, help="Print the answers as JSON.")
def max_batch_cmd(spec: str, memory: str, max_overhead: float | None, knob: str, settings: tuple[str, ...],
                  base: int, max_size: int, time_limit: float, workers: int, as_json: bool) -> None:
    """The largest size (batch, or the --knob) whose plan fits in --memory within
    --max-overhead, for cpsat and every heuristic, side by side; cpsat's answer
    is proven when the next size up is proven not to fit in the staged space."""
    from ..studies.maxbatch import gain, max_batch, memoised, scaled_sizes

    mem = parse_bytes(memory)
    if max_overhead is not None and not max_overhead >= 0:
        raise RematoptError(f"--max-overhead must be >= 0, got {max_overhead}")
    if base < 1:
        raise RematoptError(f"--scale-factor must be a size >= 1, got {base}")
    if ":" in spec and not Path(spec).exists():
        graph_at = memoised(_tracer(spec, knob, settings))
    else:
        graph_at = scaled_sizes(load_graph_arg(spec), base)
    answers = max_batch(graph_at, mem, max_overhead=max_overhead, time_limit=time_limit, workers=workers,
                        max_size=max_size, log=lambda s: click.echo(s, err=True))
    ours = answers[-1].size
    if as_json:
        emit_json([{"planner": a.planner, "size": a.size, "peak_bytes": a.peak_bytes, "overhead": a.overhead,
                    "upper": a.upper, "proven": a.proven, "note": a.note, "rematopt_gain": gain(ours, a.size)}
                   for a in answers])
        return
    title = f"largest {knob if ':' in spec else 'size'} within {mem:,} B" + (
        f" and {100 * max_overhead:g}% overhead" if max_overhead is not None else "")
    table = Table(title=title)
    for col in ("planner", "size", "peak B", "overhead %", "cpsat larger by", "proof"):
        table.add_column(col, justify="right")
    for a in answers:
        g = gain(ours, a.size)
        table.add_row(a.planner, str(a.size), "" if a.peak_bytes is None else f"{a.peak_bytes:,}",
                      "" if a.overhead is None else f"{100 * a.overhead:.2f}",
                      "" if a.planner == "cpsat" or g is None else f"{100 * g:.1f}%",
                      (f"proven{a.note[a.note.find(';'):] if ';' in a.note else ''}" if a.proven
                       else f"<= {a.upper}: {a.note}") if a.planner == "cpsat" else a.note)
    Console(width=max(Console().width, 120)).print(table)


def _tracer(spec: str, knob: str, settings: tuple[str, ...]):
    """size -> the factory's training graph traced with ``knob`` = size."""
    from .jax import jax_api, key_values

    load_factory, trace_grad = jax_api("load_factory", "trace_grad")
    config = key_values(settings)

    def at(size: int):
        fn, args = load_factory(spec, **{**config, knob: size})
        return trace_grad(fn, *args, name=f"{spec.partition(':')[0].rsplit('.', 1)[-1]}_{knob}{size}",
                          meta={"model": spec, "config": {**config, knob: size}})

    return at
