"""``rematopt solve MODULE:FACTORY --verify xla``: plan a JAX factory's step
and check the plan on the step XLA compiles (:mod:`rematopt.xla.verify`)."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import click

from ..errors import ImportFailure, RematoptError
from ..xla import flags
from .common import check_writable, emit_json, figures_table, since_start

DEFAULT_TIME_LIMIT = 300.0  # seconds for the whole command when --time-limit is not given


def run(spec: str, settings: tuple[str, ...], argnums: tuple[int, ...], planner: str, budget_ratio: float | None,
        time_limit: float | None, output: str | None, as_json: bool, options: dict[str, Any]) -> None:
    """The ``--verify xla`` form of ``solve`` (its options as ``solve`` parsed them)."""
    if budget_ratio is None:
        raise RematoptError(f"{spec}: --verify xla takes --budget-ratio (a share of the compiled plain step's peak)")
    if not 0 < budget_ratio:
        raise RematoptError(f"{spec}: --budget-ratio must be positive, got {budget_ratio}")
    check_writable(output)
    # before JAX starts its backend: the CPU scheduler is read once, then (a CPU-only flag, inert elsewhere)
    flags.apply(flags.CPU_VERIFY)
    from .jax import jax_api, key_values

    load_factory, trace_grad = jax_api("load_factory", "trace_grad")
    from ..xla.verify import stock_policies, verify

    config = key_values(settings)
    fn, args = load_factory(spec, **config)
    say = (lambda line: click.echo(f"rematopt: {line}", err=True))
    name = spec.partition(":")[0].rsplit(".", 1)[-1]
    traced = trace_grad(fn, *args, argnums=argnums, name=name, meta={"model": spec, "config": config})
    try:
        graph, fallback = trace_grad(fn, *args, argnums=argnums, fuse="xla", name=name,
                                     meta={"model": spec, "config": config}), traced
        say(f"graph: {graph.n} nodes as XLA's compiled plain step materializes them (traced: {traced.n})")
    except ImportFailure as e:
        say(f"planning on the traced graph: the compiled graph failed ({e})")
        graph, fallback = traced, None
    left = (DEFAULT_TIME_LIMIT if time_limit is None else time_limit) - since_start()
    verdict = verify(fn, args, graph, planner, budget_ratio, time_limit=max(1.0, left), options=options,
                     stock=stock_policies(fn, per_layer(spec, config)), progress=say, fallback=fallback)
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
            click.echo(f"on the graph model: {chosen.status}, plan peak {chosen.plan_peak:,} B, "
                       f"{chosen.overhead:+.1%} recompute; the step as applied: {chosen.predicted_peak:,} B")
        figures_table(f"{planner} on {spec}, verified by XLA", {k: v for k, v in info.items()
                                                                if not isinstance(v, (list, dict))})
    if output and chosen.plan is None:
        click.echo(f"rematopt: {spec}: the answer is {chosen.label}, not a plan; {output} not written", err=True)


def per_layer(spec: str, config: dict) -> dict:
    """The factory's own per-layer stock policies, where it offers them (a
    ``remat`` keyword, ``models/``' convention), as loss functions by label."""
    from .. import jax as api
    from ..xla.verify import POLICIES

    module, _, attr = spec.partition(":")
    factory = getattr(sys.modules.get(module), attr, None)
    if factory is None or "remat" not in inspect.signature(factory).parameters and not _takes_remat(factory):
        return {}
    out = {}
    for name in POLICIES:
        try:
            out[f"{name}, per layer"] = api.load_factory(spec, **config, remat=name)[0]
        except ImportFailure as e:  # a factory may refuse per-layer remat (keras_lm says why): whole-step only
            click.echo(f"rematopt: no per-layer candidates: {e}", err=True)
            return {}
    return out


def _takes_remat(factory) -> bool:
    """``factory(**overrides)`` checks the keys against its CONFIG: a ``remat`` key there is offered."""
    config = getattr(sys.modules.get(factory.__module__), "CONFIG", None)
    return isinstance(config, dict) and "remat" in config
