"""The computation graph, ``rematopt.graph/1`` (see ``shared/spec/FORMATS.md``).

A graph is immutable once built: planners and the simulator share the derived
adjacency (``preds``, ``succs``, ``position``), so it is computed once.
Construction validates everything the contract fixes and raises
:class:`~rematopt.errors.GraphError` naming the source and the first problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

from .errors import GraphError, located

FORMAT = "rematopt.graph/1"
KINDS = ("compute", "input")
PHASES = ("forward", "backward")
# A graph's total bytes and total cost are at most 2^53 (about 9.0e15): a
# petabyte, or 1e6 s in ns, fits, and every sum of them stays exact in a
# float and far from int64 overflow in planners and the simulator.
LIMIT = 2**53
# Fields the format gives no default: a file must state them.
_REQUIRED_NODE_FIELDS = ("bytes", "cost")

# Node fields with their defaults, in the order they are written.
_NODE_DEFAULTS: dict[str, Any] = {
    "op": "",
    "kind": "compute",
    "bytes": 0,
    "cost": 0.0,
    "recomputable": True,
    "offloadable": True,
    "persistent": False,
    "output": False,
    "phase": None,
    "recompute": False,
}


@dataclass
class Node:
    """One value-producing operation. ``extra`` keeps fields we do not model so
    that a load/save round trip preserves them (readers must accept extras)."""

    id: int
    name: str
    op: str = ""
    kind: str = "compute"
    bytes: int = 0
    cost: float = 0.0
    recomputable: bool = True
    offloadable: bool = True
    persistent: bool = False
    output: bool = False
    phase: str | None = None
    recompute: bool = False  # explicit remat mark (MLIR ``tessera.recompute``)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_input(self) -> bool:
        return self.kind == "input"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "name": self.name}
        for key, default in _NODE_DEFAULTS.items():
            value = getattr(self, key)
            if key in ("op", "kind", "bytes", "cost") or value != default:
                d[key] = value
        d.update(self.extra)
        return d


class Graph:
    """A DAG of :class:`Node` with a program ``order``.

    Parameters
    ----------
    name: graph name, copied into plans.
    nodes: nodes with ids ``0..n-1`` (in any order; stored by id).
    edges: ``(producer, consumer)`` pairs; duplicates are kept as given but
        collapse in ``preds`` / ``succs``.
    order: the program's topological order; default ids ascending.
    meta: free-form provenance (``source``, ``cost_unit``, ``budget_bytes``...).
    source: file the graph came from, used in error messages.

    Raises
    ------
    GraphError: ids not dense, dangling or self edges, a cycle, an ``order``
        that is not a topological permutation, negative or non-integer bytes,
        negative or non-finite costs, totals beyond :data:`LIMIT`, unknown
        kinds or phases, a recompute mark on a non-recomputable node, a
        ``meta.budget_bytes`` that is not an integer >= 0.
    """

    def __init__(
        self,
        name: str,
        nodes: Iterable[Node],
        edges: Iterable[tuple[int, int]],
        order: Iterable[int] | None = None,
        meta: dict[str, Any] | None = None,
        source: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        self.name = str(name)
        self.source = source
        self.meta = dict(meta or {})
        self.extra = dict(extra or {})
        nodes = list(nodes)
        by_id: dict[int, Node] = {}
        for node in nodes:
            if not isinstance(node.id, int) or isinstance(node.id, bool):
                self._fail(f"node id {node.id!r} is not an integer")
            if node.id in by_id:
                self._fail(f"duplicate node id {node.id}")
            by_id[node.id] = node
        n = len(nodes)
        for i in range(n):
            if i not in by_id:
                bad = next(k for k in sorted(by_id) if not 0 <= k < n)
                self._fail(f"node ids must be dense 0..{n - 1}; found id {bad}")
        self.nodes: list[Node] = [by_id[i] for i in range(n)]
        for node in self.nodes:
            self._check_node(node)
        self._check_totals()
        budget = self.meta.get("budget_bytes")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                                   or not 0 <= budget <= LIMIT):
            self._fail(f"meta.budget_bytes must be an integer from 0 to 2^53 = {LIMIT:,}, got {budget!r}")
        self.edges: list[tuple[int, int]] = []
        for e in edges:
            if len(e) != 2:
                self._fail(f"edge {list(e)!r} is not a [producer, consumer] pair")
            u, v = e
            for x in (u, v):
                if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < n:
                    self._fail(f"edge [{u}, {v}] refers to node {x!r}, which does not exist")
            if u == v:
                self._fail(f"edge [{u}, {v}] is a self-loop (cycle at node {u})")
            if self.nodes[v].is_input:
                self._fail(f"edge [{u}, {v}] ends at input node {v} ({self.nodes[v].name}): inputs are "
                           "resident from the start and never computed, so they have no producers")
            self.edges.append((u, v))
        self.order: list[int] = list(range(n)) if order is None else list(order)
        self._check_order()

    # -- validation -------------------------------------------------------

    def _fail(self, problem: str):
        raise GraphError(located(self.source, problem))

    def _check_node(self, node: Node) -> None:
        where = f"node {node.id} ({node.name})"
        b = node.bytes
        if not isinstance(b, int) or isinstance(b, bool) or b < 0:
            self._fail(f"{where}: bytes must be an integer >= 0, got {b!r}")
        c = node.cost
        if (isinstance(c, bool) or not isinstance(c, (int, float)) or c < 0
                or (isinstance(c, float) and not math.isfinite(c))):  # an int of any size is compared exactly
            self._fail(f"{where}: cost must be a finite number >= 0, got {c!r}")
        if isinstance(c, int) and c > LIMIT:  # too large for a float cost: named here, not an OverflowError later
            self._fail(f"{where}: cost exceeds the limit 2^53 = {LIMIT:,} {self.cost_unit} (got a {len(str(c))}-digit integer)")
        if node.kind not in KINDS:
            self._fail(f"{where}: kind must be one of {KINDS}, got {node.kind!r}")
        if node.phase is not None and node.phase not in PHASES:
            self._fail(f"{where}: phase must be one of {PHASES} or absent, got {node.phase!r}")
        for flag in ("recomputable", "offloadable", "persistent", "output", "recompute"):
            if not isinstance(getattr(node, flag), bool):
                self._fail(f"{where}: {flag} must be true or false, got {getattr(node, flag)!r}")
        if node.persistent and not node.is_input:
            self._fail(f"{where}: a persistent node must be an input "
                       "(persistent values are resident from the start, so they cannot be computed)")
        if node.recompute and not node.recomputable and not node.is_input:
            self._fail(f"REMAT_EFFECTFUL: {where} is marked recompute but is not recomputable "
                       "(re-running it would change the program)")

    def _check_totals(self) -> None:
        """Totals beyond :data:`LIMIT`, named at the node that crosses it
        (compared as exact integers, so 1e308 or a 5000-digit size cannot overflow)."""
        for field_, unit in (("bytes", "bytes"), ("cost", self.cost_unit)):
            total = 0
            for node in self.nodes:
                value = getattr(node, field_)
                total += int(value) if isinstance(value, int) else math.ceil(value)
                if total > LIMIT:
                    self._fail(f"node {node.id} ({node.name}): the {field_} total exceeds the limit "
                               f"2^53 = {LIMIT:,} {unit} (this node: {value!r} {unit})")

    def _check_order(self) -> None:
        n = len(self.nodes)
        for i in self.order:
            if not isinstance(i, int) or isinstance(i, bool):
                self._fail(f"order entries must be integer node ids, got {i!r}")
        if sorted(self.order) != list(range(n)):
            self._fail(f"order must list every node id 0..{n - 1} exactly once")
        pos = self.position
        for u, v in self.edges:
            if pos[u] > pos[v]:
                if self._has_cycle():
                    self._fail(f"the edges contain a cycle (through [{u}, {v}])")
                self._fail(f"order is not topological: node {v} comes before its producer {u}")

    def _has_cycle(self) -> bool:
        import networkx as nx

        return not nx.is_directed_acyclic_graph(self.to_networkx())

    # -- derived structure --------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.nodes)

    @cached_property
    def preds(self) -> list[list[int]]:
        """Distinct producers of each node, ascending."""
        sets: list[set[int]] = [set() for _ in self.nodes]
        for u, v in self.edges:
            sets[v].add(u)
        return [sorted(s) for s in sets]

    @cached_property
    def succs(self) -> list[list[int]]:
        """Distinct consumers of each node, in program order."""
        sets: list[set[int]] = [set() for _ in self.nodes]
        for u, v in self.edges:
            sets[u].add(v)
        pos = self.position
        return [sorted(s, key=pos.__getitem__) for s in sets]

    @cached_property
    def position(self) -> list[int]:
        """``position[i]`` is node i's index in ``order``."""
        pos = [0] * len(self.nodes)
        for t, i in enumerate(self.order):
            pos[i] = t
        return pos

    @cached_property
    def last_use(self) -> list[int]:
        """Position of each node's last consumer (its own position if none)."""
        pos = self.position
        return [max((pos[s] for s in self.succs[i]), default=pos[i]) for i in range(self.n)]

    @cached_property
    def compute_ids(self) -> list[int]:
        return [v.id for v in self.nodes if not v.is_input]

    @cached_property
    def bytes(self) -> list[int]:
        return [v.bytes for v in self.nodes]

    @cached_property
    def cost(self) -> list[float]:
        return [float(v.cost) for v in self.nodes]

    @cached_property
    def initial_resident(self) -> list[int]:
        """Nodes resident before the first event: inputs and persistent nodes."""
        return [v.id for v in self.nodes if v.is_input or v.persistent]

    @cached_property
    def initial_bytes(self) -> int:
        """Memory before the first event: the bytes of :attr:`initial_resident`."""
        return sum(self.bytes[i] for i in self.initial_resident)

    @cached_property
    def persistent_bytes(self) -> int:
        """Bytes resident throughout every plan (parameters): no schedule moves them."""
        return sum(v.bytes for v in self.nodes if v.persistent)

    @property
    def has_phases(self) -> bool:
        return any(v.phase is not None for v in self.nodes)

    @property
    def cost_unit(self) -> str:
        return str(self.meta.get("cost_unit", "unit"))

    def to_networkx(self):
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(range(self.n))
        g.add_edges_from(self.edges)
        return g

    def node_by_name(self, name: str) -> Node:
        for v in self.nodes:
            if v.name == name:
                return v
        raise KeyError(name)

    # -- (de)serialisation ---------------------------------------------------

    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> "Graph":
        """Build from a parsed ``rematopt.graph/1`` document."""
        if not isinstance(d, dict):
            raise GraphError(located(source, "a graph must be a JSON object"))
        fmt = d.get("format")
        if fmt != FORMAT:
            raise GraphError(located(source, f"format must be {FORMAT!r}, got {fmt!r}"))
        raw_nodes = d.get("nodes")
        if not isinstance(raw_nodes, list):
            raise GraphError(located(source, "'nodes' must be a list"))
        nodes = []
        for k, raw in enumerate(raw_nodes):
            if not isinstance(raw, dict) or "id" not in raw:
                raise GraphError(located(source, f"nodes[{k}] must be an object with an 'id'"))
            missing = [key for key in _REQUIRED_NODE_FIELDS if key not in raw]
            if missing:
                raise GraphError(located(source, f"nodes[{k}] (id {raw['id']!r}) has no "
                                                 f"{' or '.join(map(repr, missing))}; the format gives it no default"))
            known = {key: raw[key] for key in _NODE_DEFAULTS if key in raw}
            extra = {key: val for key, val in raw.items()
                     if key not in _NODE_DEFAULTS and key not in ("id", "name")}
            nodes.append(Node(id=raw["id"], name=str(raw.get("name", raw["id"])), extra=extra, **known))
        if "edges" not in d:
            raise GraphError(located(source, "'edges' is missing (write [] for a graph without edges)"))
        edges = d["edges"]
        if not isinstance(edges, list) or not all(isinstance(e, list) for e in edges):
            raise GraphError(located(source, "'edges' must be a list of [producer, consumer] pairs"))
        order = d.get("order")
        if order is not None and not isinstance(order, list):
            raise GraphError(located(source, "'order' must be a list of node ids"))
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise GraphError(located(source, "'meta' must be an object"))
        extra = {k: v for k, v in d.items() if k not in ("format", "name", "nodes", "edges", "order", "meta")}
        return cls(d.get("name", ""), nodes, [tuple(e) for e in edges], order, meta, source, extra)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "nodes": [v.to_dict() for v in self.nodes],
            "edges": [list(e) for e in self.edges],
            "order": list(self.order),
            "meta": self.meta,
            **self.extra,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={self.n}, edges={len(self.edges)})"
