"""Packing buffers with known live ranges into one heap, the way XLA's buffer assignment packs a
module's temporaries (its global decreasing-size best-fit heap).

Each buffer is an interval of time with a size; buffers that must share an address (XLA's
colocations: aliased values, an output written into its operand) form a group placed once, at one
offset, free over every member's time range. Groups are placed one at a time in a fixed order; each
goes into the smallest free gap (over its whole time span) that holds its largest member, at the
gap's first aligned offset, or else past the end. Two orders are tried, XLA's spatial one (largest
first) and its temporal one (longest-lived first), and the smaller heap wins.

The result is not the live peak: the order cannot foresee later buffers, so gaps remain, and the
heap is usually larger than the most bytes live at any one time (:attr:`Packing.live_peak`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """One buffer: live over event times ``start..end`` (both included), ``size`` bytes.
    ``colocated`` names the intervals (by position in the list) placed at its offset; only a
    group's first member (``placed``) is given an offset of its own."""

    key: int  # ties in either order go to the smaller key (XLA: the value's id)
    size: int
    start: int
    end: int
    colocated: tuple[int, ...] = ()
    placed: bool = True


@dataclass(frozen=True)
class Packing:
    heap_bytes: int  # the heap's size: the highest end of a placed buffer
    offsets: dict[int, int]  # interval position -> offset
    order: str  # "spatial" or "temporal": which order gave it
    live_peak: int  # the most bytes live at one event time (the packing's lower bound)


def _groups(intervals: list[Interval]) -> dict[int, list[int]]:
    """placed interval -> itself and every interval colocated with it, transitively."""
    out = {}
    for i, iv in enumerate(intervals):
        if not iv.placed:
            continue
        members, todo = [i], list(iv.colocated)
        while todo:
            j = todo.pop()
            if j not in members:
                members.append(j)
                todo.extend(intervals[j].colocated)
        out[i] = members
    return out


def _sort_key(order: str, iv: Interval, members: list[Interval]):
    if order == "spatial":  # size (descending), duration (descending)
        return (-iv.size, iv.start - iv.end, iv.key)
    first = min(m.start for m in members)  # temporal: the group's whole span (descending), size
    last = max(m.end for m in members)
    return (first - last, -iv.size, iv.key)


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def pack(intervals: list[Interval], alignment: int, order: str = "spatial") -> Packing:
    """Place every group by best fit in ``order``; returns the heap size and the offsets."""
    groups = _groups(intervals)
    ranked = sorted(groups, key=lambda i: _sort_key(order, intervals[i], [intervals[j] for j in groups[i]]))
    n = len(intervals)
    starts, ends = np.zeros(n, np.int64), np.zeros(n, np.int64)
    lows, highs = np.zeros(n, np.int64), np.zeros(n, np.int64)
    count = 0
    offsets: dict[int, int] = {}
    heap = 0
    for i in ranked:
        members = groups[i]
        need = max(intervals[j].size for j in members)
        busy = np.zeros(count, bool)
        for j in members:
            m = intervals[j]
            busy |= (starts[:count] <= m.end) & (ends[:count] >= m.start)
        used = sorted(zip(lows[:count][busy].tolist(), highs[:count][busy].tolist()))
        offset = best_fit(used, intervals[i].size, need, alignment)
        for j in members:  # each member holds the group's largest size (XLA sizes them alike)
            m = intervals[j]
            offsets[j] = offset
            starts[count], ends[count], lows[count], highs[count] = m.start, m.end, offset, offset + need
            count += 1
        heap = max(heap, offset + need)
    return Packing(heap, offsets, order, live_peak(intervals))


def best_fit(used: list[tuple[int, int]], size: int, need: int, alignment: int) -> int:
    """The offset in the smallest free gap (ties: the lowest) that holds ``need`` bytes at its
    first aligned offset; gaps shorter than ``size`` are not gaps. Past the last used byte there is
    always room."""
    gaps = []
    free_from = 0
    k = 0
    while k < len(used):
        low, high = used[k]
        k += 1
        while k < len(used) and used[k][0] < high:  # merge overlapping used ranges
            high = max(high, used[k][1])
            k += 1
        if low - free_from >= size:
            gaps.append((free_from, low))
        free_from = max(free_from, _align(high, alignment))
    best = None
    for low, high in gaps:
        start = _align(low, alignment)
        if high - need >= start and (best is None or high - low < best[0]):
            best = (high - low, start)
    return best[1] if best is not None else _align(free_from, alignment)


def best_packing(intervals: list[Interval], alignment: int) -> Packing:
    """XLA's choice: the smaller of the spatial and the temporal packings (spatial on a tie)."""
    spatial = pack(intervals, alignment, "spatial")
    temporal = pack(intervals, alignment, "temporal")
    return temporal if temporal.heap_bytes < spatial.heap_bytes else spatial


def _group_spans(intervals: list[Interval]) -> list[tuple[int, int, int, int]]:
    """(placed interval, group size, first, last) for each stretch of time a colocated group is
    live: its members' spans merged where they overlap or touch, the group at its largest member."""
    out = []
    for i, members in _groups(intervals).items():
        size = max(intervals[j].size for j in members)
        spans = sorted((intervals[j].start, intervals[j].end) for j in members)
        first, last = spans[0]
        for start, end in spans[1:] + [(None, None)]:
            if start is not None and start <= last + 1:
                last = max(last, end)
                continue
            out.append((i, size, first, last))
            first, last = start, end
    return out


def occupancy(intervals: list[Interval], after: bool = False) -> np.ndarray:
    """Bytes live at each event time ``0..max end`` (``after``: just after it, what ends there
    gone), each colocated group counted once at its largest: what the heap holds, without gaps."""
    spans = _group_spans(intervals)
    delta = np.zeros(max((last for *_, last in spans), default=-1) + 2, np.int64)
    for _, size, first, last in spans:
        delta[first] += size
        delta[last + (0 if after else 1)] -= size
    return np.cumsum(delta)[:-1]


def live_peak(intervals: list[Interval]) -> int:
    """The most bytes live at one event time (the packing's lower bound)."""
    return int(occupancy(intervals).max(initial=0))


def live_at(intervals: list[Interval], time: int) -> list[tuple[int, int]]:
    """(interval, bytes) for what is live at ``time``: one interval per colocated group, the member
    holding its memory then (the last to start), at the group's size; the bytes sum to
    ``occupancy(intervals)[time]``."""
    groups = _groups(intervals)
    out = []
    for i, size, first, last in _group_spans(intervals):
        if first <= time <= last:
            holders = [j for j in groups[i] if intervals[j].start <= time <= intervals[j].end]
            out.append((max(holders, key=lambda j: (intervals[j].start, j)), size))
    return out
