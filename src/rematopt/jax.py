"""rematopt for JAX programs (``pip install rematopt[jax]``).

- :func:`trace_grad` / :func:`trace`: a training step or any function as a graph
  (a primitive rematopt has no table entry for is priced from its shapes, and
  :class:`GuessedPrimitive` warns once per primitive);
- :func:`apply_plan`: a plan back into JAX as a loss function whose gradient
  keeps, offloads and recomputes what the plan says (loops the plan treats
  alike stay scanned; :class:`UnrolledLoop` warns where they cannot);
- :func:`policy` / :func:`policy_table`: a plan as a ``checkpoint_name`` policy
  for ``jax.checkpoint(..., policy=...)`` (plans of the ``jax-names`` planner);
- :func:`measure`: XLA's memory and FLOPs under JAX's policies and rematopt's plans;
- :func:`load_factory`: ``"MODULE:FACTORY"`` -> ``(loss_fn, example_args)``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from .errors import ImportFailure
from .exporters.checkpoint_names import policy, policy_table
from .exporters.jax_measure import Measurement, measure
from .exporters.jax_loops import LoopNote
from .exporters.jax_policy import Fates, UnrolledLoop, apply_plan, residual_fates
from .importers.jaxpr import trace, trace_grad
from .importers.jaxpr.primitives import GuessedPrimitive


def import_factory(spec: str) -> Callable:
    """Import ``MODULE:FACTORY`` (the current directory first on the path)
    without calling it; ImportFailure naming ``spec`` when that fails."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImportFailure(f"{spec}: expected MODULE:FACTORY, e.g. models.gpt:factory")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportFailure(f"{spec}: cannot import {module_name} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ImportFailure(f"{spec}: {module_name} has no callable {attr}")
    return factory


def load_factory(spec: str, **config: Any) -> tuple[Callable, tuple]:
    """Import ``MODULE:FACTORY`` (:func:`import_factory`) and call it with
    ``config``; ImportFailure unless it returns ``(loss_fn, args)``."""
    factory = import_factory(spec)
    try:
        made = factory(**config)
    except TypeError as e:
        raise ImportFailure(f"{spec}: calling the factory failed ({e})") from None
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise ImportFailure(f"{spec}: the factory must return (loss_fn, example_args)")
    fn, args = made
    return fn, tuple(args) if isinstance(args, (tuple, list)) else (args,)


__all__ = ["Fates", "GuessedPrimitive", "LoopNote", "Measurement", "UnrolledLoop", "apply_plan", "import_factory",
           "load_factory", "measure", "policy", "policy_table", "residual_fates", "trace", "trace_grad"]
