"""JAX commands: ``import jax`` (a factory's training step to a graph) and
``jax-measure`` (XLA's memory and FLOPs under JAX's policies and rematopt's plans)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ImportFailure
from ..importers.costmodel import DEVICES
from .common import check_writable, load_graph_arg

_DEVICES = sorted(DEVICES)


def key_values(pairs: tuple[str, ...]) -> dict:
    """``("layers=4", "seq=64")`` -> ``{"layers": 4, "seq": 64}`` (values read as JSON when they parse)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ImportFailure(f"--set {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


_set_option = click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                           help="Factory keyword argument (repeatable), e.g. --set layers=4.")
_device_option = click.option("--device", type=click.Choice(_DEVICES), default="a100", show_default=True,
                              help="Roofline device profile for node costs.")


@click.command(name="jax")
@click.argument("spec", metavar="MODULE:FACTORY")
@click.option("--fuse", type=click.Choice(["table", "xla"]), is_flag=False, flag_value="table", default=None,
              help="Nodes as XLA materializes them: 'xla' learns it from the compiled plain step (each kernel "
                   "mapped back to its equations); 'table' (a bare --fuse) folds the ops a fixed table calls cheap.")
@click.option("--no-unroll", is_flag=True,
              help="Keep each scan / static while loop one opaque node (default: one node per iteration's op).")
@_device_option
@click.option("--name", help="Graph name (default: the factory's module).")
@click.option("--argnums", default="0", show_default=True, help="Differentiated arguments, e.g. 0 or 0,1.")
@_set_option
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
def import_jax(spec: str, fuse: str | None, no_unroll: bool, device: str, name: str | None, argnums: str,
               settings: tuple[str, ...], output: str) -> None:
    """Trace FACTORY's training step, jax.value_and_grad(loss_fn)(*example_args), as a graph.

    FACTORY is a callable returning (loss_fn, example_args); MODULE is imported
    with the current directory on the path (e.g. models.gpt:factory).
    """
    load_factory, trace_grad = jax_api("load_factory", "trace_grad")
    config = key_values(settings)
    fn, args = load_factory(spec, **config)
    nums = parse_argnums(argnums)
    g = trace_grad(fn, *args, argnums=nums, fuse={None: False, "table": True}.get(fuse, fuse), device=device,
                   name=name or spec.partition(":")[0].rsplit(".", 1)[-1],
                   meta={"model": spec, "config": config}, unroll=not no_unroll)
    g.save(output)
    sizes = f"{g.meta['nodes']} nodes fused from {g.meta['nodes_unfused']}" if fuse else f"{g.n} nodes"
    click.echo(f"wrote {output}: {sizes}, {len(g.edges)} edges, "
               f"{g.meta['residuals']['count']} residuals ({g.meta['residuals']['bytes']:,} B)")


def jax_api(*names: str):
    """Names from :mod:`rematopt.jax`; jax is an optional extra."""
    try:
        from .. import jax as api
    except ModuleNotFoundError as e:
        raise ImportFailure(f"the JAX front end needs jax ({e}); pip install 'rematopt[jax]'") from None
    return [getattr(api, n) for n in names]


def parse_argnums(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ImportFailure(f"--argnums {text!r}: expected integers separated by commas") from None


@click.command(name="jax-measure")
@click.argument("spec", metavar="MODULE:FACTORY")
@click.option("--budget-ratio", type=float, required=True, help="Plan budget as a fraction of the no-remat peak.")
@_device_option
@click.option("--fuse", is_flag=True, help="Plan on the fused graph.")
@click.option("--planner", "planners", multiple=True, default=("greedy", "cpsat"), show_default=True,
              help="rematopt planners to compare (repeatable).")
@click.option("--time-limit", type=float, default=20.0, show_default=True, help="cpsat time limit, seconds.")
@click.option("--argnums", default="0", show_default=True, help="Differentiated arguments, e.g. 0 or 0,1.")
@_set_option
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the Markdown table here.")
def jax_measure(spec: str, budget_ratio: float, device: str, fuse: bool, planners: tuple[str, ...],
                time_limit: float, argnums: str, settings: tuple[str, ...], output: str | None) -> None:
    """Compile FACTORY's step with XLA under no checkpointing, JAX's policies and
    rematopt's plans; print XLA's temp bytes and FLOPs for each (Markdown)."""
    load_factory, measure = jax_api("load_factory", "measure")
    config = key_values(settings)
    fn, args = load_factory(spec, **config)
    m = measure(fn, *args, budget_ratio=budget_ratio, argnums=parse_argnums(argnums), planners=planners,
                time_limit=time_limit, fuse=fuse, device=device)
    text = m.markdown(f"{spec} {json.dumps(config) if config else ''}".strip())
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)


@click.command(name="jax-policy")
@click.argument("graph", type=click.Path(dir_okay=False))
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["python", "json"]), default="python", show_default=True,
              help="The jax.checkpoint_policies call, or {name: device|offload|remat} (MaxText's custom policy).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write here instead of printing.")
def export_jax_policy(graph: str, plan: str, fmt: str, output: str | None) -> None:
    """PLAN as the checkpoint_name policy that saves what it saves (plans of --planner jax-names)."""
    from ..exporters.checkpoint_names import policy_json, policy_source, policy_table
    from ..plan import Plan

    g, p = load_graph_arg(graph), Plan.load(plan)
    try:
        table = policy_table(g, p)
    except ModuleNotFoundError as e:  # reading a plan's fates uses the JAX exporter
        raise ImportFailure(f"export jax-policy needs jax ({e}); pip install 'rematopt[jax]'") from None
    text = policy_json(table) if fmt == "json" else policy_source(table)
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)


@click.command(name="jax-policies")
@click.argument("graphs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--ratios", default="0.9,0.8,0.7,0.6", show_default=True, help="Budget ratios.")
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="jax-names search limit, seconds.")
@click.option("--cpsat-time-limit", type=float, default=0.0, show_default=True,
              help="Also run the unconstrained cpsat planner with this limit (0: skip).")
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the Markdown table here.")
def jax_policies(graphs: tuple[str, ...], ratios: str, time_limit: float, cpsat_time_limit: float, workers: int,
                 output: str | None) -> None:
    """The best checkpoint_name policy (global and per layer) against MaxText's
    presets, JAX's dots_saveable / nothing_saveable and cpsat, per budget ratio."""
    from ..studies.policies import markdown, rows

    try:
        values = [float(r) for r in ratios.split(",")]
    except ValueError:
        raise ImportFailure(f"--ratios {ratios!r}: expected numbers separated by commas") from None
    check_writable(output)
    records = [r for path in graphs
               for r in rows(load_graph_arg(path), values, time_limit, cpsat_time_limit, workers)]
    text = markdown(records)
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)
