"""Which (stage, value) pairs the staged space has: the index every model
of the space, its relaxations and its projections of plans are built on."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ...graph import Graph


@dataclass
class Stages:
    """Which (stage, value) pairs exist. A value i lives in stages
    ``first[i]..horizon[i]``: from its first computation (inputs: from the
    start) to the last stage in which something that reads it may be computed
    (outputs: the end).

    ``depth`` None gives the full staged space: a value may be recomputed in
    any stage up to its horizon, which follows recomputable consumers
    transitively. ``depth`` k restricts re-materialisation in stage s to the
    nodes within k producer hops of ``v_s`` (through recomputable nodes): the
    recomputes that feed the stage's own first computation. It shrinks the
    model from O(n^2) to about O(n x k x in-degree) decision variables.
    ``also`` (stage -> nodes) allows more re-materialisations in a restricted
    space: the warm start's, so the space holds a plan at least as good."""

    graph: Graph
    offload: bool
    depth: int | None = None
    also: dict[int, set[int]] | None = None
    stage_node: list[int] = field(init=False)
    first: list[int] = field(init=False)
    horizon: list[int] = field(init=False)
    values: list[int] = field(init=False)

    def __post_init__(self) -> None:
        g = self.graph
        self.pos = g.position
        self.stage_node = [i for i in g.order if not g.nodes[i].is_input]
        self.T = len(self.stage_node)
        stage_of = {v: s for s, v in enumerate(self.stage_node)}
        self.first = [stage_of.get(i, -1) for i in range(g.n)]
        self.recomputable = [v.recomputable and not v.is_input for v in g.nodes]
        self.offloadable = [self.offload and v.offloadable and v.bytes > 0 for v in g.nodes]
        also = self.also or {}
        self.near = (None if self.depth is None else
                     [self._ancestors(v) | also.get(s, set()) for s, v in enumerate(self.stage_node)])
        horizon = list(self.first)
        if self.near is None:
            for i in reversed(g.order):
                for j in g.succs[i]:
                    horizon[i] = max(horizon[i], horizon[j] if self.recomputable[j] else self.first[j])
        else:
            for s, near in enumerate(self.near):
                for j in [self.stage_node[s]] + [j for j in near if self.recomputable[j]]:
                    for i in g.preds[j]:
                        horizon[i] = max(horizon[i], s)
        for v in g.nodes:
            if v.output:
                horizon[v.id] = self.T - 1
        self.horizon = horizon
        self.values = [v.id for v in g.nodes if not v.persistent and horizon[v.id] >= 0]

    def _ancestors(self, v: int) -> set[int]:
        """Producers within ``depth`` hops of v, expanding only through
        recomputable nodes (a kept or prefetched value needs no producers)."""
        preds = self.graph.preds
        seen: set[int] = set()
        frontier = [v]
        for _ in range(self.depth or 0):
            nxt = [p for u in frontier if u == v or self.recomputable[u] for p in preds[u] if p not in seen]
            seen.update(nxt)
            frontier = nxt
        return seen

    def stages(self, i: int) -> range:
        return range(max(self.first[i], 0), self.horizon[i] + 1)

    def remat_pairs(self) -> list[tuple[int, int]]:
        """The (stage, value) pairs after a value's first computation where it
        may be recomputed or prefetched, by value then stage. A restricted
        space reads them off its near sets: walking every life visits 11.9
        million pairs on the 9,652-node decoder, where these are 60,000."""
        values = set(self.values)
        if self.near is None:
            cand = ((s, i) for i in self.values for s in range(self.first[i] + 1, self.horizon[i] + 1))
        else:
            cand = ((s, i) for s, near in enumerate(self.near) for i in near if i in values
                    and self.first[i] < s <= self.horizon[i])
        pairs = [(s, i) for s, i in cand if self.may_compute(s, i) or self.may_prefetch(s, i)]
        return sorted(pairs, key=lambda k: (k[1], k[0])) if self.near is not None else pairs

    def count_pairs(self) -> int:
        """The (stage, value) pairs of every value's life: what a model over
        this space, or a relaxation of it, has about one entry each for."""
        return sum(len(self.stages(i)) for i in self.values)

    def count_remat_pairs(self) -> int:
        """len(remat_pairs()), counted without listing the full space's."""
        if self.near is not None:
            return len(self.remat_pairs())
        stage_pos = [self.pos[v] for v in self.stage_node]
        count = 0
        for i in self.values:
            lo, hi = self.first[i] + 1, self.horizon[i]
            if self.recomputable[i]:
                count += max(0, hi - lo + 1)
            elif self.offloadable[i]:  # a prefetch needs a slot: stages from the first at or after i
                count += max(0, hi - max(lo, bisect.bisect_left(stage_pos, self.pos[i])) + 1)
        return count

    def has_slot(self, s: int, i: int) -> bool:
        return self.pos[i] <= self.pos[self.stage_node[s]]

    def is_near(self, s: int, i: int) -> bool:
        return self.near is None or i in self.near[s]

    def may_compute(self, s: int, i: int) -> bool:
        return s == self.first[i] or (self.recomputable[i] and self.first[i] < s <= self.horizon[i]
                                      and self.is_near(s, i))

    def may_prefetch(self, s: int, i: int) -> bool:
        return (self.offloadable[i] and self.first[i] < s <= self.horizon[i] and self.has_slot(s, i)
                and self.is_near(s, i))

