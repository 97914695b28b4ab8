"""The ``checkpoint_name`` policy space and the plan each policy implies.

A policy gives every *group* of named forward values (one ``checkpoint_name``,
or one (name, layer) pair) a fate: ``device`` (saved in device memory),
``offload`` (saved in host memory) or ``remat``. The plan it implies is the
one ``jax.checkpoint(step, policy=...)`` runs: the forward pass computes every
node once; the named values a policy saves are kept (or offloaded and
prefetched once, when first needed); everything else the backward pass reads
is recomputed, once, from the saved values and the step's inputs, right before
its first use, and held until its last (JAX emits each recomputation once).

Two facts make the space searchable exactly (both hold event by event for
the schedules :func:`policy_plan` builds):

- the recompute cost depends only on the saved set S = device | offload, and
  never grows when S grows (:func:`recompute_set` is the closure of the
  backward pass's reads through unsaved forward values);
- moving a group from ``device`` to ``offload`` never raises memory at any
  event, so S fits the budget under some split iff it fits all offloaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

from ...errors import PlannerError
from ...graph import Graph
from ...plan import OFFLOAD, PREFETCH, Plan
from ..frees import always_kept, keep_schedule, place_frees

FATES = ("device", "offload", "remat")


def layers(graph: Graph) -> dict[int, int]:
    """Layer of each named forward node: the outermost loop index
    (``iteration[0]``) where the importer records one, else the occurrence
    count of the node's name in program order (the k-th ``mlpwi`` is layer k,
    which is the layer in Python-loop models)."""
    seen: dict[str, int] = {}
    out = {}
    for i in graph.order:
        v = graph.nodes[i]
        name = v.extra.get("checkpoint_name")
        if name is None or v.phase == "backward":
            continue
        iteration = v.extra.get("iteration")
        out[i] = int(iteration[0]) if iteration else seen.get(name, 0)
        seen[name] = seen.get(name, 0) + 1
    return out


def no_names(graph: Graph) -> str:
    """Why ``graph`` offers no name policy, and what to do, in one line: the
    names it carries (none of which a policy decides, see :attr:`Space.groups`),
    or how to tag values, with the layer scopes of its matrix multiplies as the
    places to tag."""
    names = sorted({v.extra["checkpoint_name"] for v in graph.nodes if "checkpoint_name" in v.extra})
    if names:
        return (f"{graph.name}: its checkpoint names ({', '.join(names)}) are all on values JAX saves whatever "
                "the policy (arguments, outputs, unrecomputable values) or recomputes whatever the policy "
                "(values the backward pass also reads before the name), so no name policy has a choice to make; "
                "tag other values with jax.ad_checkpoint.checkpoint_name")
    scopes: dict[str, None] = {}
    for v in graph.nodes:
        if v.phase == "forward" and v.op in ("dot_general", "conv_general_dilated"):
            parts = [p for p in v.extra.get("name_stack", "").split("/") if p and "," not in p and "->" not in p]
            if parts:
                scopes.setdefault("/".join(parts))
    where = f" (its matrix multiplies run in {', '.join(list(scopes)[:3])}{', ...' if len(scopes) > 3 else ''})"
    return (f"{graph.name}: no value carries a checkpoint_name, so no name policy can choose among them; "
            "tag the values a policy should decide where the model computes them, "
            f"x = jax.ad_checkpoint.checkpoint_name(x, \"mlp_out\"){where if scopes else ''}, and trace again")


@dataclass(frozen=True)
class Space:
    """The named forward values of ``graph``, grouped into decision keys."""

    graph: Graph
    per_layer: bool

    @cached_property
    def groups(self) -> dict:
        """key -> named forward nodes it decides (JAX never drops inputs,
        outputs or unrecomputable values, so they are not in any group). A
        value the backward pass also reads before its name (``read_before_name``:
        ``checkpoint_name(tanh(x))``, whose derivative reads the tanh) is left to
        recomputation: saving the name, JAX would still recompute it for that
        read, which no plan on the one node can say."""
        kept = always_kept(self.graph)
        out: dict = {}
        for i, layer in layers(self.graph).items():
            if kept[i] or self.graph.nodes[i].extra.get("read_before_name"):
                continue
            name = self.graph.nodes[i].extra["checkpoint_name"]
            out.setdefault((name, layer) if self.per_layer else name, []).append(i)
        return dict(sorted(out.items(), key=lambda kv: (str(kv[0]), kv[1])))

    @property
    def keys(self) -> list:
        return list(self.groups)

    @cached_property
    def forward(self) -> list[bool]:
        return [v.phase != "backward" and not v.is_input for v in self.graph.nodes]

    @cached_property
    def backward_reads(self) -> list[int]:
        """Forward values a backward node reads directly."""
        g = self.graph
        return sorted({p for i in g.compute_ids if g.nodes[i].phase == "backward"
                       for p in g.preds[i] if self.forward[p]})

    def recompute_set(self, saved: set[int]) -> set[int]:
        """Forward nodes the backward pass recomputes when ``saved`` (node ids)
        are saved: its reads, and their producers, through unsaved values."""
        held = always_kept(self.graph)
        out: set[int] = set()
        stack = [p for p in self.backward_reads if not held[p] and p not in saved]
        while stack:
            u = stack.pop()
            if u in out:
                continue
            out.add(u)
            stack.extend(p for p in self.graph.preds[u] if self.forward[p] and not held[p] and p not in saved)
        return out

    def nodes_of(self, policy: Mapping, fate: str) -> list[int]:
        return sorted(i for k, f in policy.items() if f == fate for i in self.groups[k])

    def recompute_cost(self, policy: Mapping) -> float:
        saved = set(self.nodes_of(policy, "device")) | set(self.nodes_of(policy, "offload"))
        return math.fsum(self.graph.cost[i] for i in self.recompute_set(saved))

    def check(self, policy: Mapping) -> None:
        unknown = [k for k in policy if k not in self.groups]
        bad = [f for f in policy.values() if f not in FATES]
        if unknown or bad:
            raise PlannerError(f"{self.graph.name}: policy names unknown groups {unknown} or fates {bad}; "
                               f"groups are {self.keys}, fates {', '.join(FATES)}")


def policy_plan(space: Space, policy: Mapping, budget: int | None, planner: str = "jax-names",
                stats: dict | None = None) -> Plan:
    """The plan ``jax.checkpoint`` runs under ``policy`` (key -> fate; keys
    not given are ``remat``). Offload events of values the backward pass
    never needs are dropped (JAX saves no such residual)."""
    space.check(policy)
    info = {"policy": export_policy(space, policy)}
    info.update(stats or {})
    return saved_plan(space.graph, space.nodes_of(policy, "device"), space.nodes_of(policy, "offload"),
                      budget, planner, info)


def saved_plan(graph: Graph, device: list[int], offload: list[int], budget: int | None, planner: str,
               stats: dict | None = None) -> Plan:
    """The plan that saves ``device`` on the device and ``offload`` on the
    host and recomputes every other value the backward pass reads, once. A
    value that may not be offloaded is saved on the device (as
    jax-offload-dots keeps a non-offloadable dot): moving its group to the
    host still never raises memory."""
    device = sorted({*device, *(i for i in offload if not graph.nodes[i].offloadable)})
    offload = [i for i in offload if graph.nodes[i].offloadable]
    schedule = keep_schedule(graph, device, offload=offload, retain=True)
    fetched = {u for op, u in schedule if op == PREFETCH}
    schedule = [(op, u) for op, u in schedule if op != OFFLOAD or u in fetched]
    return place_frees(graph, schedule, planner, budget, stats)


def export_policy(space: Space, policy: Mapping) -> dict:
    """JSON shape: ``{name: fate}``, or ``{"per_layer": [{name: fate}, ...]}``."""
    full = {k: policy.get(k, "remat") for k in space.keys}
    if not space.per_layer:
        return full
    n_layers = 1 + max((layer for _, layer in full), default=-1)
    out: list[dict] = [{} for _ in range(n_layers)]
    for (name, layer), fate in full.items():
        out[layer][name] = fate
    return {"per_layer": out}
