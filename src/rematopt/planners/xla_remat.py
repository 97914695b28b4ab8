"""``xla-remat``: XLA's rematerialization pass (``HloRematerialization``,
openxla/xla ``xla/hlo/transforms/simplifiers/hlo_rematerialization.cc``,
its default ``kAlwaysRemat`` algorithm), rebuilt on the graph from its
published algorithm. What a JAX user on GPU gets when a step does not fit.

The pass walks the program in its order with a memory tracker: placing a
node adds its bytes; a value dies (its bytes leave) when its last consumer
has run. At every node whose placement raises memory above the limit, it
rematerialises until memory is back under the limit or nothing helps:

1. **Candidates**: the values placed so far (``min_remat_size``: a block
   starts only at a value at least that large), not denylisted, recomputable,
   not an output and not read by the node being placed.
2. **Cost = memory reduced, not FLOPs.** A candidate's benefit is the bytes
   its rematerialisation frees at this point: its own bytes if it is live,
   less the bytes of each operand it reads that is dead now (rematerialising
   it would keep that operand alive up to the clone). The pass ranks by
   ``memory_limit // memory_reduced`` (integer division, as XLA's int64), 0
   when none of the candidate's consumers has run yet (the clone is then a
   free move), and takes the cheapest, the earliest in program order on a
   tie. What the recomputation costs never enters: on a graph whose costs are
   FLOPs, a large cheap value and a large expensive one rank alike.
3. **Recompute**: a clone of the value serves every consumer not yet placed;
   it is inserted before the earliest of those consumers and of the unplaced
   consumers of its operands (so no operand's life is extended). The clone
   is walked like any node, and may be rematerialised again. A clone that
   leaves its original without consumers is a move; a move of a move is
   denylisted (XLA's guard against an endless loop), and originals left
   without consumers are removed at the end (XLA's DCE).
4. **Blocks**: when no single value helps, blocks of consecutive placed
   values are tried, sizes ``max_block_size + 1 .. 2 x max_block_size``,
   doubling up to ``block_size_limit``, and only while the effort (blocks
   evaluated) stays within ``block_rematerialization_factor`` x the effort of
   the single-value search at this point.
5. **Host offload** (``host_offload``, XLA's third mode; its second,
   ``compress``, changes a value's layout to a smaller one, which a graph of
   byte counts cannot express): a single value may instead be copied to the
   host right after it is computed and brought back before its first unplaced
   consumer, if the compute between its last placed and its first unplaced
   consumer hides both copies (bytes / ``bandwidth_to_host`` + bytes /
   ``bandwidth_from_host``, in the graph's cost units; unset, a copy takes no
   time) and is not zero. Its cost is
   ``memory_limit // bytes``, so it wins against recomputing the same value.

The tracker counts memory as the simulator does (inputs from the start,
outputs to the end), so the limit is the budget itself; XLA counts neither
parameters nor outputs and subtracts the outputs from its limit (and the
parameters, as its callers are told to). The plan is the walked program's
final order with the frees placed after each value's last read
(:func:`~rematopt.planners.frees.place_frees`): its replayed peak is what the
status is judged on; ``tracker_peak_bytes`` is the pass's own estimate, which
never revises a point already walked (a rematerialisation that keeps a dead
operand alive raises memory at points the tracker has passed).

What the graph cannot carry (XLA works on scheduled, fused HLO): fusion
decisions are fixed before the pass (a graph node is one HLO instruction),
tuples, bitcasts and aliasing (indirect uses, which XLA never
rematerialises), control dependencies, called computations (while, call,
conditional bodies, each planned with the memory left at its call site),
asynchronous computations, and the cost analysis's own time model (here the
node's cost). In the replay a value has one copy at a time: where XLA's
program would briefly hold an original and its clone, or a device buffer in
flight to the host until its copy is done, the replay holds one copy, freed
after its last read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..graph import Graph
from ..plan import COMPUTE, OFFLOAD, PREFETCH, Plan
from .frees import place_frees
from .options import option, parse

RECOMPUTE, OFFLOADED = "recompute", "host-offload"
# Items the pass may create, as a multiple of the graph's nodes: XLA has no
# bound; a pass that grows past this stops rematerialising (OVER_BUDGET, stats
# ``stopped``) rather than run out of memory.
MAX_ITEMS_PER_NODE = 64


@dataclass(frozen=True)
class Options:
    """XLA's ``HloRematerialization::Options``, under XLA's names."""

    block_size_limit: int = option(1, "largest block of consecutive values rematerialised together (XLA's GPU "
                                   "compiler: 1).", minimum=1)
    block_rematerialization_factor: float = option(1.0, "block search effort <= this x the single-value "
                                                   "search's.", minimum=0, finite=True)
    min_remat_size: int = option(0, "a block starts only at a value of at least this many bytes.", minimum=0)
    recompute: bool = option(True, "XLA's recompute mode.")
    host_offload: bool = option(False, "XLA's host-offload mode.")
    # Unset, copies take no time: transfers are free, as cpsat prices them without --host-bandwidth.
    bandwidth_to_host: float = option(math.inf, "bytes per cost unit to the host (XLA's "
                                      "bandwidth_to_host_bytes_per_second; default: copies take no time).",
                                      minimum=0)
    bandwidth_from_host: float = option(math.inf, "bytes per cost unit from the host (XLA's "
                                        "bandwidth_from_host_bytes_per_second; default: copies take no time).",
                                        minimum=0)

    def __post_init__(self) -> None:
        for name in ("bandwidth_to_host", "bandwidth_from_host"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be > 0, got {getattr(self, name):g}")


class _Pass:
    """The instruction list, the memory tracker and the rematerialisations.

    Items are graph nodes (item i is node i) and the clones and host copies
    the pass adds (ids n, n+1, ...), in a linked list whose order is the
    program's. XLA's position numbers keep it ordered: an inserted item takes
    the number of the item it precedes, so numbers never decrease along the
    list. Per-item figures the candidate search reads are numpy arrays."""

    def __init__(self, graph: Graph, limit: int, opts: Options):
        g = self.g = graph
        self.limit, self.opts = limit, opts
        n = g.n
        self.node = list(range(n))
        self.kind = ["input" if v.is_input else "compute" for v in g.nodes]
        self.ops = [list(p) for p in g.preds]
        self.users = [list(s) for s in g.succs]
        self.unfinished = [len(s) for s in g.succs]
        self.placed = [v.is_input for v in g.nodes]
        self.deny = [False] * n
        self.alive = [False] * n
        self.never_freed = [v.output or v.persistent for v in g.nodes]
        self.remat = [not v.is_input and v.recomputable for v in g.nodes]
        self.offloadable = [v.offloadable for v in g.nodes]
        self.offload_of: dict[int, int] = {}  # host copy item -> the item offloaded
        self.host_copy: dict[int, int] = {}  # the item offloaded -> its host copy item
        self.pos = list(g.position)
        order = g.order
        self.nxt = [None] * n
        self.prv = [None] * n
        for a, b in zip(order, order[1:]):
            self.nxt[a], self.prv[b] = b, a
        self.first = order[0] if n else None
        cap = 2 * n + 16
        self.size = np.zeros(cap, dtype=np.int64)
        self.size[:n] = g.bytes
        self.live_sz = np.zeros(cap, dtype=np.int64)
        self.penalty = np.zeros(cap, dtype=np.int64)  # bytes of dead operands (placed items)
        self.placed_users = np.zeros(cap, dtype=np.int64)
        self.seq = np.full(cap, -1, dtype=np.int64)  # placement order
        self.eligible = np.zeros(cap, dtype=bool)  # skip node, rematerialisable, not denylisted
        self.eligible[:n] = [self.remat[i] and g.bytes[i] >= opts.min_remat_size for i in range(n)]
        self.is_out = np.zeros(cap, dtype=bool)
        self.is_out[:n] = [v.output for v in g.nodes]
        self.blockable = np.zeros(cap, dtype=bool)  # may be in a block: rematerialisable, not denylisted
        self.blockable[:n] = self.remat
        # Dead-operand bytes of each item by distance back in placement order
        # (1 .. block_size_limit - 1): the block search's operands inside a block.
        self.near = np.zeros((cap, opts.block_size_limit), dtype=np.int64)
        # By placement order: the item, whether it starts a block (XLA's skip
        # lane), whether an item placed unwalked precedes it in the list.
        self.at_seq = np.zeros(cap, dtype=np.int64)
        self.skip_seq = np.zeros(cap, dtype=bool)
        self.barrier = np.zeros(cap, dtype=bool)
        self.cost_prefix = np.concatenate([[0.0], np.cumsum([g.cost[i] for i in order])])  # host-offload timing
        self.in_progress: int | None = None
        self.counter = 0
        self.mem = 0
        self.tracker_peak = 0
        self.remat_moves: set[int] = set()
        self.rematerialized = 0
        self.offloads = 0
        self.max_block = 0
        self.stopped = False
        self.item_cap = MAX_ITEMS_PER_NODE * max(n, 1)
        for i in g.initial_resident:
            self.seq[i] = -1
            self._refresh(i)
        self.tracker_peak = self.mem

    # -- items ----------------------------------------------------------------

    def _new_item(self, node: int, kind: str, ops: list[int]) -> int:
        k = len(self.node)
        if k >= len(self.size):
            for name in ("size", "live_sz", "penalty", "placed_users", "seq", "eligible", "is_out", "blockable",
                         "near", "at_seq", "skip_seq", "barrier"):
                old = getattr(self, name)
                grown = np.full((2 * len(old),) + old.shape[1:], -1 if name == "seq" else 0, dtype=old.dtype)
                grown[:len(old)] = old
                setattr(self, name, grown)
        self.node.append(node)
        self.kind.append(kind)
        self.ops.append(ops)
        self.users.append([])
        self.unfinished.append(0)
        self.placed.append(False)
        self.deny.append(kind != "compute")
        self.alive.append(False)
        self.never_freed.append(False)
        self.remat.append(kind == "compute")
        self.offloadable.append(self.offloadable[node])
        self.nxt.append(None)
        self.prv.append(None)
        self.pos.append(0)
        self.size[k] = self.g.bytes[node]
        self.eligible[k] = self.blockable[k] = kind == "compute"  # inserted items are always on XLA's skip lane
        return k

    def _insert_before(self, k: int, before: int) -> None:
        p = self.prv[before]
        self.prv[k], self.nxt[k] = p, before
        self.prv[before] = k
        if p is None:
            self.first = k
        else:
            self.nxt[p] = k
        self.pos[k] = self.pos[before]

    def _earliest(self, items: list[int]) -> int:
        """The first of ``items`` in the list (XLA's InsertBeforeInstructions):
        the lowest position number, then the list order among equal numbers."""
        wanted = set(items)
        k = min(items, key=self.pos.__getitem__)
        while self.prv[k] is not None and self.pos[self.prv[k]] == self.pos[k]:
            k = self.prv[k]
        while k not in wanted:
            k = self.nxt[k]
        return k

    # -- the tracker --------------------------------------------------------------

    def _refresh(self, k: int) -> None:
        """Set k's liveness from its state: placed, and a consumer not yet run
        (or never freed, or being placed). A change moves memory and the dead
        operand bytes of k's placed consumers."""
        alive = self.placed[k] and (self.unfinished[k] > 0 or self.never_freed[k] or k == self.in_progress)
        if alive == self.alive[k]:
            return
        self.alive[k] = alive
        b = int(self.size[k])
        self.live_sz[k] = b if alive else 0
        self.mem += b if alive else -b
        if b:
            here, depth = int(self.seq[k]), self.near.shape[1]
            for u in self.users[k]:
                if self.placed[u]:
                    self.penalty[u] += -b if alive else b
                    d = int(self.seq[u]) - here
                    if here >= 0 and 0 < d < depth:
                        self.near[u, d] += -b if alive else b

    def begin(self, k: int) -> None:
        self.placed[k] = True
        self.in_progress = k
        self.seq[k] = self.counter
        self.at_seq[self.counter] = k
        self.skip_seq[self.counter] = self._on_skip_lane(k)
        p = self.prv[k]
        self.barrier[self.counter] = p is not None and self.seq[p] < 0
        self.counter += 1
        for o in self.ops[k]:
            self.placed_users[o] += 1
        self.penalty[k] = sum(int(self.size[o]) for o in self.ops[k] if not self.alive[o])
        self._refresh(k)

    def end(self, k: int) -> None:
        self.in_progress = None
        for o in self.ops[k]:
            self.unfinished[o] -= 1
            self._refresh(o)
        self._refresh(k)

    # -- the walk -------------------------------------------------------------------

    def run(self) -> None:
        k = self.first
        while k is not None:
            if self.kind[k] == "input":  # resident from the start (XLA's parameters)
                k = self.nxt[k]
                continue
            self.begin(k)
            if self.size[k] > 0:
                self._rematerialize_here()
            self.tracker_peak = max(self.tracker_peak, self.mem)
            self.end(k)
            k = self.nxt[k]

    def _rematerialize_here(self) -> None:
        """XLA's loop at one program point: single values first; when none
        helps, blocks of growing size, within the effort factor."""
        lo = hi = 1
        first_phase, effort1, effort2 = True, 0, 0
        o = self.opts
        while self.mem > self.limit and not self.stopped:
            found, effort = self._pick(lo, hi)
            if first_phase:
                effort1 += effort
            else:
                effort2 += effort
            if found is None:
                lo, hi = hi + 1, 2 * hi
                first_phase = False
            else:
                strategy, block = found
                if strategy == OFFLOADED:
                    self._offload(block[0])
                else:
                    self._recompute(block)
                self.max_block = max(self.max_block, hi)
                lo = hi = 1
                if len(self.node) > self.item_cap:
                    self.stopped = True
            if hi > o.block_size_limit or effort2 > o.block_rematerialization_factor * effort1:
                break

    # -- choosing ---------------------------------------------------------------------

    def _pick(self, lo: int, hi: int) -> tuple[tuple[str, list[int]] | None, int]:
        """The cheapest candidate block of size lo..hi and the effort spent
        (blocks evaluated), as XLA's PickRematerializationCandidates."""
        if hi == 1:
            return self._pick_single()
        return self._pick_blocks(lo, hi)

    def _candidates(self) -> tuple[np.ndarray, int]:
        """Placed eligible items the search may start at (the node being
        placed aside) and the effort XLA spends on them: one evaluation per
        start, per strategy."""
        cap = len(self.node)
        mask = self.eligible[:cap] & (self.seq[:cap] >= 0)
        if self.in_progress is not None:
            mask[self.in_progress] = False
        per_start = int(self.opts.recompute) + int(self.opts.host_offload)
        return mask, int(mask.sum()) * per_start

    def _pick_single(self) -> tuple[tuple[str, list[int]] | None, int]:
        """XLA's scan at block size 1, over every placed value at once: the
        lowest cost, then the earliest in program order; offload before
        recompute on a tie (XLA evaluates it first for each start)."""
        mask, effort = self._candidates()
        cap = len(self.node)
        in_use = self.ops[self.in_progress] if self.in_progress is not None else []
        ok = mask & ~self.is_out[:cap]
        ok[in_use] = False
        best: tuple | None = None  # (cost, seq, strategy order, strategy, item)
        if self.opts.recompute:
            m = self.live_sz[:cap] - self.penalty[:cap]
            idx = np.flatnonzero(ok & (m > 0))
            if idx.size:
                cost = np.where(self.placed_users[idx] > 0, self.limit // m[idx], 0)
                at = idx[cost == cost.min()]
                k = int(at[np.argmin(self.seq[at])])
                best = (int(cost.min()), int(self.seq[k]), 1, RECOMPUTE, k)
        if self.opts.host_offload:
            off = self._pick_offload(ok, best)
            if off is not None:
                best = off
        return (None if best is None else (best[3], [best[4]])), effort

    def _pick_offload(self, ok: np.ndarray, best: tuple | None) -> tuple | None:
        """The cheapest value that may go to the host: cost limit // bytes,
        checked for time in (cost, program order) until one passes or the
        recompute choice is better."""
        cap = len(self.node)
        unfinished = np.fromiter((u > 0 for u in self.unfinished), dtype=bool, count=cap)
        offloadable = np.fromiter(self.offloadable, dtype=bool, count=cap)
        sizes = self.size[:cap]
        idx = np.flatnonzero(ok & unfinished & offloadable & (sizes > 0))
        if not idx.size:
            return None
        cost = self.limit // sizes[idx]
        for j in np.lexsort((self.seq[idx], cost)):
            k = int(idx[j])
            key = (int(cost[j]), int(self.seq[k]), 0, OFFLOADED, k)
            if best is not None and key[:3] > best[:3]:
                return None
            if self._hides_copies(k):
                return key
        return None

    def _hides_copies(self, k: int) -> bool:
        """Whether the compute from k's last placed consumer (or k) to its first
        unplaced one covers both copies (clones count no time, as XLA's cost
        analysis has not seen them)."""
        placed = [u for u in self.users[k] if self.placed[u]]
        start = max(placed, key=lambda u: self.seq[u]) if placed else k
        stop = self._earliest([u for u in self.users[k] if not self.placed[u]])
        spent = self.cost_prefix[self.pos[stop]] - self.cost_prefix[self.pos[start]]
        b = float(self.size[k])
        need = b / self.opts.bandwidth_to_host + b / self.opts.bandwidth_from_host
        return spent > 0 and spent >= need

    def _pick_blocks(self, lo: int, hi: int) -> tuple[tuple[str, list[int]] | None, int]:
        """XLA's scan for blocks of lo..hi consecutive placed items from each
        start on the skip lane, in list order, evaluated for all starts at
        once. The placed items before the node being placed are the items
        begun so far, in placement order (a seq); ``barrier`` marks where an
        item placed without being walked (an input, a host copy) sits between
        two of them. A block frees the bytes of its live items less those of
        each item's dead operands outside the block (``penalty`` less ``near``,
        the dead operands at each distance back); it is out if it holds an
        output or an operand of the node being placed; it is free (cost 0)
        when none of its items has a placed consumer. The cheapest block wins,
        then the earliest start, then the smallest size (XLA's order)."""
        n = self.counter - (self.in_progress is not None)
        items = self.at_seq[:n]
        valid = self.blockable[items]
        cut = ~valid | self.barrier[:n]
        idx = np.where(cut, np.arange(n), n)
        next_cut = np.append(np.minimum.accumulate(idx[::-1])[::-1], n)
        s = np.arange(n)
        run = np.where(valid, next_cut[1:] - s, 0)  # consecutive valid items from s
        starts = self.skip_seq[:n] & (run >= lo)
        effort = int(np.sum(np.minimum(run[starts], hi) - lo + 1))
        bad = self.is_out[items].copy()
        if self.in_progress is not None:
            bad |= np.isin(items, self.ops[self.in_progress])
        alive, penalty = self.live_sz[items], self.penalty[items]
        near, used = self.near[items], self.placed_users[items] > 0
        best: tuple[int, int, int] | None = None
        reduced = np.zeros(n, dtype=np.int64)
        any_bad = np.zeros(n, dtype=bool)
        any_used = np.zeros(n, dtype=bool)
        for t in range(min(hi, n)):  # item s + t of the block starting at s
            m = n - t
            reduced[:m] += alive[t:] - penalty[t:] + near[t:, 1:t + 1].sum(axis=1)
            any_bad[:m] |= bad[t:]
            any_used[:m] |= used[t:]
            size = t + 1
            if size < lo:
                continue
            ok = np.flatnonzero(starts & (run >= size) & ~any_bad & (reduced > 0))
            if not ok.size:
                continue
            cost = np.where(any_used[ok], self.limit // np.maximum(reduced[ok], 1), 0)
            j = int(np.argmin(cost))  # the first start among the cheapest
            key = (int(cost[j]), int(ok[j]), size)
            if best is None or key < best:
                best = key
        if best is None:
            return None, effort
        first, size = best[1], best[2]
        return (RECOMPUTE, [int(k) for k in items[first:first + size]]), effort

    def _on_skip_lane(self, k: int) -> bool:
        """XLA's skip lane: items at least min_remat_size large when the pass
        starts, and every item it inserts."""
        return self.kind[k] != "input" and (k >= self.g.n or int(self.size[k]) >= self.opts.min_remat_size)

    # -- transforming -------------------------------------------------------------------

    def _recompute(self, block: list[int]) -> None:
        """Clone each block item that still has unplaced consumers, last first
        (so a clone's operands inside the block are cloned after it, and
        precede it), as XLA's RematerializeInstructions."""
        self.rematerialized += len(block)
        for b in reversed(block):
            moved = [u for u in self.users[b] if not self.placed[u]]
            if not moved:
                continue
            c = self._new_item(self.node[b], "compute", list(self.ops[b]))
            for o in self.ops[c]:
                self.users[o].append(c)
                self.unfinished[o] += 1
                self._refresh(o)
            for u in moved:
                self.ops[u] = [c if o == b else o for o in self.ops[u]]
            self.users[c] = moved
            self.unfinished[c] = len(moved)
            self.users[b] = [u for u in self.users[b] if self.placed[u]]
            self.unfinished[b] = 0
            self._refresh(b)
            around = [u for o in self.ops[c] for u in self.users[o] if u != c and not self.placed[u]]
            self._insert_before(c, self._earliest(moved + around))
            if not self.users[b]:  # a move: b is dead code now
                if b in self.remat_moves:
                    self.deny[c] = True
                    self.eligible[c] = self.blockable[c] = False
                self.remat_moves.add(c)

    def _hide(self, start: int, links: list, stop: int, seconds: float) -> int:
        """The item reached from ``start`` along ``links`` (next or previous)
        once ``seconds`` of compute lie between, or the last before ``stop``
        or the end: where a transfer of that length is hidden."""
        at, spent = start, 0.0
        while spent < seconds:
            step = links[at]
            if step is None or step == stop:
                break
            at = step
            spent += self._time(at)
        return at

    def _offload(self, b: int) -> None:
        """XLA's OffloadInstruction: the copy to the host right after b, the
        copy back before b's first unplaced consumer, started early enough
        for the compute in between to hide it (here: the host copy's item,
        where the device buffer comes back, never before b's last placed read)."""
        self.offloads += 1
        moved = [u for u in self.users[b] if not self.placed[u]]
        first = self._earliest(moved)
        b_bytes = float(self.size[b])
        to_host = b_bytes / self.opts.bandwidth_to_host
        from_host = b_bytes / self.opts.bandwidth_from_host
        # the copy to the host is done after enough compute from b (the first item not counted)
        done = self._hide(b, self.nxt, first, to_host)
        placed = [u for u in self.users[b] if self.placed[u]]
        last_read = max(placed, key=lambda u: self.seq[u]) if placed else b
        stop = last_read if self._precedes(done, last_read) else done
        # the copy back starts early enough before `first`, not before `stop`
        at = self._hide(first, self.prv, stop, from_host)
        h = self._new_item(self.node[b], "prefetch", [])
        self.offload_of[h] = b
        self.host_copy[b] = h
        for u in moved:
            self.ops[u] = [h if o == b else o for o in self.ops[u]]
        self.users[h] = moved
        self.unfinished[h] = len(moved)
        self.users[b] = placed
        self.unfinished[b] = 0
        self._refresh(b)
        self._insert_before(h, at)
        if self.placed[at]:  # the copy back starts before the node being placed
            self.placed[h] = True
            self.barrier[self.seq[at]] = True
            self._refresh(h)

    def _time(self, k: int) -> float:
        return self.g.cost[k] if k < self.g.n and self.kind[k] == "compute" else 0.0

    def _precedes(self, a: int, b: int) -> bool:
        """Whether item a comes before item b in the list."""
        if self.pos[a] != self.pos[b]:
            return self.pos[a] < self.pos[b]
        k = a
        while k is not None and self.pos[k] == self.pos[a]:
            if k == b:
                return a != b
            k = self.nxt[k]
        return False

    # -- the program ---------------------------------------------------------------------

    def schedule(self) -> tuple[list[tuple[int, int]], int]:
        """The final program as (op, node) events without frees, after XLA's
        dead-code elimination: items left without consumers that had some
        (moved originals, host copies nobody reads) go, transitively."""
        g, n = self.g, self.g.n
        gone = [False] * len(self.node)

        def dead(k: int) -> bool:
            if gone[k] or self.users[k] or self.never_freed[k] or self.kind[k] == "input":
                return False
            if k < n and not g.succs[k]:
                return False  # never had a consumer: part of the program as given
            h = self.host_copy.get(k)
            return h is None or gone[h]

        work = [k for k in range(len(self.node)) if dead(k)]
        while work:
            k = work.pop()
            if not dead(k):
                continue
            gone[k] = True
            for o in self.ops[k]:
                self.users[o].remove(k)
                if dead(o):
                    work.append(o)
            b = self.offload_of.get(k)
            if b is not None and dead(b):
                work.append(b)
        offloaded = {b for h, b in self.offload_of.items() if not gone[h]}
        events: list[tuple[int, int]] = []
        k = self.first
        while k is not None:
            if not gone[k]:
                if self.kind[k] == "compute":
                    events.append((COMPUTE, self.node[k]))
                    if k in offloaded:
                        events.append((OFFLOAD, self.node[k]))
                elif self.kind[k] == "prefetch":
                    events.append((PREFETCH, self.node[k]))
            k = self.nxt[k]
        return events, sum(gone)


def plan(graph: Graph, budget: int | None, options: dict[str, Any]) -> Plan:
    opts = parse(Options, options, "xla-remat")
    p = _Pass(graph, budget if budget is not None else 0, opts)
    if budget is not None and (opts.recompute or opts.host_offload):
        p.run()
    events, removed = p.schedule()
    details = {
        "tracker_peak_bytes": p.tracker_peak if budget is not None else None,
        "rematerialized": p.rematerialized,
        "clones": len([k for k in range(graph.n, len(p.node)) if p.kind[k] == "compute"]),
        "offloaded": p.offloads,
        "dead_code_removed": removed,
        "max_rematerialized_block_size": p.max_block,
        "stopped": p.stopped,
    }
    return place_frees(graph, events, "xla-remat", budget, details)
