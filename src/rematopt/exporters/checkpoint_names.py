"""Plans as ``checkpoint_name`` policies a JAX user puts in their own code.

A plan's policy is read off its events: a named forward value the backward
pass reads from its forward copy is ``device`` (``offload`` if the plan
offloads it), one it recomputes is ``remat``, and one it never reads may be
either (no policy saves it). Names whose fate is the same in every layer give
one policy (``{name: fate}``, MaxText's ``custom`` remat
policy shape); otherwise the policy is per layer (``{"per_layer": [...]}``),
one ``jax.checkpoint`` policy per layer's block.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..errors import PlanError
from ..graph import Graph
from ..plan import Plan
from ..planners.policies.space import layers, no_names

OFFLOAD_SRC, OFFLOAD_DST = "device", "pinned_host"  # JAX's memory kinds


def policy_table(graph: Graph, plan: Plan) -> dict[str, Any]:
    """``{name: fate}``, or ``{"per_layer": [{name: fate}, ...]}`` when a
    name's fate differs between layers. PlanError if the graph has no names
    or a name's fate differs within one layer."""
    from .jax_policy import residual_fates

    where = layers(graph)
    if not where:
        raise PlanError(no_names(graph))
    fates = residual_fates(graph, plan)
    per: dict[tuple[str, int], set[str]] = {}
    for i, layer in where.items():
        name = graph.nodes[i].extra["checkpoint_name"]
        fate = ("offload" if i in fates.offloaded else "device" if i in fates.kept
                else "remat" if i in fates.recomputed else None)
        if fate in ("device", "offload") and graph.nodes[i].extra.get("read_before_name"):
            raise PlanError(f"{graph.name}: the plan saves {graph.nodes[i].name} ({name!r}), which the backward "
                            f"pass also reads before checkpoint_name tags it; a policy saving {name!r} would still "
                            "recompute it (apply the plan with rematopt.jax.apply_plan, or tag the value the "
                            "backward pass reads)")
        per.setdefault((name, layer), set()).add(fate)
    for (name, layer), seen in per.items():
        if len(seen - {None}) > 1:
            raise PlanError(f"{graph.name}: the plan treats the {name!r} values of layer {layer} differently; "
                            "no name policy expresses it")
    fate_of = {key: next(iter(seen - {None}), None) for key, seen in per.items()}
    names = sorted({name for name, _ in per})
    used = {name: {f for (n, _), f in fate_of.items() if n == name and f} for name in names}
    if all(len(fs) <= 1 for fs in used.values()):
        return {name: next(iter(fs), "remat") for name, fs in used.items()}
    n_layers = 1 + max(layer for _, layer in per)
    return {"per_layer": [{name: fate_of.get((name, layer)) or "remat" for name in names}
                          for layer in range(n_layers)]}


def _lists(fates: dict[str, str]) -> tuple[list[str], list[str]]:
    return ([n for n, f in sorted(fates.items()) if f == "device"],
            [n for n, f in sorted(fates.items()) if f == "offload"])


def policy_source(table: dict[str, Any]) -> str:
    """The ``jax.checkpoint_policies`` call(s) for ``table``, as Python."""
    def one(fates: dict[str, str]) -> str:
        device, host = _lists(fates)
        if not host:
            return f"jax.checkpoint_policies.save_only_these_names({', '.join(map(repr, device))})"
        return ("jax.checkpoint_policies.save_and_offload_only_these_names(\n"
                f"    names_which_can_be_saved={device!r},\n    names_which_can_be_offloaded={host!r},\n"
                f"    offload_src={OFFLOAD_SRC!r}, offload_dst={OFFLOAD_DST!r})")

    if "per_layer" not in table:
        return f"policy = {one(table)}\n"
    rows = ",\n".join("    " + one(f).replace("\n", "\n    ") for f in table["per_layer"])
    return f"policies = [  # one per layer: jax.checkpoint(block_i, policy=policies[i])\n{rows},\n]\n"


def policy_json(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=2, sort_keys=True) + "\n"


def policy(graph: Graph, plan: Plan, layer: int | None = None) -> Callable:
    """The policy for ``jax.checkpoint(..., policy=...)`` that saves what
    ``plan`` saves. For a per-layer plan, ``layer`` picks the layer's policy
    (PlanError without it).

    The plan prices each recomputation right before its first use; apply the
    policy per layer (``jax.checkpoint(layer_fn, policy=...)`` in the model's
    layer loop) to run it so. Over the whole loss JAX re-runs the forward in
    one block at the start of the backward pass, which the plan does not price
    (on an H200: 5.08 GB predicted, 11.72 GB compiled, ``../shared/gpu/``);
    :func:`~rematopt.jax.apply_plan` runs the plan exactly as priced."""
    import jax

    table = policy_table(graph, plan)
    if "per_layer" in table:
        if layer is None:
            raise PlanError(f"{graph.name}: the plan's policy differs between layers; pass layer=")
        table = table["per_layer"][layer]
    device, host = _lists(table)
    if not host:
        return jax.checkpoint_policies.save_only_these_names(*device)
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=device, names_which_can_be_offloaded=host,
        offload_src=OFFLOAD_SRC, offload_dst=OFFLOAD_DST)
