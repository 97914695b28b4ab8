"""The block table: a model's repeated layers, found in its graph.

A training step of a layered model is the same block many times: the
forward of layer k, and later (in reverse) its gradient. :func:`find_blocks`
finds those blocks so a planner can solve one block of each kind once and
combine the solutions along the layer sequence (``planners/rotor.py``), and a
bound can be summed per block.

Where the blocks come from (``BlockTable.source``), first that applies:

- ``"iteration"``: the JAX importer's ``iteration`` (loop indices of an
  unrolled ``scan`` / ``while``): block k is every node whose outermost
  index is k, the stacked parameters' slices included.
- ``"name_stack"``: the outermost ``name_stack`` component that ends in a
  number (``layers_3``, ``block3``): block k is every node under ``.../k``
  (backward nodes carry their forward operation's stack).
- ``"hash"``: anything else (MLIR, node-link, Python loops traced without
  scopes). Each node gets networkx's Weisfeiler-Lehman hash of its
  neighbourhood (op, bytes, cost, flags, one hop); the forward nodes' hashes
  in program order are searched for the longest run of one repeated unit,
  cut where the fewest bytes cross between consecutive units; the backward
  nodes' run is cut into as many units, the one read by forward block k
  being block k's gradient.

A hash proves nothing: every candidate is checked exactly. Two blocks are of
one *kind* only if their members, in canonical order (``Block.nodes``:
inputs, forward, backward, each in program order), have the same op, kind,
phase, bytes, cost and flags, the same edges among them, the same pattern of
edges from outside (each outside producer's bytes and kind), and the same
members read outside. So the k-th member of two blocks of one kind
correspond: that is the node correspondence (:meth:`BlockTable.counterpart`).

Input nodes all of whose readers lie in one block (a layer's parameters) are
that block's ``inputs``. Every other node is ``outside`` (embedding, head,
loss, optimizer, a partial unit at the end of a run).
"""

from __future__ import annotations

import re
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .graph import Graph

SOURCES = ("iteration", "name_stack", "hash")
# A name_stack component naming one of a sequence of layers: "layers_3", "block3", "h.3".
_NUMBERED = re.compile(r"^(.*?)[_.\-]?(\d+)$")
# Candidate periods tried by the hash search: the most frequent distances
# between equal hashes. The true period is the most frequent on every
# decoder tried (12-96 layers); eight leaves room for sub-layer repeats.
_CANDIDATE_PERIODS = 8


@dataclass(frozen=True)
class Block:
    """One repetition of a layer.

    ``position``: index along the layer sequence (forward program order).
    ``kind``: blocks of one kind are isomorphic (see the module's docstring).
    ``inputs``, ``forward``, ``backward``: node ids in program order (inputs:
    the ones only this block reads, e.g. its parameters)."""

    position: int
    kind: int
    inputs: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        """Members in canonical order: the k-th corresponds to the k-th of
        every block of the same kind."""
        return self.inputs + self.forward + self.backward


@dataclass(frozen=True)
class BlockTable:
    """Blocks along the layer sequence, the nodes in none, and where they were found."""

    blocks: tuple[Block, ...]
    outside: tuple[int, ...]
    source: str

    @cached_property
    def kinds(self) -> dict[int, tuple[int, ...]]:
        """kind -> positions of its blocks, ascending."""
        out: dict[int, list[int]] = defaultdict(list)
        for b in self.blocks:
            out[b.kind].append(b.position)
        return {k: tuple(v) for k, v in sorted(out.items())}

    @cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        return {v: (b.position, k) for b in self.blocks for k, v in enumerate(b.nodes)}

    def block_of(self, node: int) -> int | None:
        """Position of the block holding ``node``, or None if it is outside."""
        hit = self._where.get(node)
        return None if hit is None else hit[0]

    def canonical(self, node: int) -> int | None:
        """``node``'s index in its block's canonical order (None outside)."""
        hit = self._where.get(node)
        return None if hit is None else hit[1]

    def counterpart(self, node: int, position: int) -> int:
        """The node of block ``position`` that corresponds to ``node``;
        ValueError if ``node`` is outside or the blocks differ in kind."""
        hit = self._where.get(node)
        if hit is None:
            raise ValueError(f"node {node} is in no block")
        here, other = self.blocks[hit[0]], self.blocks[position]
        if here.kind != other.kind:
            raise ValueError(f"blocks {here.position} and {position} are of different kinds")
        return other.nodes[hit[1]]

    def __len__(self) -> int:
        return len(self.blocks)


def find_blocks(graph: Graph) -> BlockTable | None:
    """The repeated blocks of ``graph``, or None when it has no two
    isomorphic blocks (it is then planned as a whole, as before).

    Tries the importer's ``iteration``, then ``name_stack``, then structural
    hashing (see the module's docstring); every candidate is checked for
    isomorphism exactly, whichever found it."""
    for source, groups in (("iteration", _by_iteration(graph)), ("name_stack", _by_name_stack(graph))):
        if len(groups) >= 2:
            table = _table(graph, groups, source)
            if table is not None:
                return table
    groups = _by_hash(graph)
    return _table(graph, groups, "hash") if len(groups) >= 2 else None


# -- candidates -------------------------------------------------------------

def _by_iteration(graph: Graph) -> list[list[int]]:
    """Nodes grouped by their outermost loop index."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i in graph.order:
        it = graph.nodes[i].extra.get("iteration")
        if it:
            groups[int(it[0])].append(i)
    return [groups[k] for k in sorted(groups)]


def _by_name_stack(graph: Graph) -> list[list[int]]:
    """Nodes grouped by their outermost numbered scope; families (the scope
    with its number taken off) with fewer than two numbers are no sequence."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i in graph.order:
        stack = graph.nodes[i].extra.get("name_stack")
        if not isinstance(stack, str):
            continue
        parts = stack.split("/")
        for d, part in enumerate(parts):
            m = _NUMBERED.match(part)
            if m and m.group(1):
                groups[("/".join(parts[:d] + [m.group(1)]), int(m.group(2)))].append(i)
                break
    family = Counter(f for f, _ in groups)
    return [nodes for (f, _), nodes in sorted(groups.items()) if family[f] >= 2]


def _by_hash(graph: Graph) -> list[list[int]]:
    """Forward and backward units of the longest repeated run of
    neighbourhood hashes (see the module's docstring)."""
    label, wl = _hashes(graph)
    forward = [i for i in graph.order if not graph.nodes[i].is_input and graph.nodes[i].phase != "backward"]
    backward = [i for i in graph.order if graph.nodes[i].phase == "backward"]
    run = _longest_run([label[i] for i in forward], _periods([wl[i] for i in forward]))
    if run is None:
        return []
    start, end, period = run
    copies = (end - start) // period
    # Cut where the fewest bytes cross from one unit to the next (forward edges only).
    crossing = _crossing(graph, forward)
    offset = min(range(start, end - copies * period + 1),
                 key=lambda o: (sum(crossing[o + k * period] for k in range(copies + 1)), o))
    units = [forward[offset + k * period: offset + (k + 1) * period] for k in range(copies)]
    if not backward:
        return units
    unit_of = {v: k for k, u in enumerate(units) for v in u}
    grads = _gradient_units(graph, backward, [label[i] for i in backward], _periods([wl[i] for i in backward]),
                            unit_of, copies)
    if grads is None:
        return []
    return [u + g for u, g in zip(units, grads)]


def _hashes(graph: Graph) -> tuple[list[int], list[int]]:
    """Each node's label (op, bytes, cost, flags) and one-hop
    Weisfeiler-Lehman hash over those labels, both as small ints."""
    import networkx as nx

    g = graph.to_networkx()
    local: dict[tuple, int] = {}
    labels = []
    for v in graph.nodes:
        labels.append(local.setdefault(_label(v), len(local)))
        g.nodes[v.id]["label"] = str(labels[-1])
    with warnings.catch_warnings():  # the note that directed hashes changed in networkx 3.5
        warnings.simplefilter("ignore", UserWarning)
        wl = nx.weisfeiler_lehman_subgraph_hashes(g, node_attr="label", iterations=1)
    ids: dict[str, int] = {}
    return labels, [ids.setdefault(wl[i][-1], len(ids)) for i in range(graph.n)]


def _label(v) -> tuple:
    return (v.op, v.kind, v.phase, v.bytes, v.cost, v.recomputable, v.offloadable, v.persistent, v.output)


def _periods(seq: list[int]) -> list[int]:
    """The most frequent distances between consecutive equal entries."""
    last: dict[int, int] = {}
    gaps: Counter = Counter()
    for t, x in enumerate(seq):
        if x in last:
            gaps[t - last[x]] += 1
        last[x] = t
    return [p for p, _ in gaps.most_common(_CANDIDATE_PERIODS)]


def _runs(seq: np.ndarray, period: int) -> list[tuple[int, int]]:
    """Maximal ``[start, end)`` with ``seq[t] == seq[t + period]`` for
    every t in ``[start, end - period)``: ``end - start >= 2 * period``."""
    same = np.concatenate(([False], seq[:-period] == seq[period:], [False]))
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    out = []
    for a, b in zip(edges[::2], edges[1::2]):
        if b - a >= period:
            out.append((int(a), int(b) + period))
    return out


def _longest_run(seq: list[int], periods: list[int], copies: int | None = None) -> tuple[int, int, int] | None:
    """``(start, end, period)`` of the run of one repeated unit, of one of
    ``periods``, covering the most entries (with exactly ``copies`` units
    when given, the run at least that long); shorter periods win ties."""
    if len(seq) < 2:
        return None
    arr = np.asarray(seq)
    best = None
    for p in sorted(periods):
        for a, b in _runs(arr, p):
            k = (b - a) // p
            if copies is not None and k < copies:
                continue
            cover = (copies or k) * p
            if best is None or cover > best[0]:
                best = (cover, a, b, p)
    return None if best is None else best[1:]


def _crossing(graph: Graph, seq: list[int]) -> list[int]:
    """``crossing[c]``: bytes of the values before index c of ``seq`` read
    by an entry at or after c (edges within ``seq`` only)."""
    at = {v: t for t, v in enumerate(seq)}
    diff = np.zeros(len(seq) + 2, dtype=np.int64)
    for v in seq:
        last = max((at[s] for s in graph.succs[v] if s in at), default=at[v])
        if last > at[v]:
            diff[at[v] + 1] += graph.bytes[v]
            diff[last + 1] -= graph.bytes[v]
    return np.cumsum(diff)[: len(seq) + 1].tolist()


def _gradient_units(graph: Graph, backward: list[int], bseq: list[int], periods: list[int],
                    unit_of: dict[int, int], copies: int) -> list[list[int]] | None:
    """The backward run cut into ``copies`` units, unit k the gradient of
    forward unit k: of the offsets, the one whose units read their own
    forward unit most often (the backward runs in reverse), then the one
    where the fewest bytes cross between units."""
    run = _longest_run(bseq, periods, copies)
    if run is None:
        return None
    start, end, period = run
    last = end - copies * period  # last admissible offset
    score = np.zeros(end + 1, dtype=np.int64)
    for t, b in enumerate(backward):
        for p in graph.preds[b]:
            f = unit_of.get(p)
            if f is None:
                continue
            j = copies - 1 - f  # the backward unit that matches forward unit f
            # t lies in unit j for offsets o with o + j*period <= t < o + (j+1)*period
            lo, hi = max(start, t - (j + 1) * period + 1), min(last, t - j * period)
            if lo <= hi:
                score[lo] += 1
                score[hi + 1] -= 1
    score = np.cumsum(score)
    crossing = _crossing(graph, backward)
    offset = max(range(start, last + 1),
                 key=lambda o: (score[o], -sum(crossing[o + k * period] for k in range(copies + 1)), -o))
    return [backward[offset + j * period: offset + (j + 1) * period] for j in reversed(range(copies))]


# -- the table --------------------------------------------------------------

def _table(graph: Graph, groups: list[list[int]], source: str) -> BlockTable | None:
    """Blocks from candidate groups (any nodes; inputs read only by one
    group join it), kinds from exact signatures; None if no two match."""
    member: dict[int, int] = {}
    for k, grp in enumerate(groups):
        for v in grp:
            member[v] = k
    for v in graph.nodes:  # inputs that only one group reads are its inputs
        if v.is_input and v.id not in member and graph.succs[v.id]:
            readers = {member.get(s) for s in graph.succs[v.id]}
            if len(readers) == 1 and None not in readers:
                member[v.id] = readers.pop()
    pos = graph.position
    grouped: list[list[int]] = [[] for _ in groups]
    for v in graph.order:
        if v in member:
            grouped[member[v]].append(v)
    parts: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    for nodes in grouped:
        ins = tuple(v for v in nodes if graph.nodes[v].is_input)
        fwd = tuple(v for v in nodes if not graph.nodes[v].is_input and graph.nodes[v].phase != "backward")
        bwd = tuple(v for v in nodes if graph.nodes[v].phase == "backward")
        if fwd:
            parts.append((ins, fwd, bwd))
    parts.sort(key=lambda p: pos[p[1][0]])
    kind_of: dict[tuple, int] = {}
    kinds = [kind_of.setdefault(signature(graph, ins + fwd + bwd), len(kind_of)) for ins, fwd, bwd in parts]
    if len(kind_of) == len(parts):  # no two blocks alike: no repetition
        return None
    blocks = tuple(Block(k, kind, *p) for k, (kind, p) in enumerate(zip(kinds, parts)))
    inside = {v for b in blocks for v in b.nodes}
    outside = tuple(i for i in graph.order if i not in inside)
    return BlockTable(blocks, outside, source)


def signature(graph: Graph, members: tuple[int, ...]) -> tuple:
    """What two blocks of one kind share exactly, members in canonical order:
    labels, edges among members, outside producers (numbered by first read,
    with their bytes and kind) and which members are read outside."""
    at = {v: k for k, v in enumerate(members)}
    pos = graph.position
    labels = tuple(_label(graph.nodes[v]) for v in members)
    inner, outer = [], []
    slots: dict[int, int] = {}
    slot_labels = []
    for k, v in enumerate(members):
        for p in sorted(graph.preds[v], key=pos.__getitem__):
            if p in at:
                inner.append((at[p], k))
            else:
                if p not in slots:
                    slots[p] = len(slots)
                    slot_labels.append((graph.bytes[p], graph.nodes[p].kind, graph.nodes[p].persistent))
                outer.append((slots[p], k))
    escapes = tuple(any(s not in at for s in graph.succs[v]) for v in members)
    return labels, tuple(inner), tuple(outer), tuple(slot_labels), escapes
