"""What a JAX user gets from ``jax.checkpoint`` over the whole forward pass,
with one of its stock policies (``jax.checkpoint_policies``):

- ``jax-nothing-saveable``: save no residual; recompute all of them.
- ``jax-dots-saveable``: save the outputs of matrix multiplies and
  convolutions (expensive to recompute, cheap to keep relative to their FLOPs).
- ``jax-offload-dots``: offload those outputs to host right after they are
  computed, free the device copy after its last forward read, and prefetch it
  (once) right before its first backward use. A dot without backward readers
  stays on the device, as it would under any policy.

Everything not saved is recomputed for the backward pass: each late consumer's
missing forward inputs are recomputed from saved values right before it and
dropped right after it (:func:`~rematopt.planners.frees.keep_schedule`;
"late" is defined by :func:`~rematopt.planners.frees.late_rule`, so graphs
without phases count as all-forward). Inputs, outputs and non-recomputable
values are always kept; a non-offloadable dot is kept on the device.

Which nodes are "dots" is decided by ``node.op`` alone (the name after the
last ``.``, lower-cased, so ``stablehlo.dot_general`` and ``tessera.matmul``
count): see :func:`is_dot`. Graphs whose nodes carry no op (the published
node-link graphs) have no dots, so there the dots policies save nothing.
"""

from __future__ import annotations

import re
from typing import Any

from ...graph import Graph
from ...plan import OFFLOAD, Plan
from ..frees import drop_points, has_late_reads, keep_schedule, place_frees
from ..options import NoOptions

Options = NoOptions  # takes none

# jax.lax primitives, XLA/StableHLO ops and the MLIR dialects' spellings.
DOT_OPS = frozenset({"dot", "dot_general", "matmul", "batch_matmul", "batched_matmul", "gemm",
                     "batched_gemm", "conv", "convolution", "conv_general_dilated"})
# Variants such as linalg.matmul_transpose_b or linalg.conv_2d_nhwc_hwcf.
DOT_PATTERN = re.compile(r"(batch(ed)?_)?(matmul|gemm)_\w+|conv_?[123]d(_\w+)?")


def is_dot(op: str) -> bool:
    """Matrix multiply or convolution, by op name (``convert`` is not a conv)."""
    base = op.lower().rsplit(".", 1)[-1]
    return base in DOT_OPS or DOT_PATTERN.fullmatch(base) is not None


def _dots(graph: Graph) -> list[int]:
    return [v.id for v in graph.nodes if not v.is_input and is_dot(v.op)]


def plan_nothing_saveable(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    return place_frees(graph, keep_schedule(graph, ()), "jax-nothing-saveable", budget)


def plan_dots_saveable(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    saved = _dots(graph)
    return place_frees(graph, keep_schedule(graph, saved), "jax-dots-saveable", budget,
                       {"saved": [graph.nodes[i].name for i in saved]})


def plan_offload_dots(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    late = has_late_reads(graph, drop_points(graph))
    dots = [i for i in _dots(graph) if late[i]]  # a dot nobody reads late stays put
    to_host = [i for i in dots if graph.nodes[i].offloadable]
    kept = [i for i in dots if not graph.nodes[i].offloadable]
    schedule = keep_schedule(graph, kept, offload=to_host)
    offloaded = sorted({u for op, u in schedule if op == OFFLOAD})
    return place_frees(graph, schedule, "jax-offload-dots", budget,
                       {"offloaded": [graph.nodes[i].name for i in offloaded],
                        "saved": [graph.nodes[i].name for i in kept]})
