"""The JAX front end: traced programs become graphs (``rematopt.jax`` is the public face).

``flatten`` inlines nested jaxprs into one equation list, ``cost`` prices each
equation on the shared roofline model, ``step`` splits a training step into
forward and backward the way ``jax.vjp`` does and builds the graph.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ...graph import Graph
from ..costmodel import DEFAULT_DEVICE
from .step import Step, to_graph, trace_program, trace_step


def trace_grad(loss_fn: Callable, *example_args: Any, argnums: int | Sequence[int] = 0,
               name: str | None = None, fuse: bool | str = False, device: str = DEFAULT_DEVICE,
               persistent_params: bool = True, meta: dict | None = None, unroll: bool = True,
               kwargs: dict | None = None) -> Graph:
    """The graph of one training step, ``jax.value_and_grad(loss_fn, argnums)(*example_args, **kwargs)``.

    Forward equations get ``phase: "forward"``, backward ones ``"backward"``;
    argument leaves are input nodes, and the differentiated ones (the
    parameters, which the training loop keeps) are ``persistent`` unless
    ``persistent_params`` is false. The loss and the gradients are outputs.

    ``scan`` and ``while`` loops with a static trip count are unrolled (each
    iteration's operations are nodes, tagged with their ``iteration``; stacked
    arguments a scan slices become one input node per slice) unless ``unroll``
    is false, which keeps each loop one opaque node.

    ``fuse`` says what a node is: one equation (False); a consumer with the cheap
    elementwise producers a fixed table folds into it (True); or what XLA's kernels
    materialize (``"xla"``): the step is compiled once for the default backend with
    each equation under a scope naming it, every equation whose result a kernel
    writes heads a node, the others join each node whose kernel computes them
    (free, and never kept alone), and nodes come in XLA's schedule order. The
    graph's ``meta.groups`` records the equations of each node (``apply_plan``
    retraces the step on them) and ``meta.xla`` what XLA said about the compile.

    Raises ImportFailure if the function cannot be traced or its loss is not a
    float scalar.
    """
    step = trace_step(loss_fn, example_args, argnums, fuse, unroll, kwargs)
    return to_graph(step, name or getattr(loss_fn, "__name__", "step"), device,
                    [d and persistent_params for d in step.diff_leaves], meta)


def trace(fn: Callable, *example_args: Any, name: str | None = None, fuse: bool | str = False,
          device: str = DEFAULT_DEVICE, meta: dict | None = None, unroll: bool = True) -> Graph:
    """The graph of ``fn(*example_args)`` taken as it is (no phases); loops as in :func:`trace_grad`."""
    step = trace_program(fn, example_args, fuse, unroll)
    return to_graph(step, name or getattr(fn, "__name__", "fn"), device, None, meta)


__all__ = ["Step", "trace", "trace_grad", "trace_program", "trace_step"]
