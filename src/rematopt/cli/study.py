"""``rematopt study gaps``: every heuristic against cpsat's bound, batch and
report in one command (:mod:`rematopt.studies.gaps`)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import RematoptError
from .batch import comma_floats, record_command


@click.group(name="study")
def study_group() -> None:
    """Studies over many graphs, each a batch and its report."""


@study_group.command(name="gaps")
@click.argument("graphs", nargs=-1, type=click.Path())
@click.option("--decoders", default="gpt48,gpt48_fused", show_default=True,
              help="48-layer decoders to add (made in --graph-folder with JAX on first use; '' for none).")
@click.option("--graph-folder", default="results/graphs", show_default=True, type=click.Path(file_okay=False),
              help="Where the decoders are made.")
@click.option("--budget-ratios", default="0.9,0.8,0.7,0.6,0.5", show_default=True)
@click.option("--time-limit", type=float, default=120.0, show_default=True,
              help="Per-job limit, seconds: cpsat's search (and dtr's).")
@click.option("--deterministic-time", type=click.FloatRange(min=0), default=None,
              help="cpsat's --deterministic-time per job (one worker): bounds that do not depend on the "
                   "machine's load; --time-limit still ends a job first if it comes first.")
@click.option("--timeout-margin", type=float, default=60.0, show_default=True)
@click.option("--jobs", "-j", type=int, default=2, show_default=True)
@click.option("--results", default="results/gap_study", show_default=True, type=click.Path(file_okay=False),
              help="The batch's results directory.")
@click.option("--resume", is_flag=True, help="Continue the batch in --results.")
@click.option("--report-only", is_flag=True, help="Write the report from --results without running anything.")
@click.option("--output", "-o", default="reports/gap_study", show_default=True, type=click.Path(file_okay=False))
def gaps_cmd(graphs: tuple[str, ...], decoders: str, graph_folder: str, budget_ratios: str, time_limit: float,
             deterministic_time: float | None, timeout_margin: float, jobs: int, results: str, resume: bool,
             report_only: bool, output: str) -> None:
    """Run every registered planner over GRAPHS (default: the published graphs
    in ../shared/benchmarks/nodelink and instances/) and the decoders at each
    budget ratio, then write the certified gap report to OUTPUT."""
    from ..studies import gaps

    def warn(message: str) -> None:
        click.echo(f"rematopt: {message}", err=True)

    out, res = Path(output), Path(results)
    if not report_only:
        if jobs < 1:
            raise RematoptError(f"--jobs must be >= 1, got {jobs}")
        names = [d.strip() for d in decoders.split(",") if d.strip()]
        paths = gaps.graph_paths(graphs or gaps.SOURCES, names, Path(graph_folder),
                                 warn)
        if not paths:
            raise RematoptError("no graphs to study")
        counts: dict[str, int] = {}

        def on_row(row: dict[str, Any]) -> None:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            click.echo(f"{row['graph'][:28]} r={row['budget_ratio']:g} {row['planner']}: {row['status']}", err=True)

        from .. import planners
        from ..studies.batch import load_inputs, run_batch

        inputs, skipped = load_inputs(paths)
        for path, reason in skipped:
            warn(f"skipped {path}: {reason}")
        batch = gaps.jobs(inputs, comma_floats(budget_ratios), res, time_limit, resume, timeout_margin,
                          max(1, (os.cpu_count() or 1) // jobs), deterministic_time)
        res.mkdir(parents=True, exist_ok=True)
        record_command(res, planners.available(), [str(g.path) for g in inputs])
        run_batch(batch, res, jobs=jobs, on_row=on_row)
        click.echo(f"wrote {res / 'results.jsonl'} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    from ..studies.report import commands

    made = commands(res, shlex.join(["rematopt", *sys.argv[1:]]) if report_only else None)
    index = gaps.write(res, out, made)
    click.echo(f"wrote {index} and {index.with_suffix('.html')}")
