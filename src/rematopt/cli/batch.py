"""Commands ``rematopt batch`` (many graphs x budgets x planners) and
``rematopt report`` (tables and figures from a batch's results)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .. import planners
from ..errors import RematoptError
from .core import parse_bytes, planner_options


def comma_floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RematoptError(f"--budget-ratios: cannot read {text!r} as comma-separated numbers") from None


@click.command(name="batch")
@click.argument("graphs", nargs=-1, required=True, metavar="GRAPHS_OR_FACTORIES...")
@click.option("--planners", "planner_list", default="all", show_default=True,
              help="Comma-separated planner names, or 'all' for every planner available here.")
@click.option("--budget-ratios", default="0.9,0.8,0.7,0.6,0.5", show_default=True,
              help="Budgets as fractions of each graph's no-remat peak (--verify xla: of the compiled plain step's).")
@click.option("--verify", type=click.Choice(["xla"]),
              help="The inputs are JAX MODULE:FACTORY specs: each job runs solve's closed loop (plan, apply, "
                   "compile with the installed XLA, re-plan) and its row says whether the compiled step fits.")
@click.option("--set", "factory_settings", multiple=True, metavar="KEY=VALUE",
              help="--verify: keyword argument for every factory (repeatable), as for solve --verify xla.")
@click.option("--argnums", default="0", show_default=True, help="--verify: differentiated arguments, e.g. 0 or 0,1.")
@planner_options(exclude=("hint", "log_path", "time_limit"))  # the batch sets these per job
@click.option("--time-limit", type=float, default=60.0, show_default=True,
              help="Per-job solver time limit, seconds (--verify xla: the job's whole loop); a worker is killed at "
                   "this plus --timeout-margin.")
@click.option("--timeout-margin", type=float, default=30.0, show_default=True,
              help="Seconds a job may run past --time-limit before its worker is killed.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Jobs run at once (with dask: tasks in flight on the cluster).")
@click.option("--memory-limit", default="4GiB", show_default=True, help="Address-space cap per job (0: none).")
@click.option("--exact-max-nodes", type=int, help="Skip exact planners (cpsat) on graphs with more nodes.")
@click.option("--out", "-o", "out", required=True, type=click.Path(file_okay=False), help="Results directory.")
@click.option("--resume", is_flag=True,
              help="Continue the batch in --out: jobs with an answer (OPTIMAL, FEASIBLE, OVER_BUDGET, INFEASIBLE, "
                   "INFEASIBLE_BUDGET, UNKNOWN) are kept; new, failed (ERROR, CRASH, OOM, TIMEOUT) and SKIPPED "
                   "jobs run, a rerun's row replacing the old one.")
@click.option("--executor", type=click.Choice(["local", "dask"]), default="local", show_default=True)
@click.option("--scheduler", help="dask scheduler address (with --executor dask).")
def batch_cmd(graphs: tuple[str, ...], planner_list: str, budget_ratios: str, verify: str | None,
              factory_settings: tuple[str, ...], argnums: str, time_limit: float, timeout_margin: float, jobs: int,
              memory_limit: str, exact_max_nodes: int | None, out: str, resume: bool, executor: str,
              scheduler: str | None, **options: Any) -> None:
    """Run every (input, budget, planner) job and append one row per job to
    OUT/results.jsonl. The inputs are graph files or directories of *.json /
    *.mlir; with --verify xla, JAX MODULE:FACTORY specs instead (e.g.
    models.gpt:factory), each job's budget a share of the compiled plain
    step's peak."""
    from ..studies import batch, batch_verify

    names = planners.available() if planner_list == "all" else [p.strip() for p in planner_list.split(",") if p.strip()]
    if not names:
        raise RematoptError("--planners: no planner named")
    if jobs < 1:
        raise RematoptError(f"--jobs must be >= 1, got {jobs}")
    err = Console(stderr=True)
    say = (lambda line: click.echo(f"rematopt: {line}", err=True))
    options["time_limit"] = time_limit
    ratios = comma_floats(budget_ratios)
    limits = dict(memory_limit=parse_bytes(memory_limit) or None, timeout_margin=timeout_margin,
                  default_workers=max(1, (os.cpu_count() or 1) // jobs))
    if verify:
        if exact_max_nodes is not None:
            raise RematoptError("--exact-max-nodes: graph inputs only (a --verify xla graph is made in the batch)")
        from ..xla import flags
        from .jax import key_values, parse_argnums

        flags.apply(flags.CPU_VERIFY)  # before any JAX backend starts; the workers inherit it
        factories = batch_verify.load_factories(graphs, key_values(factory_settings), parse_argnums(argnums))
        plan = batch_verify.plan_verified(factories, names, ratios, out, options, resume=resume, **limits)
        Path(out).mkdir(parents=True, exist_ok=True)
        batch_verify.prepare_jobs(plan, factories, say)
        sources, what = [f.spec for f in factories], "factories"
    else:
        if factory_settings:
            raise RematoptError("--set configures JAX factories: it goes with --verify xla")
        for g in graphs:
            if batch_verify.is_factory_spec(g):
                raise RematoptError(f"{g}: a JAX MODULE:FACTORY input goes with --verify xla "
                                    f"(or trace it first: rematopt import jax {g} -o GRAPH.json)")
        inputs, skipped = batch.load_inputs(graphs)
        for path, reason in skipped:
            err.print(f"[yellow]skipped[/] {path}: {reason}", markup=True, highlight=False)
        if not inputs:
            raise RematoptError(f"{', '.join(graphs)}: no graph files found")
        plan = batch.plan_batch(inputs, names, ratios, out, options, resume=resume, exact_max_nodes=exact_max_nodes,
                                **limits)
        sources, what = [str(g.path) for g in inputs], "graphs"
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    record_command(out_dir, names, sources)
    total = len(plan.specs) + len(plan.skipped)
    err.print(f"{len(sources)} {what} x {len(ratios)} budgets x {len(names)} planners: "
              f"{total} jobs to run ({len(plan.rerun)} of them again), {len(plan.done)} already done",
              highlight=False)
    counts: dict[str, int] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=False) as bar:
        task = bar.add_task("batch", total=total)

        def on_row(row: dict[str, Any]) -> None:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            bar.update(task, advance=1,
                       description=f"{row['graph'][:24]} r={row['budget_ratio']:g} {row['planner']}: {row['status']}")

        batch.run_batch(plan, out, jobs=jobs, executor=executor, scheduler=scheduler, on_row=on_row)
    click.echo(f"wrote {out_dir / batch.RESULTS} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'no new rows'})")


def record_command(out: Path, names: list[str], sources: list[str]) -> None:
    """Keep the command line that made the results, for the report's index."""
    path = out / "batch.json"
    history = json.loads(path.read_text()) if path.exists() else []
    history.append({"command": shlex.join(["rematopt", *sys.argv[1:]]), "cwd": os.getcwd(),
                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "planners": names, "graphs": sources})
    path.write_text(json.dumps(history, indent=1) + "\n")


@click.command(name="report")
@click.argument("results_dir", type=click.Path(file_okay=False))
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False), help="Report directory.")
@click.option("--title", default=None, help="Report title (default: the report directory's name).")
@click.option("--setup", multiple=True, metavar="COMMAND",
              help="A command that made some of the batch's input graphs, listed first under 'How it was made' "
                   "(repeatable), e.g. \"rematopt import jax models.gpt:factory --set layers=48 -o g/gpt48.json\".")
def report_cmd(results_dir: str, output: str, title: str | None, setup: tuple[str, ...]) -> None:
    """Tables (Markdown and CSV), figures (PNG), index.md and a self-contained
    index.html from a batch's RESULTS_DIR."""
    from ..studies.report import write_report

    index = write_report(results_dir, output, title=title, setup=list(setup),
                         command=shlex.join(["rematopt", *sys.argv[1:]]))
    click.echo(f"wrote {index} and {index.with_suffix('.html')}")
