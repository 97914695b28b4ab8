"""The schedule, ``rematopt.plan/1`` (see ``shared/spec/FORMATS.md``).

Events are stored as two compact numpy arrays (op code, node id) rather than a
list of objects: greedy plans on stress graphs reach millions of events, and
the simulator and the JSON writer both walk them in one pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .errors import PlanError, located
from .jsonfile import read_json
from .stats import Stats

FORMAT = "rematopt.plan/1"
OPS = ("compute", "free", "offload", "prefetch")
COMPUTE, FREE, OFFLOAD, PREFETCH = range(4)
_OP_CODE = {name: code for code, name in enumerate(OPS)}


class Plan:
    """An event list for one graph plus the planner's ``stats``.

    ``stats`` (a :class:`~rematopt.stats.Stats`) carries the planner's own
    claims ``peak_bytes``, ``compute_cost`` and ``transfer_bytes`` (checked
    against the simulator by :func:`rematopt.solve`) and a ``status``;
    planners add what they know.
    """

    def __init__(
        self,
        graph: str,
        planner: str,
        ops: np.ndarray | Iterable[int],
        nodes: np.ndarray | Iterable[int],
        stats: Stats | None = None,
        extra: dict[str, Any] | None = None,
    ):
        self.graph = graph
        self.planner = planner
        self.ops = np.asarray(ops, dtype=np.int8)
        self.nodes = np.asarray(nodes, dtype=np.int64)
        if self.ops.shape != self.nodes.shape or self.ops.ndim != 1:
            raise ValueError("ops and nodes must be 1-d arrays of equal length")
        self.stats: Stats = stats if stats is not None else Stats()
        self.extra: dict[str, Any] = dict(extra or {})

    @classmethod
    def from_events(cls, graph: str, planner: str, events: Iterable[tuple[str, int]],
                    stats: Stats | None = None) -> "Plan":
        """Build from ``(op_name, node)`` pairs, e.g. ``[("compute", 1), ("free", 0)]``."""
        ops, nodes = [], []
        for op, node in events:
            ops.append(_OP_CODE[op])
            nodes.append(node)
        return cls(graph, planner, ops, nodes, stats)

    def __len__(self) -> int:
        return len(self.ops)

    def events(self) -> list[tuple[str, int]]:
        return [(OPS[o], n) for o, n in zip(self.ops.tolist(), self.nodes.tolist())]

    @property
    def compute_events(self) -> int:
        return int(np.count_nonzero(self.ops == COMPUTE))

    # -- (de)serialisation ---------------------------------------------------

    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> "Plan":
        if not isinstance(d, dict):
            raise PlanError(located(source, "a plan must be a JSON object"))
        if d.get("format") != FORMAT:
            raise PlanError(located(source, f"format must be {FORMAT!r}, got {d.get('format')!r}"))
        raw = d.get("events")
        if not isinstance(raw, list):
            raise PlanError(located(source, "'events' must be a list"))
        ops = np.empty(len(raw), dtype=np.int8)
        nodes = np.empty(len(raw), dtype=np.int64)
        for k, ev in enumerate(raw):
            try:
                ops[k] = _OP_CODE[ev["op"]]
                node = ev["node"]
            except (TypeError, KeyError):
                if isinstance(ev, dict) and "op" in ev and "node" in ev:
                    raise PlanError(located(source, f"events[{k}]: unknown op {ev['op']!r}; "
                                                    f"expected one of {', '.join(OPS)}")) from None
                raise PlanError(located(source, f"events[{k}] must be an object with 'op' and 'node'")) from None
            if not isinstance(node, int) or isinstance(node, bool) or not -2**63 <= node < 2**63:
                raise PlanError(located(source, f"events[{k}]: node must be an integer id, got {node!r}"))
            nodes[k] = node
        stats = d.get("stats", {})
        if not isinstance(stats, dict):
            raise PlanError(located(source, "'stats' must be an object"))
        extra = {k: v for k, v in d.items() if k not in ("format", "graph", "planner", "events", "stats")}
        return cls(str(d.get("graph", "")), str(d.get("planner", "")), ops, nodes, Stats.from_dict(stats), extra)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        return cls.from_dict(read_json(path, PlanError), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "graph": self.graph,
            "planner": self.planner,
            "events": [{"op": op, "node": n} for op, n in self.events()],
            "stats": dict(self.stats),
            **self.extra,
        }

    def save(self, path: str | Path) -> None:
        """Write JSON; the event list is streamed by hand, one event a line, as
        ``json.dumps`` of millions of small dicts is several times slower."""
        head = {"format": FORMAT, "graph": self.graph, "planner": self.planner, **self.extra}
        with open(path, "w") as f:
            f.write(json.dumps(head)[:-1])
            f.write(', "events": [\n')
            names = [json.dumps(op) for op in OPS]
            f.write(",\n".join(f'{{"op": {names[o]}, "node": {n}}}'
                               for o, n in zip(self.ops.tolist(), self.nodes.tolist())))
            f.write('\n], "stats": ')
            f.write(json.dumps(dict(self.stats), indent=1, default=_jsonable))
            f.write("}\n")

    def __repr__(self) -> str:
        return f"Plan({self.graph!r}, planner={self.planner!r}, events={len(self)})"


def _jsonable(x: Any) -> Any:
    """numpy scalars and arrays that planners leave in stats."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


class PlanBuilder:
    """Appends events; planners use it so they never touch the op codes."""

    def __init__(self) -> None:
        self.ops: list[int] = []
        self.nodes: list[int] = []

    def compute(self, i: int) -> None:
        self.ops.append(COMPUTE)
        self.nodes.append(i)

    def free(self, i: int) -> None:
        self.ops.append(FREE)
        self.nodes.append(i)

    def offload(self, i: int) -> None:
        self.ops.append(OFFLOAD)
        self.nodes.append(i)

    def prefetch(self, i: int) -> None:
        self.ops.append(PREFETCH)
        self.nodes.append(i)

    def build(self, graph: str, planner: str, stats: Stats | None = None) -> Plan:
        return Plan(graph, planner, self.ops, self.nodes, stats)
