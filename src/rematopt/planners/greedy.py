"""``greedy``: the activation-rematerialization pass of an MLIR compiler, rebuilt.

The pass works on the program in its order (positions ``0..n-1``):

1. **Candidates**: recomputable compute nodes with bytes > 0 whose output is
   consumed after its own position; with phases, non-backward nodes with a
   backward consumer. A node's *clone readers* are the consumers a clone of
   it serves (:meth:`Program.reads_clone`): with phases, its late consumers
   (:func:`~rematopt.planners.frees.late_rule`, the one definition of late);
   without phases, all of its consumers.
2. **Selection**: while the modelled peak exceeds the budget, take the
   candidate with the largest bytes x interval length / recompute cost (ties:
   earliest position). The peak is the root of a tree over a difference array
   (:class:`PeakTracker`): selecting a node is a few point updates, never a
   rescan of positions.
3. **Projection and trimming**: :func:`projection` mirrors the reverse
   materialisation walk and counts the clones exactly; while the projected
   program exceeds ``max_clone_expansion`` x the original, one selected node
   goes back (the midpoint of its chain of selected nodes, or with
   ``trim="max-clone"`` the node with most clones), its interval back into
   the difference array.
4. **Materialisation** (:func:`materialise`): before each surviving original
   that is a clone reader of a selected node, that node is recomputed, and so,
   recursively, are its selected inputs; a clone is freed right after its
   one consumer, so no node ever has two copies resident.

Without phases every consumer is a clone reader, so a selected node's
original is always dropped (it is rebuilt right before each use). With phases a node is a candidate only if its non-backward
consumers all come before the first backward node: its original (if any use
keeps it) is then freed before its first clone is computed.
"""

from __future__ import annotations

import heapq
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PlannerError
from ..graph import Graph
from ..plan import COMPUTE, FREE, Plan
from ..reference import no_remat_peak
from ..simulate import cost_of_counts, peak_of
from ..stats import Stats
from .frees import late_rule
from .options import option, parse

CLONE_BOUND = "REMAT_PLAN_CLONE_BOUND"
PEAK_MODELS = ("memory", "residual")
TRIMS = ("midpoint", "max-clone")
# An unbounded expansion past this many compute events is refused, not attempted.
MAX_EVENTS = 50_000_000


@dataclass(frozen=True)
class Options:
    peak_model: str = option("memory", "peak estimate.", choices=PEAK_MODELS)
    trim: str = option("midpoint", "clone-bound trimming rule.", choices=TRIMS)
    max_clone_expansion: float = option(8.0, "compute events <= X x compute nodes (0: unbounded).",
                                        minimum=0, finite=True)


# -- the peak over positions ---------------------------------------------------

class PeakTracker:
    """Memory over positions ``0..m-1`` as a difference array, under a segment
    tree whose nodes hold (sum, best prefix sum) of their slice: adding bytes
    over an interval is two point updates of O(log m), and the peak is the
    root's best prefix. ``diff`` seeds the array (the tree is built level by
    level in numpy, not by m point updates)."""

    def __init__(self, m: int, diff: np.ndarray | None = None):
        size = 1
        while size < m + 1:
            size *= 2
        self.size = size
        total = np.zeros(2 * size, dtype=np.int64)
        if diff is not None:
            total[size:size + len(diff)] = diff
        best = total.copy()
        k = size
        while k > 1:
            left, right = slice(k, 2 * k, 2), slice(k + 1, 2 * k, 2)
            total[k // 2:k] = total[left] + total[right]
            best[k // 2:k] = np.maximum(best[left], total[left] + best[right])
            k //= 2
        self.total: list[int] = total.tolist()
        self.best: list[int] = best.tolist()
        self.pending: dict[int, int] = {}

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` bytes at every position in ``lo..hi`` (inclusive).
        Point updates wait in ``pending`` until the next :meth:`peak`, so the
        ones a selection makes at the same index cancel before touching the tree."""
        if delta and lo <= hi:
            pending = self.pending
            pending[lo] = pending.get(lo, 0) + delta
            pending[hi + 1] = pending.get(hi + 1, 0) - delta

    def peak(self) -> int:
        if self.pending:
            self._flush()
        return max(self.best[1], 0)

    def _flush(self) -> None:
        total, best = self.total, self.best
        for k, delta in self.pending.items():
            if not delta:
                continue
            i = self.size + k
            total[i] += delta
            best[i] = total[i]
            i >>= 1
            while i:
                left = 2 * i
                t = total[left]
                total[i] = t + total[left + 1]
                a, b = best[left], t + best[left + 1]
                best[i] = a if a > b else b
                i >>= 1
        self.pending.clear()


@dataclass
class Program:
    """The facts about a graph the pass reads, computed once."""

    graph: Graph
    phased: bool               # the graph has phases
    backward: list[bool]       # node is in the backward phase
    clone_readers: list[list[int]]     # consumers of each node a clone of it serves
    original_readers: list[list[int]]  # the other consumers (served by the original)
    eligible: list[bool]               # structurally able to be recomputed for its clone readers

    @classmethod
    def of(cls, graph: Graph) -> "Program":
        pos, succs = graph.position, graph.succs
        phases = graph.has_phases
        backward = [v.phase == "backward" for v in graph.nodes]
        first_backward = min((pos[v.id] for v in graph.nodes if backward[v.id]), default=graph.n)
        late = late_rule(graph)
        cloned: list[list[int]] = []
        kept: list[list[int]] = []
        eligible: list[bool] = []
        for v in graph.nodes:
            i = v.id
            cloned.append([u for u in succs[i] if not phases or late(i, u)])
            kept.append([u for u in succs[i] if phases and not late(i, u)])
            ok = (not v.is_input and v.recomputable and not v.output and bool(cloned[i])
                  and not (phases and (backward[i] or any(pos[u] >= first_backward for u in kept[i]))))
            eligible.append(ok)
        return cls(graph, phases, backward, cloned, kept, eligible)

    def reads_clone(self, producer: int, consumer: int) -> bool:
        """Whether ``consumer`` reads ``producer`` through a clone when
        ``producer`` is selected: with phases, when it reads it late
        (:func:`~rematopt.planners.frees.late_rule`; a selected producer is
        never backward); without phases, always."""
        return not self.phased or self.backward[consumer]


# -- the clone projection --------------------------------------------------------

@dataclass
class Projection:
    """What materialising a selection will emit: clones per node, whether each
    node's original computation survives, and the latest position at which
    a clone of each selected node is used (its reach)."""

    clones: list[int]
    original: list[bool]
    reach: list[int]

    @property
    def total_clones(self) -> int:
        return sum(self.clones)

    def originals_dropped(self) -> int:
        return self.original.count(False)

    def compute_events(self, graph: Graph) -> int:
        """= compute nodes + clones - selected originals dropped."""
        return len(graph.compute_ids) + self.total_clones - self.originals_dropped()


def projection(graph: Graph, selected: list[bool] | set[int], program: Program | None = None) -> Projection:
    """Walk the program in reverse, as materialisation does: a selected node
    gets one clone per surviving original among its clone readers, plus one per
    clone of each selected consumer (so counts compound along chains); its
    original survives only if one of its original readers' originals does."""
    program = program or Program.of(graph)
    sel = _as_flags(graph, selected)
    pos = graph.position
    clones = [0] * graph.n
    original = [True] * graph.n
    reach = [-1] * graph.n
    for i in reversed(graph.order):
        if not sel[i]:
            continue
        count, latest = 0, -1
        for u in graph.succs[i]:
            if sel[u]:
                count += clones[u]
                latest = max(latest, reach[u])
            if original[u] and program.reads_clone(i, u):
                count += 1
                latest = max(latest, pos[u])
        clones[i], reach[i] = count, latest
        original[i] = any(original[u] for u in program.original_readers[i])
    return Projection(clones, original, reach)


def project_clone_count(graph: Graph, selected: list[bool] | set[int]) -> int:
    """The number of clones materialising ``selected`` emits, before emitting
    anything: emitted compute events = compute nodes + this - selected
    originals dropped (see :func:`projection`)."""
    return projection(graph, selected).total_clones


def _as_flags(graph: Graph, selected: list[bool] | set[int]) -> list[bool]:
    if isinstance(selected, list) and len(selected) == graph.n and all(isinstance(x, bool) for x in selected):
        return selected
    flags = [False] * graph.n
    for i in selected:
        flags[i] = True
    return flags


# -- selection -----------------------------------------------------------------

class PeakModel:
    """The pass's peak estimate over positions, index 0 being the start of the
    program and index t+1 position t. Selecting and unselecting are a few
    interval updates of the :class:`PeakTracker`.

    ``memory``: the memory of the program the selection materialises, as
    the simulator counts it (inputs from the start, outputs and persistent
    values to the end, both ends inclusive): an unselected value lives until
    its last use, which may be a clone of a selected consumer (at that
    consumer's *reach*, the latest position one of its clones is used); a
    selected value keeps its original up to its last original reader whose
    own original survives, and occupies one slot at each unselected clone
    reader (the clone resident while that consumer runs); and a consumer
    whose clone trees, built one after another right before it, rise above
    those slots is charged the difference (its *rise*). Its peak is the
    simulated peak of the emitted plan (the tests hold it to that).

    ``residual``: the compiler pass's own estimate: only candidate
    intervals, both ends inclusive, removed whole on selection.
    """

    def __init__(self, program: Program, candidates: list[int], kind: str):
        g = program.graph
        self.program, self.kind, self.g = program, kind, g
        self.sel = [False] * g.n
        self.first = [0 if v.is_input else g.position[v.id] + 1 for v in g.nodes]  # index a value appears
        pos = g.position
        diff = np.zeros(g.n + 2, dtype=np.int64)

        def span(lo: int, hi: int, b: int) -> None:
            diff[lo] += b
            diff[hi + 1] -= b

        if kind == "residual":
            for i in candidates:
                span(pos[i] + 1, g.last_use[i] + 1, g.bytes[i])
        else:
            self.reach = [-1] * g.n
            self.reach = [self._reach(i) for i in range(g.n)]
            self.stop = [self._stop(i) for i in range(g.n)]
            self.rise = [0] * g.n  # nothing is selected, nothing is rebuilt
            self.original = [True] * g.n
            self.kept_until = [-1] * g.n  # selected: last position of its original
            for i in range(g.n):
                span(self._start(i), self.stop[i], g.bytes[i])
        self.tracker = PeakTracker(g.n + 1, diff)

    # Lifetimes in the materialised program (memory model).

    def _start(self, i: int) -> int:
        return self.first[i]

    def _reach(self, i: int) -> int:
        """Unselected: position of the last use of the original. Selected: the
        latest position at which one of its clones is used. -1: no use."""
        pos, sel, reach, cloned = self.g.position, self.sel, self.reach, self.program.reads_clone
        best = -1
        for u in self.g.succs[i]:
            if sel[u]:
                r = reach[u]
            elif sel[i] and not cloned(i, u):
                continue
            else:
                r = pos[u]
            if r > best:
                best = r
        return best

    def _stop(self, i: int) -> int:
        v = self.g.nodes[i]
        if v.output or v.persistent:
            return self.g.n
        if self.reach[i] < 0:
            return self._start(i)
        return self.reach[i] + 1

    def _clone_points(self, i: int, sign: int) -> None:
        """Node i selected: one position at each unselected clone reader; and
        a selected producer loses (or regains) its clone slot at i's position
        when i's original goes (or returns)."""
        g, pos, b, tracker = self.g, self.g.position, self.g.bytes[i], self.tracker
        for u in self.program.clone_readers[i]:
            if not self.sel[u]:
                tracker.add(pos[u] + 1, pos[u] + 1, sign * b)
        for q in g.preds[i]:
            if self.sel[q] and self.program.reads_clone(q, i):
                tracker.add(pos[i] + 1, pos[i] + 1, -sign * g.bytes[q])

    def _keep_original(self, i: int) -> bool:
        """Selected i: span its original to its last original reader whose own
        original survives (none: the original is dropped). Unselected i: its
        whole interval stands. True if whether i's original survives changed."""
        pos, b = self.g.position, self.g.bytes[i]
        end = -1
        if self.sel[i]:
            end = max((pos[u] for u in self.program.original_readers[i] if self.original[u]), default=-1)
        old = self.kept_until[i]
        if end != old:
            if old >= 0:
                self.tracker.add(pos[i] + 1, old + 1, -b)
            if end >= 0:
                self.tracker.add(pos[i] + 1, end + 1, b)
            self.kept_until[i] = end
        survives = not self.sel[i] or end >= 0
        changed = survives != self.original[i]
        self.original[i] = survives
        return changed

    def _settle_originals(self, i: int) -> None:
        """i's original appeared or went: its selected producers' originals
        may follow, latest position first."""
        pos, g = self.g.position, self.g
        if not self._keep_original(i):
            return
        heap = [(-pos[q], q) for q in g.preds[i] if self.sel[q]]
        heapq.heapify(heap)
        queued = {q for _, q in heap}
        while heap:
            _, q = heapq.heappop(heap)
            queued.discard(q)
            if self._keep_original(q):
                for r in g.preds[q]:
                    if self.sel[r] and r not in queued:
                        queued.add(r)
                        heapq.heappush(heap, (-pos[r], r))

    def _settle(self, seeds: list[int]) -> None:
        """Recompute the reach of ``seeds`` and, while reaches change, of their
        producers, latest position first; unselected values' intervals follow."""
        pos, g = self.g.position, self.g
        heap = [(-pos[q], q) for q in set(seeds)]
        heapq.heapify(heap)
        queued = set(seeds)
        while heap:
            _, q = heapq.heappop(heap)
            queued.discard(q)
            new = self._reach(q)
            if new == self.reach[q]:
                continue
            self.reach[q] = new
            if self.sel[q]:
                for r in g.preds[q]:
                    if r not in queued:
                        queued.add(r)
                        heapq.heappush(heap, (-pos[r], r))
            else:
                old, stop = self.stop[q], self._stop(q)
                self.stop[q] = stop
                if stop > old:
                    self.tracker.add(old + 1, stop, g.bytes[q])
                else:
                    self.tracker.add(stop + 1, old, -g.bytes[q])

    # Transient clones: building the clones a consumer needs, one tree after
    # another right before it, can rise above the slots counted at its position.

    def _clone_kids(self, i: int) -> list[int]:
        """The selected inputs rebuilt for i, in build order (latest first):
        all of them for a clone of i, those it reads through a clone for i's original."""
        sel, cloned, pos = self.sel, self.program.reads_clone, self.g.position
        kids = [p for p in self.g.preds[i] if sel[p] and (sel[i] or cloned(p, i))]
        kids.sort(key=pos.__getitem__, reverse=True)
        return kids

    def _build_peak(self, i: int) -> int:
        """Memory the clones built for i and then i itself add, at their
        highest: each tree is built while the ones before it wait."""
        done, peak = 0, 0
        for k in self._clone_kids(i):
            peak = max(peak, done + self.rise[k])
            done += self.g.bytes[k]
        return max(peak, done + self.g.bytes[i])

    def _refresh_rise(self, i: int) -> bool:
        """Selected i: the peak of building one clone of it. Unselected i:
        how far building its inputs' clones rises above the slots and i's
        own bytes counted at its position (charged there)."""
        g = self.g
        if self.sel[i]:
            new = self._build_peak(i)
        elif self.first[i] == 0:  # an input: never computed, nothing rebuilt for it
            new = 0
        else:
            new = self._build_peak(i) - g.bytes[i] - sum(g.bytes[k] for k in self._clone_kids(i))
        old = self.rise[i]
        if new == old:
            return False
        self.rise[i] = new
        return True

    def _ripple(self, i: int, was_charged: int) -> None:
        """i's selection changed: uncharge what it had, recompute it, then
        its consumers (earliest first), further while build peaks change."""
        g, pos = self.g, self.g.position
        self.tracker.add(pos[i] + 1, pos[i] + 1, -was_charged)
        self.rise[i] = 0
        self._refresh_rise(i)
        if not self.sel[i]:
            self.tracker.add(pos[i] + 1, pos[i] + 1, self.rise[i])
        heap = [(pos[u], u) for u in g.succs[i]]
        heapq.heapify(heap)
        queued = set(g.succs[i])
        while heap:
            _, u = heapq.heappop(heap)
            queued.discard(u)
            charged = 0 if self.sel[u] else self.rise[u]
            changed = self._refresh_rise(u)
            if not self.sel[u]:
                self.tracker.add(pos[u] + 1, pos[u] + 1, self.rise[u] - charged)
            elif changed:
                for w in g.succs[u]:
                    if w not in queued:
                        queued.add(w)
                        heapq.heappush(heap, (pos[w], w))

    def select(self, i: int) -> None:
        g = self.g
        if self.kind == "residual":
            self.sel[i] = True
            self.tracker.add(g.position[i] + 1, g.last_use[i] + 1, -g.bytes[i])
            return
        charged = self.rise[i]
        self.tracker.add(self._start(i), self.stop[i], -g.bytes[i])
        self.sel[i] = True
        self._clone_points(i, +1)
        self._settle_originals(i)
        self.reach[i] = self._reach(i)
        self._settle(g.preds[i])
        self._ripple(i, charged)

    def unselect(self, i: int) -> None:
        g = self.g
        if self.kind == "residual":
            self.sel[i] = False
            self.tracker.add(g.position[i] + 1, g.last_use[i] + 1, g.bytes[i])
            return
        self._clone_points(i, -1)
        self.sel[i] = False
        self._settle_originals(i)
        self.reach[i] = self._reach(i)
        self.stop[i] = self._stop(i)
        self.tracker.add(self._start(i), self.stop[i], g.bytes[i])
        self._settle(g.preds[i])
        self._ripple(i, 0)

    def peak(self) -> int:
        return self.tracker.peak()


def score(graph: Graph, i: int) -> float:
    """bytes x interval length / recompute cost: memory-time freed per unit
    of recompute (infinite for a free recompute)."""
    span = graph.bytes[i] * (graph.last_use[i] - graph.position[i])
    c = graph.cost[i]
    return span / c if c > 0 else math.inf


def select(program: Program, model: PeakModel, candidates: list[int], marked: list[int],
           budget: int | None) -> tuple[list[bool], int, list[int]]:
    """Marked nodes first, then candidates by score while the peak is over
    budget; returns the selection, the peak with the marks alone, and the
    unmarked selections in the order they were made. Under the memory model (the true peak) a selection that raises
    the peak is given back: without phases a node is rebuilt before every
    use, and rebuilding can cost more than the interval it frees (the pass,
    judging its residual estimate, cannot see that and keeps it)."""
    g = program.graph
    sel = [False] * g.n
    for i in marked:
        sel[i] = True
        model.select(i)
    marks_peak = model.peak()
    taken: list[int] = []
    if budget is None:
        return sel, marks_peak, taken
    pos = g.position
    monotone = model.kind == "memory"
    ranked = sorted((i for i in candidates if not sel[i]), key=lambda i: (-score(g, i), pos[i]))
    for i in ranked:
        peak = model.peak()
        if peak <= budget:
            break
        sel[i] = True
        model.select(i)
        if monotone and model.peak() > peak:
            sel[i] = False
            model.unselect(i)
        else:
            taken.append(i)
    return sel, marks_peak, taken


# -- trimming ----------------------------------------------------------------------

class Trimmer:
    """Gives selected nodes back until the projection fits the bound, keeping
    the projected totals exact incrementally: unselecting s changes the clone
    counts of s's selected ancestors only (by a delta summed along paths) and
    may revive the originals above it."""

    def __init__(self, program: Program, sel: list[bool], proj: Projection, marks: set[int]):
        self.p, self.sel, self.proj, self.marks = program, sel, proj, marks
        self.g = program.graph
        self.total_clones = proj.total_clones
        self.dropped_originals = proj.originals_dropped()
        pos = self.g.position
        # Most clones first (ties: earliest position); entries go stale as
        # counts change and are skipped when they no longer match.
        self.heap = [(-proj.clones[i], pos[i], i) for i in self.g.order if sel[i] and i not in marks]
        heapq.heapify(self.heap)

    def compute_events(self) -> int:
        return len(self.g.compute_ids) + self.total_clones - self.dropped_originals

    def unselect(self, s: int) -> None:
        g, p, sel = self.g, self.p, self.sel
        clones, original = self.proj.clones, self.proj.original
        pos = g.position
        sel[s] = False
        self.total_clones -= clones[s]
        # What s contributed to each selected producer, and what it contributes now.
        change = {q: (1 if p.reads_clone(q, s) else 0) - clones[s] - (1 if original[s] and p.reads_clone(q, s) else 0)
                  for q in g.preds[s] if sel[q]}
        revived = {s} if not original[s] else set()
        clones[s] = 0
        original[s] = True
        self.dropped_originals -= len(revived)
        # Producers are settled latest position first, so each has collected
        # every consumer's change before passing its own on.
        delta: dict[int, int] = {}
        heap: list[tuple[int, int]] = []

        def push(q: int, d: int) -> None:
            if q not in delta:
                delta[q] = 0
                heapq.heappush(heap, (-pos[q], q))
            delta[q] += d

        for q, d in change.items():
            push(q, d)
        wake = {q for q in change if revived and not p.reads_clone(q, s)}
        while heap:
            _, q = heapq.heappop(heap)
            d = delta.pop(q)
            clones[q] += d
            self.total_clones += d
            if d and q not in self.marks:
                heapq.heappush(self.heap, (-clones[q], pos[q], q))
            revive = q in wake and not original[q]
            if revive:
                original[q] = True
                self.dropped_originals -= 1
            for r in g.preds[q]:
                if not sel[r]:
                    continue
                cloned = p.reads_clone(r, q)
                if d or (revive and cloned):
                    push(r, d + (1 if revive and cloned else 0))
                if revive and not cloned:
                    wake.add(r)
                    push(r, 0)

    def chain_midpoint(self) -> int | None:
        """The droppable node nearest the middle of the chain of selected nodes
        through the droppable node with most clones: from it, follow the
        selected neighbour with most clones both ways."""
        top = self.max_clone()
        if top is None:
            return None
        g, sel, clones = self.g, self.sel, self.proj.clones
        pos = g.position

        def follow(start: int, step) -> list[int]:
            out, seen, v = [], {start}, start
            while True:
                nxt = [u for u in step(v) if sel[u] and u not in seen]
                if not nxt:
                    return out
                v = nxt[0] if len(nxt) == 1 else max(nxt, key=lambda u: (clones[u], -pos[u]))
                seen.add(v)
                out.append(v)

        path = follow(top, lambda v: g.preds[v])[::-1] + [top] + follow(top, lambda v: g.succs[v])
        mid = (len(path) - 1) / 2
        droppable = [k for k, v in enumerate(path) if v not in self.marks]
        return path[min(droppable, key=lambda k: (abs(k - mid), k))]

    def max_clone(self) -> int | None:
        """The droppable node with most clones (ties: earliest position)."""
        heap, clones = self.heap, self.proj.clones
        while heap:
            count, _, i = heap[0]
            if self.sel[i] and -count == clones[i]:
                return i
            heapq.heappop(heap)
        return None


# -- materialisation -----------------------------------------------------------

def materialise(program: Program, sel: list[bool], proj: Projection) -> np.ndarray:
    """The plan's events, encoded ``i`` for ``compute i`` and ``~i`` for
    ``free i``. Walks positions in order; at each surviving original, first
    the clones of the inputs it reads through a clone. A clone's event sequence does not depend
    on where it is used, so it is built once per selected node (inputs in
    decreasing position, so a sibling's subtree never needs a node that is
    resident waiting for its consumer) and copied wherever it is needed."""
    g = program.graph
    pos, preds = g.position, g.preds
    original, reach = proj.original, proj.reach

    def inputs_to_clone(i: int, as_clone: bool) -> list[int]:
        return sorted((p for p in preds[i] if sel[p] and (as_clone or program.reads_clone(p, i))),
                      key=pos.__getitem__, reverse=True)

    # When each surviving original is last used: by a surviving original
    # (unless it reads a selected producer through a clone) or by a clone of a
    # selected consumer (at that consumer's reach).
    last = [-1] * g.n
    for i in g.order:
        if original[i]:
            for p in preds[i]:
                if not (sel[p] and program.reads_clone(p, i)):
                    last[p] = max(last[p], pos[i])
        if sel[i] and proj.clones[i]:
            for p in preds[i]:
                if not sel[p]:
                    last[p] = max(last[p], reach[i])
    frees_at: list[list[int]] = [[] for _ in range(g.n)]
    pieces: list[np.ndarray] = []
    buf: list[int] = []
    for v in g.nodes:
        if v.output or v.persistent or not original[v.id]:
            continue
        if v.is_input and last[v.id] < 0:
            buf.append(~v.id)
        else:
            frees_at[max(last[v.id], pos[v.id])].append(v.id)

    recipe: dict[int, np.ndarray] = {}
    for i in g.order:
        if sel[i] and proj.clones[i]:
            kids = inputs_to_clone(i, True)
            recipe[i] = np.concatenate([recipe[k] for k in kids]
                                       + [np.array([i] + [~k for k in kids], dtype=np.int64)])

    for t, i in enumerate(g.order):
        if original[i] and not g.nodes[i].is_input:
            kids = inputs_to_clone(i, False)
            if kids:
                pieces.append(np.array(buf, dtype=np.int64))
                pieces.extend(recipe[k] for k in kids)
                buf = [~k for k in kids]
                buf.insert(0, i)
            else:
                buf.append(i)
        buf.extend(~j for j in frees_at[t])
    pieces.append(np.array(buf, dtype=np.int64))
    return np.concatenate(pieces)


def decode(enc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split the encoding into the plan's (ops, nodes) arrays."""
    freed = enc < 0
    ops = np.where(freed, FREE, COMPUTE).astype(np.int8)
    nodes = np.where(freed, ~enc, enc)
    return ops, nodes


# -- the planner -------------------------------------------------------------

def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    """Select, trim to the clone bound, materialise; see the module docstring
    and :class:`Options`."""
    opts = parse(Options, options, "greedy")
    kind, bound, trim = opts.peak_model, opts.max_clone_expansion, opts.trim
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    program = Program.of(graph)
    eligible = [i for i in graph.order if program.eligible[i]]
    candidates = [i for i in eligible if graph.bytes[i] > 0]
    marks = {i for i in eligible if graph.nodes[i].recompute}
    model = PeakModel(program, candidates, kind)
    model_before = model.peak()
    sel, marks_peak, taken = select(program, model, candidates, sorted(marks, key=graph.position.__getitem__), budget)
    lap("select_s")
    proj = projection(graph, sel, program)
    lap("project_s")

    limit = bound * len(graph.compute_ids)
    trimmer = Trimmer(program, sel, proj, marks)
    dropped: list[int] = []
    peak_before_trim = model.peak()
    while bound and trimmer.compute_events() > limit:
        s = trimmer.chain_midpoint() if trim == "midpoint" else trimmer.max_clone()
        if s is None:
            break  # only explicit marks are left: the bound does not apply to them
        trimmer.unselect(s)
        model.unselect(s)
        dropped.append(s)
    lap("trim_s")
    warned: list[str] = []
    if dropped:
        names = [graph.nodes[i].name for i in dropped]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        msg = (f"{CLONE_BOUND}: {graph.name}: the selection would emit more than {bound:g}x the "
               f"{len(graph.compute_ids):,} compute nodes; gave back {len(dropped)} of the selected nodes "
               f"({shown}); modelled peak {peak_before_trim:,} -> {model.peak():,} bytes")
        warnings.warn(msg, stacklevel=2)
        warned.append(msg)
    expected = trimmer.compute_events()
    if expected > MAX_EVENTS:
        raise PlannerError(f"greedy: {graph.name}: the selection would emit {expected:,} compute events "
                           f"(limit {MAX_EVENTS:,}); bound it with max_clone_expansion")

    if dropped:  # settle the reaches too; the totals must not move
        proj = projection(graph, sel, program)
        if (proj.total_clones, proj.originals_dropped()) != (trimmer.total_clones, trimmer.dropped_originals):
            raise RuntimeError("greedy: incremental clone projection drifted from the full walk")
    given_back = _keep_under_no_remat(graph, model, sel, taken, marks_peak) if kind == "memory" else []
    if given_back:
        proj = projection(graph, sel, program)
    ops, nodes = decode(materialise(program, sel, proj))
    lap("materialise_s")
    counts = np.bincount(nodes[ops == COMPUTE], minlength=graph.n).tolist()
    peak = peak_of(graph, ops, nodes)
    cost = cost_of_counts(graph, counts)
    lap("figures_s")
    selected = [i for i in graph.order if sel[i]]
    # The pass judges its budget on its own estimate: under the residual model
    # so does the status, and the figures before and after are that estimate.
    residual = kind == "residual"
    judged = model.peak() if residual else peak
    details = {
        "peak_model": kind,
        "model_peak_bytes": model.peak(),
        "model_peak_before_trim_bytes": peak_before_trim,
        "budget_judged_on": "model_peak_bytes" if residual else "peak_bytes",
        "peak_before_bytes": model_before if residual else no_remat_peak(graph),
        "peak_after_bytes": judged,
        "selected": [graph.nodes[i].name for i in selected],
        "auto_selected": len([i for i in selected if i not in marks]),
        "dropped": [graph.nodes[i].name for i in dropped],
        "given_back": [graph.nodes[i].name for i in given_back],
        "marked": [graph.nodes[i].name for i in graph.order if i in marks],
        "selected_cost": math.fsum(graph.cost[i] for i in selected),
        "projected_clones": proj.total_clones,
        "originals_dropped": proj.originals_dropped(),
        "emitted_compute_events": int(sum(counts)),
        "max_clone_expansion": bound,
        "trim": trim,
        "warnings": warned,
        "timings_s": timings,
    }
    stats = Stats(status="FEASIBLE" if budget is None or judged <= budget else "OVER_BUDGET",
                  peak_bytes=peak, compute_cost=cost, transfer_bytes=0, details=details)
    return Plan(graph.name, "greedy", ops, nodes, stats)


def _keep_under_no_remat(graph: Graph, model: PeakModel, sel: list[bool], taken: list[int],
                         marks_peak: int) -> list[int]:
    """Selection never raised the peak, but trimming gives part of it back,
    which can leave it above the no-remat peak (above the marks alone, when
    explicit marks raise it). Then give back the latest selections, the
    lowest scored, until it is not: with none left, the marks' peak.
    Returns the nodes given back."""
    limit = max(no_remat_peak(graph), marks_peak)
    back: list[int] = []
    for i in reversed(taken):
        if model.peak() <= limit:
            break
        if sel[i]:
            sel[i] = False
            model.unselect(i)
            back.append(i)
    return back
