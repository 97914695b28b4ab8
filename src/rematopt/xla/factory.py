"""A JAX factory's step as the closed loop takes it: the loss and example
arguments, the stock-policy candidates (per layer where the model offers
them), and the graph to plan on (XLA's compiled plain step, else the traced
one). ``solve --verify xla`` and ``batch --verify xla`` load a factory this
one way; the caller sets XLA's flags first (:func:`rematopt.xla.flags.apply`)."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ImportFailure
from ..graph import Graph


@dataclass(frozen=True)
class FactoryStep:
    """``factory(**config)``'s loss and arguments, and its stock candidates."""

    spec: str
    config: dict[str, Any]
    fn: Callable
    args: tuple
    argnums: tuple[int, ...]
    stock: dict[str, Callable]

    @property
    def name(self) -> str:
        return self.spec.partition(":")[0].rsplit(".", 1)[-1]


def load_step(spec: str, config: dict[str, Any], argnums: tuple[int, ...] = (0,),
              say: Callable[[str], None] = lambda line: None) -> FactoryStep:
    """Call the factory; ImportFailure (one line naming ``spec``) when it
    cannot be imported, is not callable or refuses ``config``."""
    from ..jax import load_factory
    from .verify import stock_policies

    fn, args = load_factory(spec, **config)
    return FactoryStep(spec, dict(config), fn, args, tuple(argnums), stock_policies(fn, per_layer(spec, config, say)))


def plan_graphs(step: FactoryStep, say: Callable[[str], None] = lambda line: None) -> tuple[Graph, Graph | None]:
    """``(graph, fallback)``: the compiled graph and the traced one to fall
    back on when a plan of it does not apply, or the traced graph alone
    when the compiled one cannot be made (said through ``say``)."""
    from ..jax import trace_grad

    meta = {"model": step.spec, "config": step.config}
    traced = trace_grad(step.fn, *step.args, argnums=step.argnums, name=step.name, meta=meta)
    try:
        graph = trace_grad(step.fn, *step.args, argnums=step.argnums, fuse="xla", name=step.name, meta=meta)
    except ImportFailure as e:
        say(f"planning on the traced graph: the compiled graph failed ({e})")
        return traced, None
    say(f"graph: {graph.n} nodes as XLA's compiled plain step materializes them (traced: {traced.n})")
    return graph, traced


def per_layer(spec: str, config: dict, say: Callable[[str], None] = lambda line: None) -> dict[str, Callable]:
    """The factory's own per-layer stock policies, where it offers them (a
    ``remat`` keyword, ``models/``' convention), as loss functions by label."""
    from .. import jax as api
    from .verify import POLICIES

    module, _, attr = spec.partition(":")
    factory = getattr(sys.modules.get(module), attr, None)
    if factory is None or "remat" not in inspect.signature(factory).parameters and not _takes_remat(factory):
        return {}
    out = {}
    for name in POLICIES:
        try:
            out[f"{name}, per layer"] = api.load_factory(spec, **config, remat=name)[0]
        except ImportFailure as e:  # a factory may refuse per-layer remat (saying why): whole-step only
            say(f"no per-layer candidates: {e}")
            return {}
    return out


def _takes_remat(factory) -> bool:
    """``factory(**overrides)`` checks the keys against its CONFIG: a ``remat`` key there is offered."""
    config = getattr(sys.modules.get(factory.__module__), "CONFIG", None)
    return isinstance(config, dict) and "remat" in config
