"""MLIR commands: ``import mlir`` (a function of a module -> graph) and
``export mlir`` (a plan applied to the function, written as MLIR)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import drop_unsafe_marks_option


@click.command(name="mlir")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--function", "function", help="Function to read (default: main, else the only public one).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
@drop_unsafe_marks_option
def import_mlir_cmd(file: str, function: str | None, output: str, drop_unsafe_marks: bool) -> None:
    """Convert one function of an MLIR module (StableHLO, tessera...)."""
    from ..importers.mlir import import_mlir

    g = import_mlir(file, function=function, drop_unsafe_marks=drop_unsafe_marks)
    g.save(output)
    click.echo(f"wrote {output}: {g.n} nodes, {len(g.edges)} edges")
    if g.meta.get("no_phases"):
        click.echo(f"rematopt: warning: {file}: {g.meta['no_phases']}", err=True)


@click.command(name="mlir")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--function", "function", help="Function the plan is for (default: as import mlir).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
@click.option("--xla/--no-xla", default=None,
              help="Write what XLA reads: optimization barriers pinning the recomputations and host-offload "
                   "annotations (default: when the function is StableHLO).")
@click.option("--check-xla", is_flag=True,
              help="Compile FILE and the output with jaxlib's XLA (CSE off on CPU): recomputations kept and "
                   "computed at the clones' FLOPs (the module's FLOPs rise reported); exit 1 if either is off.")
@drop_unsafe_marks_option
def export_mlir_cmd(file: str, plan: str, function: str | None, output: str, xla: bool | None, check_xla: bool,
                    drop_unsafe_marks: bool) -> None:
    """Apply PLAN to FILE: recomputations as clones, figures as tessera.remat_* attributes."""
    from ..exporters.mlir import export_mlir
    from ..plan import Plan
    from .common import check_writable, figures_table

    check_writable(output)
    text = export_mlir(file, Plan.load(plan), function=function, plan_source=plan,
                       drop_unsafe_marks=drop_unsafe_marks, xla=xla)
    Path(output).write_text(text)
    click.echo(f"wrote {output}")
    if check_xla:
        from ..exporters.xla_check import check_export

        result = check_export(file, output, function=function)
        figures_table(f"XLA on {output}", result.summary())
        if not result.ok:
            sys.exit(1)
