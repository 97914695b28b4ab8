"""Rotor's dynamic program over a chain of stages, with per-stage options.

``Opt(s, t, m, keep)``: the least cost of running the backward of stages
``t`` down to ``s`` with ``m`` bytes free, entering with stage s's input
(``cin``) and stage t's incoming gradient resident, leaving stage s's
gradient behind (and its recomputable input too when ``keep``: the stage
before reads it in its backward). Three ways (Beaumont et al. 2019, with
Rockmate's per-block options in place of Rotor's two forward modes):

- **split** at s < s' <= t: run the forwards of s .. s'-1 keeping only each
  stage's output (a *sweep*), the last one being the checkpoint of
  ``Opt(s', t)``; then ``Opt(s, s'-1)`` from s's input again;
- **keep** (s < t): run stage s's forward keeping what option o's backward
  reads first (``K_o``), ``Opt(s+1, t)``, then o's backward;
- **fused** (s = t): the forward and o's backward in one piece (the turn,
  stage L, is an empty piece).

An option is a backward *sequence* for its stage: computes in order,
forward values recomputed among them (:mod:`.options` gets them from CP-SAT
on the stage's subgraph). Every piece's memory is exact
(:class:`.chain.Piece`); the DP counts it in slots of ``unit`` bytes, what a
piece needs rounded up and what it leaves behind to the nearest slot, and
:func:`solve` checks the plan's exact peak against the budget. With
``window`` w, a split's first segment is at most w stages long (exact Rotor:
w >= L); the DP then keeps O(L w) states instead of O(L^2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .chain import Chain, Piece, cost, once, translation

INF = math.inf


@dataclass(frozen=True)
class Option:
    """A backward sequence of one stage (real node ids) and its cost."""

    seq: tuple[int, ...]
    cost: float


@dataclass
class Pieces:
    """Every piece the DP may use, with its exact memory. Per stage k < L and
    ``again`` (0: its first forward, which computes every node; 1: a
    re-run, which computes only what is kept or read after it): its forward
    keeping only its output (``ck[k][again][free_in]``, freeing its input or
    not), and per option o the forward keeping what o reads first
    (``keep[k][o][again][keep]``, ``keep``: whether the stage's recomputable
    input must outlive it), o's backward (``back[k][o][keep]``), and both
    fused in one re-run piece (``fused[k][o][keep]``); and the turn."""

    chain: Chain
    options: list[list[Option]]
    ck: list[list[tuple[Piece, Piece]]] = field(init=False)
    ck_cost: list[list[float]] = field(init=False)  # [k][again]
    keep: list[list[list[tuple[Piece, Piece]]]] = field(init=False)
    keep_cost: list[list[list[float]]] = field(init=False)  # [k][o][again]
    back: list[list[tuple[Piece, Piece]]] = field(init=False)
    fused: list[list[tuple[Piece, Piece]]] = field(init=False)
    fused_cost: list[list[float]] = field(init=False)
    child_keep: list[list[int]] = field(init=False)  # [k][o]: whether o reads stage k+1's input first
    turn: tuple[Piece, Piece] = field(init=False)
    turn_cost: float = field(init=False)

    def __post_init__(self) -> None:
        ch, g = self.chain, self.chain.graph
        L = ch.length
        st = ch.stages
        self.ck, self.ck_cost = [], []
        self.keep, self.keep_cost, self.back, self.fused, self.fused_cost, self.child_keep = [], [], [], [], [], []
        self.moves: list[dict[int, int] | None] = [None] * (L + 1)  # stage k's pieces are stage r's, moved
        first_of: dict[tuple, int] = {}
        for k, s in enumerate(st[:L]):
            kinds = tuple(x.kind for x in st[max(0, k - 1):k + 2])
            r = first_of.setdefault(kinds, k)
            mapping = translation(ch, r, k) if r != k else None
            if mapping is not None:
                self.moves[k] = mapping
                for table in (self.ck, self.ck_cost, self.keep, self.keep_cost, self.back, self.fused,
                              self.fused_cost, self.child_keep):
                    table.append(table[r])
                self.options[k] = [Option(tuple(mapping[v] for v in o.seq), o.cost) for o in self.options[r]]
                continue
            nxt, fwd, backward = st[k + 1], set(s.forward), set(s.backward)
            runs = (s.forward, _needed(g, s.forward, nxt.cin_rec))
            self.ck.append([tuple(Piece.of(g, f, cin, nxt.cin_rec) for cin in ((), s.cin_rec)) for f in runs])
            self.ck_cost.append([cost(g, f) for f in runs])
            valid, keeps, kcosts, backs, fuseds, fcosts, kids = [], [], [], [], [], [], []
            for o in self.options[k]:
                if any(once(g, v) for v in o.seq if v in fwd):
                    continue  # recomputes what is computed once
                first = _read_first(g, o.seq)
                kept = first & fwd
                valid.append(o)
                needs = first & (s.cin_rec | s.cin_fix)
                kid = 1 if kept & nxt.cin_rec else 0
                kids.append(kid)
                if kid:  # the next stage keeps all its input for this backward, which frees it
                    kept = kept | nxt.cin_rec
                runs = (s.forward, _needed(g, s.forward, kept | nxt.cin_rec))
                keeps.append([tuple(Piece.of(g, f, (cin - needs) | (s.cin_fix - needs), kept | nxt.cin_rec)
                                    for cin in (s.cin_rec, frozenset())) for f in runs])
                kcosts.append([cost(g, f) for f in runs])
                backs.append(tuple(Piece.of(g, o.seq, kept | s.gin | s.releases | (needs & (cin | s.cin_fix)),
                                            s.gout | s.held) for cin in (s.cin_rec, frozenset())))
                # fused: the recomputes before the first backward node are the forward's to do
                start = next((j for j, v in enumerate(o.seq) if v in backward), len(o.seq))
                rest = o.seq[start:]
                fseq = _needed(g, s.forward, _read_first(g, rest) & fwd) + rest
                fuseds.append(tuple(Piece.of(g, fseq, cin | s.cin_fix | s.gin | s.releases, s.gout | s.held)
                                    for cin in (s.cin_rec, frozenset())))
                fcosts.append(cost(g, [v for v in fseq if v not in backward]))
            self.options[k] = valid
            self.keep.append(keeps)
            self.keep_cost.append(kcosts)
            self.back.append(backs)
            self.fused.append(fuseds)
            self.fused_cost.append(fcosts)
            self.child_keep.append(kids)
        t = st[L]
        self.turn = tuple(Piece.of(g, t.forward, cin | t.cin_fix | t.releases, t.gout | t.held)
                          for cin in (t.cin_rec, frozenset()))
        self.turn_cost = cost(g, t.forward)


def _needed(graph, forward: tuple[int, ...], targets) -> tuple[int, ...]:
    """The nodes of ``forward`` that ``targets`` need (themselves included),
    in order: what a re-run of the stage computes."""
    inside = set(forward)
    need, stack = set(), [v for v in targets if v in inside]
    while stack:
        v = stack.pop()
        if v not in need:
            need.add(v)
            stack.extend(p for p in graph.preds[v] if p in inside)
    return tuple(v for v in forward if v in need)


def _read_first(graph, seq) -> set[int]:
    """Values ``seq`` reads before computing them: what must be resident when it starts."""
    made, out = set(), set()
    for v in seq:
        out.update(p for p in graph.preds[v] if p not in made)
        made.add(v)
    return out


@dataclass(frozen=True)
class Result:
    """The DP's plan: its pieces in order and their exact figures."""

    pieces: tuple[Piece, ...]
    peak: int
    cost: float  # every compute, first ones included
    unit: int
    window: int


def solve(pieces: Pieces, budget: int, slots: int = 1000, window: int | None = None) -> Result | None:
    """The cheapest chain plan within ``budget`` (bytes), or None. Memory
    is counted in ``slots`` slots between what is resident at the start and
    the budget (exact when the byte sizes' gcd gives fewer)."""
    ch, g = pieces.chain, pieces.chain.graph
    L = ch.length
    W = L + 1 if window is None else max(1, window)
    base = g.initial_bytes - sum(g.bytes[i] for i in ch.dead)
    if base > budget:
        return None
    # memory freed later (a dropped input, say) may give a state more room than the start
    # has: the table reaches up to all but the persistent bytes
    room, top = budget - base, budget - g.persistent_bytes
    sizes = [b for b in g.bytes if b]
    unit = max(math.gcd(*sizes) if sizes else 1, -(-top // slots), 1)
    M = top // unit
    dp = _Table(pieces, unit, M, W)
    dp.fill_all()
    start = room // unit
    # ends are rounded to the nearest slot, so the exact peak may pass the budget by a little:
    # then ask again with that much less room
    for _ in range(RETRIES):
        if start < 0 or not math.isfinite(dp.cost[0, L, 0][start]):
            return None
        out: list[Piece] = []
        _, peak = dp.unfold(start, out, base, g.initial_bytes)
        if peak <= budget:
            return Result(tuple(out), peak, cost(g, [v for x in out for v in x.seq]), unit, W)
        start -= max(1, dp.up(peak - budget))
    return None


# Times :func:`solve` lowers the room when the exact peak passes the budget.
RETRIES = 4


class _Table:
    """Opt(s, t, keep) as arrays over free slots 0..M, with the choice made
    at each (for :meth:`unfold`)."""

    def __init__(self, pieces: Pieces, unit: int, M: int, W: int):
        self.p, self.unit, self.M, self.W = pieces, unit, M, W
        ch, g = pieces.chain, pieces.chain.graph
        self.L = L = ch.length
        self.sizes = [s.sizes(g) for s in ch.stages]
        self.m = np.arange(M + 1)
        self.fixed = [s.fixed(g) for s in ch.stages]
        self.cost: dict[tuple[int, int, int], np.ndarray] = {}
        self.choice: dict[tuple[int, int, int], np.ndarray] = {}
        # sweeps: the forward of stage k run keeping only its output; prefix costs, first pass and re-run
        self.fprefix = [np.concatenate(([0.0], np.cumsum([c[again] for c in pieces.ck_cost]))) for again in (0, 1)]
        z = self.sizes
        self.net = np.concatenate(([0], np.cumsum([x.held - x.releases - x.cin_fix for x in z])))
        # what a sweep from s to s2 needs: its stage k's forward, beside stage k's input (k > s)
        self.ck_need = [[(self.up(pieces.ck[k][again][0].profile.peak),
                          self.up(z[k].cin_rec + pieces.ck[k][again][1].profile.peak)) for k in range(L)]
                        for again in (0, 1)]

    def up(self, x: int) -> int:
        """Bytes to slots, rounded up (what a piece needs)."""
        return -(-x // self.unit)

    def near(self, x: int) -> int:
        """Bytes to slots, rounded to the nearest (what a piece leaves
        behind: rounding it up at every level of a long chain lost 2.7 MB of
        the 48-layer decoder's 57 MB; :func:`solve` checks the exact peak)."""
        return (x + self.unit // 2) // self.unit

    def exit_delta(self, s: int, t: int, keep: int) -> int:
        """Net bytes after Opt(s, t, keep), from its entry: exact, whatever it chose."""
        z = self.sizes
        net = int(self.net[t + 1] - self.net[s])
        return net - (1 - keep) * z[s].cin_rec - z[t].gin + z[s].gout

    def fill_all(self) -> None:
        """Every state, each after those it reads: the stages' own
        segments (t < L, at most ``W`` long) by t, then Opt(s, L) by s
        downwards."""
        L, W = self.L, self.W
        for t in range(L):
            for s in range(t, max(0, t - W + 1) - 1, -1):
                for keep in (0, 1):
                    self._fill(s, t, keep)
        for s in range(L, -1, -1):
            for keep in (0, 1):
                self._fill(s, L, keep)

    def opt(self, s: int, t: int, keep: int) -> np.ndarray:
        return self.cost[s, t, keep]

    def shifted(self, arr: np.ndarray, need: int) -> np.ndarray:
        """``arr[m - need]`` for every m (inf where negative, the top where above)."""
        idx = self.m - need
        out = arr[np.clip(idx, 0, self.M)]
        return np.where(idx < 0, INF, out)

    def _rows(self, keys: list[tuple[int, int, int]], needs: list[int]) -> np.ndarray:
        """``cost[key][m - need]`` for each (key, need), as rows (see :meth:`shifted`)."""
        idx = self.m[None, :] - np.asarray(needs)[:, None]
        rows = np.stack([self.cost[k] for k in keys])
        out = np.take_along_axis(rows, np.clip(idx, 0, self.M), axis=1)
        out[idx < 0] = INF
        return out

    def _fill(self, s: int, t: int, keep: int) -> None:
        p, L, m = self.p, self.L, self.m
        best = np.full(self.M + 1, INF)
        choice = np.full(self.M + 1, -1, dtype=np.int32)
        if t < L and self.fixed[s]:  # every way of Opt(s, t < L) runs stage s's forward again
            self.cost[s, t, keep], self.choice[s, t, keep] = best, choice
            return

        def offer(c: np.ndarray, code) -> None:
            better = c < best
            best[better] = c[better]
            choice[better] = code[better] if isinstance(code, np.ndarray) else code

        again = 1 if t < L else 0  # past the first pass, every forward is a re-run
        if s == t:
            if t == L:
                prof = p.turn[keep].profile
                offer(np.where(m >= self.up(prof.peak), p.turn_cost, INF), 0)
            else:
                for o, prof in enumerate(p.fused[s]):
                    offer(np.where(m >= self.up(prof[keep].profile.peak), p.fused_cost[s][o], INF), o)
        else:
            for o, opt in enumerate(p.options[s]):
                kprof, bprof = p.keep[s][o][again][keep].profile, p.back[s][o][keep].profile
                kid = p.child_keep[s][o]
                sub = self.shifted(self.opt(s + 1, t, kid), self.near(kprof.end))
                need_b = self.up(kprof.end + self.exit_delta(s + 1, t, kid) + bprof.peak)
                ok = (m >= self.up(kprof.peak)) & (m >= need_b)
                offer(np.where(ok, p.keep_cost[s][o][again] + sub + opt.cost, INF), self.M + 1 + o)
            splits = range(s + 1, min(t, s + self.W) + 1)
            if len(splits):  # all at once: sweep s .. s2-1, Opt(s2, t, 0), then Opt(s, s2-1, keep)
                z = self.sizes
                need = np.maximum.accumulate([self.ck_need[again][k][k > s] for k in range(s, splits[-1])])
                first = self._rows([(s2, t, 0) for s2 in splits], [self.near(z[s2].cin_rec) for s2 in splits])
                second = self._rows([(s, s2 - 1, keep) for s2 in splits],
                                    [self.near(z[s2].cin_rec + self.exit_delta(s2, t, 0)) for s2 in splits])
                prefix = self.fprefix[again]
                total = (prefix[splits.start:splits.stop] - prefix[s])[:, None] + first + second
                total[m[None, :] < need[:, None]] = INF
                row = np.argmin(total, axis=0)
                offer(total[row, m], 2 * (self.M + 1) + splits.start + row)
        self.cost[s, t, keep] = best
        self.choice[s, t, keep] = choice

    def unfold(self, free: int, out: list[Piece], mem: int, peak: int) -> tuple[int, int]:
        """Append the pieces of Opt(0, L, 0) at ``free`` slots to ``out``;
        returns the bytes resident after them and the peak, from ``mem`` and
        ``peak`` before them (exact, piece by piece)."""
        p, z, top = self.p, self.sizes, self.M + 1
        todo: list[tuple] = [("opt", 0, self.L, 0, free)]  # a stack: the next piece last
        while todo:
            item = todo.pop()
            if item[0] == "run":
                piece, stage = item[1], item[2]
                move = p.moves[stage] if stage < self.L else None
                out.append(piece if move is None else piece.moved(move))
                peak = max(peak, mem + piece.profile.peak)
                mem += piece.profile.end
                continue
            _, s, t, keep, free = item
            free = min(free, self.M)
            code = int(self.choice[s, t, keep][free])
            assert code >= 0, (s, t, keep, free)
            again = 1 if t < self.L else 0
            if s == t:
                todo.append(("run", p.turn[keep] if t == self.L else p.fused[s][code][keep], s))
            elif code < 2 * top:
                o = code - top
                kid, kpiece = p.child_keep[s][o], p.keep[s][o][again][keep]
                todo += [("run", p.back[s][o][keep], s), ("opt", s + 1, t, kid, free - self.near(kpiece.profile.end)),
                         ("run", kpiece, s)]
            else:
                s2 = code - 2 * top
                todo += [("opt", s, s2 - 1, keep, free - self.near(z[s2].cin_rec + self.exit_delta(s2, t, 0))),
                         ("opt", s2, t, 0, free - self.near(z[s2].cin_rec))]
                todo += [("run", p.ck[k][again][1 if k > s else 0], k) for k in reversed(range(s, s2))]
        return mem, peak
