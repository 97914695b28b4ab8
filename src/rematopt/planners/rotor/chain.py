"""A training step as a chain of stages, and the exact memory of running
pieces of it.

The chain (Rotor's heterogeneous chain, Beaumont et al. 2019) is read off a
block table (:mod:`rematopt.blocks`): program order must be ``pre``, the
blocks' forwards, the head and loss (forward, then backward), the
blocks' backwards in reverse, then ``post``. Stage 0 is ``pre`` with
``post`` as its backward (the embedding and its gradient), then the blocks,
then the head, and last the *turn*, stage L, empty. Every value must flow
along the chain:

- a forward value of stage k is read only in stages k and k+1 (those read
  in k+1 are its input ``cin_rec``: recomputable, by re-running stage k);
- an input read by one stage's forward only is that stage's ``cin_fix``
  (freed by its last read); any other stays until the backward of the
  earliest stage that reads it (``releases`` of that stage);
- a backward value of stage k is read only in stages k and k-1: the
  gradient ``gout`` of k, ``gin`` of k-1; one read further on, or an
  output, is ``held`` (until that read: ``releases`` of its stage).

Anything else (a forward value read two stages on, say) raises
NotApplicable: the chain DP is not for that graph.

A plan is a sequence of :class:`Piece`: computes, each value freed right
after its last read before it is computed again (as place_frees does), the
values a piece leaves behind and the ones it releases said explicitly. A
piece's memory is exact, so pieces add up to the replay's figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from ...blocks import BlockTable
from ...errors import NotApplicable
from ...graph import Graph
from ...plan import PlanBuilder


@dataclass(frozen=True)
class Stage:
    """One link of the chain. ``kind``: stages of one kind share their
    options (None: its own); ``members``: canonical order (``Block.nodes``),
    the k-th member of two stages of one kind correspond."""

    kind: int | None
    members: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    cin_rec: frozenset[int]  # the previous stage's forward values read here
    cin_fix: frozenset[int]  # inputs only this stage's forward reads
    gin: frozenset[int]  # the next stage's backward values read here
    gout: frozenset[int]  # own backward values the previous stage reads
    held: frozenset[int]  # own backward values that stay: outputs, values read further on
    releases: frozenset[int]  # held values whose last read is here

    def fixed(self, graph: Graph) -> bool:
        """Whether its forward holds a node computed once (:func:`once`):
        then it runs once, in the first pass, and is never swept again."""
        return any(once(graph, v) for v in self.forward)

    def sizes(self, graph: Graph) -> "Sizes":
        b = graph.bytes
        return Sizes(*(sum(b[v] for v in s) for s in (self.cin_rec, self.cin_fix, self.gin, self.gout,
                                                       self.held, self.releases)))


def once(graph: Graph, v: int) -> bool:
    """Whether node ``v`` is computed once in every chain plan: it may not be
    computed twice, or it is an output (resident for good once computed, so
    never freed to be computed again). A backward sequence reads such a
    forward value as kept, never recomputes it."""
    return not graph.nodes[v].recomputable or graph.nodes[v].output


@dataclass(frozen=True)
class Sizes:
    cin_rec: int
    cin_fix: int
    gin: int
    gout: int
    held: int
    releases: int


@dataclass(frozen=True)
class Chain:
    """``stages[0..L-1]``, then the turn ``stages[L]``. Inputs no one reads
    (``dead``) are freed before the first event."""

    graph: Graph
    stages: tuple[Stage, ...]
    dead: frozenset[int]

    @property
    def length(self) -> int:
        """L: the stages before the turn."""
        return len(self.stages) - 1


@dataclass(frozen=True)
class Profile:
    """A piece's memory relative to its start: the highest it reaches (at a
    compute: what is resident plus the new value) and its net change."""

    peak: int
    end: int


@dataclass(frozen=True)
class Piece:
    """Computing ``seq`` in order, freeing each value right after its last
    read before it is computed again (as place_frees does); at the end the
    values it computed stay if in ``keeps``, and the resident values in
    ``frees`` go after their last read in it, or at its start if it reads
    none (the chain knows these are their last reads); outputs always stay. ``profile``
    is its memory, and :meth:`emit` its events: the plan is made of pieces,
    so its replay gives the DP's figures exactly."""

    seq: tuple[int, ...]
    frees: frozenset[int]
    keeps: frozenset[int]
    profile: Profile

    @classmethod
    def of(cls, graph: Graph, seq: Sequence[int], frees: Iterable[int], keeps: Iterable[int]) -> "Piece":
        seq, frees, keeps = tuple(seq), frozenset(frees), frozenset(keeps)
        size = graph.bytes
        drops = _drops(graph, seq, frees, keeps)
        mem = peak = -sum(size[v] for v in drops.get(-1, ()))
        peak = max(peak, 0)
        for k, v in enumerate(seq):
            mem += size[v]
            peak = max(peak, mem)
            mem -= sum(size[w] for w in drops.get(k, ()))
        return cls(seq, frees, keeps, Profile(peak, mem))

    def moved(self, mapping: dict[int, int]) -> "Piece":
        """The same piece on another stage of the same kind (``mapping``:
        node to node), its profile unchanged."""
        def m(xs):
            return [mapping.get(v, v) for v in xs]
        return Piece(tuple(m(self.seq)), frozenset(m(self.frees)), frozenset(m(self.keeps)), self.profile)

    def emit(self, graph: Graph, b: PlanBuilder) -> None:
        drops = _drops(graph, self.seq, self.frees, self.keeps)
        for w in drops.get(-1, ()):
            b.free(w)
        for k, v in enumerate(self.seq):
            b.compute(v)
            for w in drops.get(k, ()):
                b.free(w)


def _drops(graph: Graph, seq: tuple[int, ...], frees: frozenset[int], keeps: frozenset[int]) -> dict:
    """Index of the compute after which each value goes (-1: the start)."""
    preds, nodes = graph.preds, graph.nodes
    last_read: dict[int, int] = {}
    drops: dict[int, list[int]] = {}
    live: dict[int, int] = dict.fromkeys(frees, -1)  # value -> index of its current computation
    for k, v in enumerate(seq):
        for p in preds[v]:
            if p in live:
                last_read[p] = k
        if v in live:  # computed again: its previous copy went after its last read
            drops.setdefault(last_read.pop(v, live[v]), []).append(v)
        live[v] = k
    for v, k in live.items():
        if not nodes[v].output and (k == -1 or v not in keeps):
            drops.setdefault(last_read.get(v, k), []).append(v)
    return drops


def cost(graph: Graph, seq: Iterable[int]) -> float:
    return math.fsum(graph.cost[v] for v in seq)


def from_table(graph: Graph, table: BlockTable) -> Chain:
    """The chain of ``table``'s blocks, with ``pre`` and ``post`` as its
    stage 0 (the embedding and its gradient) when there are any;
    NotApplicable when the graph is not one."""
    blocks = table.blocks
    pos = graph.position
    compute = [i for i in graph.order if not graph.nodes[i].is_input]
    if any(not b.backward for b in blocks):
        raise NotApplicable(f"rotor: {graph.name}: a block has no backward part (no training step)")
    first_fwd, last_fwd = pos[blocks[0].forward[0]], pos[blocks[-1].forward[-1]]
    first_bwd, last_bwd = pos[blocks[-1].backward[0]], pos[blocks[0].backward[-1]]
    pre = tuple(i for i in compute if pos[i] < first_fwd)
    head = tuple(i for i in compute if last_fwd < pos[i] < first_bwd)
    head_fwd = tuple(i for i in head if graph.nodes[i].phase != "backward")
    head_bwd = tuple(i for i in head if graph.nodes[i].phase == "backward")
    post = tuple(i for i in compute if pos[i] > last_bwd)
    links = ([(None, pre + post, pre, post)] if pre or post else []) + \
        [(b.kind, b.nodes, b.forward, b.backward) for b in blocks] + [(None, head, head_fwd, head_bwd), TURN]
    expected = [v for _, _, fwd, _ in links for v in fwd] + [v for _, _, _, bwd in reversed(links) for v in bwd]
    if expected != compute:
        raise NotApplicable(f"rotor: {graph.name}: program order is not pre, the blocks' forwards, the turn, "
                            "their backwards in reverse, post")
    return _chain(graph, links)


def from_graph(graph: Graph) -> Chain:
    """The finest chain of any training step: each forward node a stage to
    start with, each backward node in the stage of the latest forward value
    it reads (one that reads none, in the stage of the gradient it reads
    first), then adjacent stages merged wherever a value would skip one, an
    input be read by two, or the backward leave reverse order, until none
    does. A pure chain stays one node a stage; a graph that is no chain at
    all ends as one stage (NotApplicable)."""
    fwd = [i for i in graph.order if not graph.nodes[i].is_input and graph.nodes[i].phase != "backward"]
    bwd = [i for i in graph.order if graph.nodes[i].phase == "backward"]
    pos = graph.position
    if not fwd or not bwd or pos[bwd[0]] < pos[fwd[-1]]:
        raise NotApplicable(f"rotor: {graph.name}: not a training step (forward nodes, then backward ones)")
    at = {v: t for t, v in enumerate(fwd)}
    cut = [True] * (len(fwd) - 1)  # cut[t]: a stage boundary after fwd[t]
    preds, succs = graph.preds, graph.succs
    for _ in range(len(fwd)):
        unit = [0] * len(fwd)
        for t in range(1, len(fwd)):
            unit[t] = unit[t - 1] + cut[t - 1]
        stage: dict[int, int] = {v: unit[t] for v, t in at.items()}
        for b in bwd:
            fp = [stage[p] for p in preds[b] if p in at]
            bp = [stage[p] for p in preds[b] if p in stage and p not in at]
            stage[b] = max(fp) if fp else min(bp) if bp else (stage[bwd[0]] if b != bwd[0] else unit[-1])
        spans: list[tuple[int, int]] = []  # unit ranges to merge
        for v in graph.nodes:
            i = v.id
            readers = [stage[s] for s in succs[i]]
            if v.is_input:
                readers = [stage[s] for s in succs[i] if s in at]
                if readers and not v.persistent and min(readers) != max(readers):
                    spans.append((min(readers), max(readers)))
            elif i in at:
                if readers and max(readers) > stage[i] + 1:
                    spans.append((stage[i] + 1, max(readers)))
            elif readers and max(readers) > stage[i]:
                spans.append((stage[i], max(readers)))
        low = None
        for b in reversed(bwd):  # stages must not decrease towards the end
            if low is not None and stage[b] < low:
                spans.append((stage[b], low))
            low = stage[b] if low is None else max(low, stage[b])
        if not spans:
            break
        cover = [0] * (unit[-1] + 2)  # boundaries after units a .. b-1 go, for each span (a, b)
        for a, b in spans:
            cover[a] += 1
            cover[b] -= 1
        for u in range(1, len(cover)):
            cover[u] += cover[u - 1]
        for t in range(len(fwd) - 1):
            if cut[t] and cover[unit[t]] > 0:
                cut[t] = False
    links: list[tuple] = [(None, [], [], []) for _ in range(unit[-1] + 1)]
    for v in graph.order:
        if v in stage:
            k = stage[v]
            links[k][1].append(v)
            links[k][2 if v in at else 3].append(v)
    if len(links) < 2:
        raise NotApplicable(f"rotor: {graph.name}: no chain of two or more stages")
    return _chain(graph, [(None, tuple(m), tuple(f), tuple(b)) for _, m, f, b in links] + [TURN])


# The turn, between the last forward and the first backward: the last
# stage, empty (the head and loss are a stage of their own, with options).
TURN = (None, (), (), ())


def _chain(graph: Graph, links: list[tuple]) -> Chain:
    """Classify every value by where it is read (see the module docstring).
    ``links``: (kind, members, forward, backward) per stage, the turn last."""
    N = len(links) - 1
    seg: dict[int, tuple[str, int]] = {}
    for k, (_, _, fwd, bwd) in enumerate(links):
        seg.update((i, ("F", k)) for i in fwd)
        seg.update((i, ("B", k)) for i in bwd)
    cin_rec, cin_fix, gout, held, releases = ([set() for _ in links] for _ in range(5))
    dead = set()

    def refuse(v: int, why: str):
        raise NotApplicable(f"rotor: {graph.name}: node {v} ({graph.nodes[v].name}) {why}: not a chain")

    for v in graph.nodes:
        if v.persistent:
            continue
        i = v.id
        readers = {seg[s] for s in graph.succs[i]}
        fwd = {k for ph, k in readers if ph == "F"}
        bwd = {k for ph, k in readers if ph == "B"}
        own = seg.get(i)
        if own is None:  # an input
            if v.output:
                continue  # resident for good
            if not readers:
                dead.add(i)
            elif not bwd and len(fwd) == 1:
                cin_fix[fwd.pop()].add(i)
            else:  # stays until the backward of the earliest stage that reads it
                releases[min(fwd | bwd)].add(i)
        elif own[0] == "F" and own[1] < N:
            k = own[1]
            if v.output:  # resident for good: its stage runs once (Stage.fixed)
                held[k].add(i)
            if not fwd | bwd <= {k, k + 1}:
                refuse(i, f"is read beyond stage {k + 1}")
            if k + 1 in fwd | bwd:
                cin_rec[k + 1].add(i)
        else:  # a backward value (the turn's count as stage L's backward)
            k = own[1]
            if fwd - {k} or (own[0] == "B" and fwd):
                refuse(i, "is a backward value read by a forward stage")
            later = bwd - {k}
            if v.output:
                held[k].add(i)
            elif later == {k - 1}:
                gout[k].add(i)
            elif later:
                if max(later) >= k:
                    refuse(i, "is read by an earlier backward stage")
                held[k].add(i)
                releases[min(later)].add(i)
    stages = tuple(Stage(kind, members, tuple(fw), tuple(bw), frozenset(cin_rec[k]), frozenset(cin_fix[k]),
                         frozenset(gout[k + 1]) if k < N else frozenset(), frozenset(gout[k]),
                         frozenset(held[k]), frozenset(releases[k]))
                   for k, (kind, members, fw, bw) in enumerate(links))
    return Chain(graph, stages, frozenset(dead))


def translation(chain: Chain, r: int, k: int) -> dict[int, int] | None:
    """The node mapping that carries stage r, with its neighbours, onto stage
    k, if every piece of r is a piece of k moved by it: the stages before,
    at and after are of one kind each, every member reads the counterparts
    of its counterpart's producers, and every boundary set maps onto k's.
    Then k's pieces need not be profiled again (481 stages of one kind)."""
    st, g = chain.stages, chain.graph
    if min(r, k) < 1 or max(r, k) + 1 >= chain.length:
        return None
    mapping: dict[int, int] = {}
    for d in (-1, 0, 1):
        a, b = st[r + d], st[k + d]
        if a.kind is None or a.kind != b.kind or len(a.members) != len(b.members):
            return None
        mapping.update(zip(a.members, b.members))
    for v in st[r].members:
        if {mapping.get(p, p) for p in g.preds[v]} != set(g.preds[mapping[v]]):
            return None
    for name in ("cin_rec", "cin_fix", "gin", "gout", "held", "releases"):
        if {mapping.get(v, v) for v in getattr(st[r], name)} != getattr(st[k], name):
            return None
    if {mapping.get(v, v) for v in st[r + 1].cin_rec} != st[k + 1].cin_rec:
        return None
    return mapping

