"""``rematopt solve MODULE:FACTORY --verify xla``: plan a JAX factory's step
and check the plan on the step XLA compiles (:mod:`rematopt.xla.verify`)."""

from __future__ import annotations

from typing import Any

import click

from ..errors import RematoptError
from ..xla import flags
from .common import check_writable, emit_json, figures_table, since_start

DEFAULT_TIME_LIMIT = 300.0  # seconds for the whole command when --time-limit is not given


def run(spec: str, settings: tuple[str, ...], argnums: tuple[int, ...], planner: str, budget_ratio: float | None,
        time_limit: float | None, output: str | None, as_json: bool, options: dict[str, Any],
        deterministic_time: float | None = None) -> None:
    """The ``--verify xla`` form of ``solve`` (its options as ``solve`` parsed them;
    ``deterministic_time``: the loop's, :func:`~rematopt.xla.verify.verify`)."""
    if budget_ratio is None:
        raise RematoptError(f"{spec}: --verify xla takes --budget-ratio (a share of the compiled plain step's peak)")
    if not 0 < budget_ratio:
        raise RematoptError(f"{spec}: --budget-ratio must be positive, got {budget_ratio}")
    if deterministic_time is not None and not 0 <= deterministic_time < float("inf"):
        raise RematoptError(f"{spec}: --deterministic-time must be a finite number >= 0, got {deterministic_time}")
    if deterministic_time is not None and (options.get("workers") or 1) > 1:  # before anything compiles
        raise RematoptError(f"{spec}: --deterministic-time runs the planner on one worker, not --workers "
                            f"{options['workers']}")
    check_writable(output)
    # before JAX starts its backend: the CPU scheduler is read once, then (a CPU-only flag, inert elsewhere)
    flags.apply(flags.CPU_VERIFY)
    from ..xla.factory import load_step, plan_graphs
    from ..xla.verify import verify
    from .jax import key_values

    say = (lambda line: click.echo(f"rematopt: {line}", err=True))
    step = load_step(spec, key_values(settings), argnums, say)
    config = step.config
    graph, fallback = plan_graphs(step, say)
    left = (DEFAULT_TIME_LIMIT if time_limit is None else time_limit) - since_start()
    verdict = verify(step.fn, step.args, graph, planner, budget_ratio, time_limit=max(1.0, left), options=options,
                     stock=step.stock, progress=say, fallback=fallback, deterministic_time=deterministic_time)
    chosen = verdict.chosen
    if output and chosen.plan is not None:
        chosen.plan.save(output)
    info = {"model": spec, "config": config, "planner": planner, **verdict.summary(),
            "plan": output if output and chosen.plan is not None else None}
    if as_json:
        emit_json(info)
    else:
        click.echo(verdict.headline())
        if chosen.kind == "plan":
            applied = "" if chosen.predicted_peak is None else f"; the step as applied: {chosen.predicted_peak:,} B"
            click.echo(f"on the graph model: {chosen.status}, plan peak {chosen.plan_peak:,} B, "
                       f"{chosen.overhead:+.1%} recompute{applied}")
            if not chosen.ordered:
                click.echo("compiled in XLA's own order (untied): apply it with apply_plan(..., ordered=False)")
            if not chosen.as_planned:
                click.echo("compiled with each value computed once: apply it with apply_plan(..., as_planned=False)")
        figures_table(f"{planner} on {spec}, verified by XLA", {k: v for k, v in info.items()
                                                                if not isinstance(v, (list, dict))})
    if output and chosen.plan is None:
        click.echo(f"rematopt: {spec}: the answer is {chosen.label}, not a plan; {output} not written", err=True)


