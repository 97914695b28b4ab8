"""Loops rolled again: the iterations of an unrolled loop that a plan treats
alike run as one ``lax.scan`` in the planned gradient.

The JAX importer unrolls ``scan`` and static ``while`` loops, so a plan names
every iteration's values, and :func:`~rematopt.exporters.jax_policy.apply_plan`
replays the traced equations. Replayed one by one, a 48-layer stack compiles
48 copies of its layer. Here the forward equations, and the backward pass's
equations with the recomputations placed right before their first reader, are
cut into one segment per iteration (the loop indices the importer records on
every equation). Consecutive segments that are alike become one scan whose
body is the first of them:

- *alike*: the same operations with the same parameters and shapes, wired
  the same way inside the segment; every value read from outside comes from
  the segment before at the same place (a carry), or from outside the run
  (the same value in every iteration, closed over, or one per iteration,
  scanned over); the same values leave the segment (saved for the backward
  pass, offloaded, read later) and, in the backward pass, the same values are
  recomputed. A plan that keeps, offloads or recomputes a value in one
  iteration and not in the next breaks the run there;
- the values read after the run leave it stacked (one array per value, with
  the iteration as its leading axis), so the backward scan reads the forward
  scan's residuals as they are, and a stacked parameter's gradient is one array.

Segments outside every run (a plan that differs by iteration, the first and
last iterations where they differ) run unrolled, and :class:`LoopNote` says
which and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..importers.jaxpr.flatten import Const, Eqn

MIN_RUN = 2  # a run of one iteration is that iteration unrolled


@dataclass(frozen=True)
class Unit:
    """One graph node's equations as the planned gradient runs them."""

    node: int
    eqns: tuple[Eqn, ...]
    recompute: bool = False            # a forward node computed again in the backward pass
    loop: tuple[str, int] | None = None  # (outermost loop, iteration), None outside loops


@dataclass(frozen=True)
class Piece:
    """Element ``index`` (along the leading axes) of a stacked array: a slice
    of a stacked argument, or one iteration's value out of a scan."""

    base: Any
    index: tuple[int, ...]


@dataclass
class Run:
    """Consecutive alike iterations of one loop, run as ``lax.scan`` over the first one's units."""

    loop: str
    iterations: tuple[int, ...]           # in execution order
    body: list[Unit]
    carries: list[tuple[Any, int]]        # (initial ref, the body value that carries on)
    closed: list[int]                     # refs every iteration reads (the same value)
    scanned: list[tuple[int, list]]       # (body ref, each iteration's ref in ascending iteration order)
    stacked: list[int]                    # body values read after the run, one per iteration
    outs: dict[int, list[int]]            # body value -> its value in each iteration (ascending)
    last: dict[int, int]                  # body value -> its value in the last iteration run

    @property
    def reverse(self) -> bool:
        return self.iterations[0] > self.iterations[-1]


@dataclass
class LoopNote:
    """How a loop of the program ran in the planned gradient."""

    loop: str
    where: str                             # the loop's first operation, as the graph's ``source``
    iterations: int
    scanned: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # pass -> (first, last) per run
    unrolled: dict[str, list[int]] = field(default_factory=dict)  # pass -> iterations run one by one
    why: dict[str, str] = field(default_factory=dict)  # pass -> why the first unrolled iteration is
    nodes: dict[str, set[int]] = field(default_factory=dict)  # pass -> the graph nodes run inside a scan

    @property
    def rolled(self) -> bool:
        return not any(self.unrolled.values())

    def describe(self) -> str:
        def spans(runs):
            return ", ".join(f"{a}-{b}" for a, b in runs) or "none"

        parts = [f"{phase}: scanned {spans(self.scanned.get(phase, []))}"
                 + (f", unrolled {_ranges(self.unrolled[phase])} ({self.why[phase]})" if self.unrolled.get(phase)
                    else "") for phase in ("forward", "backward")]
        return f"loop of {self.iterations} iterations at {self.where or '?'}: " + "; ".join(parts)


def _ranges(items: list[int]) -> str:
    items = sorted(items)
    out, start = [], items[0]
    for a, b in zip(items, items[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


# -- cutting a pass into runs ------------------------------------------------------


@dataclass
class _Seg:
    iteration: int
    units: list[Unit]
    values: list[int]            # values made here, in order
    pos: dict[int, int]          # value -> its place in ``values``
    refs: list[int]              # values read from outside, in order of first read
    sig: tuple                   # the operations and their wiring
    params: list[dict]
    literals: list[Any]          # literal operands, in order


def _segment(units: list[Unit], iteration: int, aval: Callable) -> _Seg:
    values: list[int] = []
    pos: dict[int, int] = {}
    refs: list[int] = []
    slot: dict[int, int] = {}
    sig: list = []
    params: list[dict] = []
    literals = []
    for u in units:
        sig.append(("unit", u.recompute, len(u.eqns)))
        for e in u.eqns:
            ins = []
            for r in e.ins:
                if isinstance(r, Const):
                    ins.append(("literal",))
                    literals.append(r.value)
                elif r in pos:
                    ins.append(("here", pos[r]))
                else:
                    if r not in slot:
                        slot[r] = len(refs)
                        refs.append(r)
                    ins.append(("read", slot[r]))
            sig.append((e.prim, tuple(ins), tuple(aval(v) for v in e.outs)))
            params.append(e.params)
            for v in e.outs:
                pos[v] = len(values)
                values.append(v)
    return _Seg(iteration, units, values, pos, refs, tuple(sig), params, literals)


def _same_params(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if x is y:
            continue
        try:
            if not bool(np.all(x == y)):
                return False
        except Exception:  # incomparable params (objects without equality): differ unless identical
            return False
    return True


def _same_literal(x: Any, y: Any) -> bool:
    return (np.shape(x) == np.shape(y) and np.result_type(x) == np.result_type(y)
            and bool(np.all(np.asarray(x) == np.asarray(y))))


def roll(units: list[Unit], aval: Callable, needed: set, marks: Callable[[int], Any], phase: str,
         notes: dict[str, LoopNote]) -> list[Unit | Run]:
    """``units`` (one pass, in order) with the alike iterations of each loop
    as :class:`Run`; ``needed`` holds the values read after the pass,
    ``marks(v)`` what must agree between iterations (saved, offloaded).
    ``notes`` gets what happened to each loop, under ``phase``."""
    loops = list(dict.fromkeys(u.loop[0] for u in units if u.loop))
    count = {loop: len({u.loop[1] for u in units if u.loop and u.loop[0] == loop}) for loop in loops}
    blocked: dict[str, str] = {}
    for loop in loops:
        units, why = _contiguous(units, loop)
        if why is not None:
            blocked[loop] = why
    readers: dict[int, list[int]] = {}
    for k, u in enumerate(units):
        for r in unit_inputs(u):
            readers.setdefault(r, []).append(k)
    out: list[Unit | Run] = []
    k = 0
    while k < len(units):
        u = units[k]
        if not u.loop:
            out.append(u)
            k += 1
            continue
        loop, end = u.loop[0], k
        while end < len(units) and units[end].loop and units[end].loop[0] == loop:
            end += 1
        block = list(range(k, end))
        note = notes.setdefault(loop, LoopNote(loop, next((e.source for j in block for e in units[j].eqns
                                                           if e.source), ""), count[loop]))
        if loop in blocked:  # its iterations are not one block: each piece runs unrolled
            out.extend(units[j] for j in block)
            note.unrolled[phase] = sorted(set(note.unrolled.get(phase, [])) | {units[j].loop[1] for j in block})
            note.why[phase] = blocked[loop]
        else:
            out.extend(_roll_block(units, block, readers, aval, needed, marks, phase, note))
        k = end
    return out


def unit_inputs(u: Unit) -> list[int]:
    """Values ``u`` reads from outside itself, in a fixed order: read before it makes them (a region
    of a plan run as planned may read a value and then make it again)."""
    made: set = set()
    reads: set = set()
    for e in u.eqns:
        reads.update(r for r in e.ins if not isinstance(r, Const) and r not in made)
        made.update(e.outs)
    return sorted(reads)


def _roll_block(units: list[Unit], block: list[int], readers: dict, aval: Callable, needed: set,
                marks: Callable, phase: str, note: LoopNote) -> list[Unit | Run]:
    parts: list[tuple[int, list[int]]] = []
    for j in block:
        i = units[j].loop[1]
        if parts and parts[-1][0] == i:
            parts[-1][1].append(j)
        else:
            parts.append((i, [j]))
    # a loop that runs again (a checkpointed loop recomputed in the backward
    # pass) is rolled one sweep at a time
    out: list[Unit | Run] = []
    sweep: list[tuple[int, list[int]]] = []
    for part in parts + [None]:
        if part is None or any(part[0] == i for i, _ in sweep):
            out.extend(_roll_sweep(units, sweep, readers, aval, needed, marks, phase, note))
            sweep = []
        if part is not None:
            sweep.append(part)
    return out


def _roll_sweep(units: list[Unit], parts: list, readers: dict, aval: Callable, needed: set, marks: Callable,
                phase: str, note: LoopNote) -> list[Unit | Run]:
    if len(parts) < MIN_RUN:  # one iteration: nothing to roll
        return [units[j] for _, js in parts for j in js]
    segs = [_segment([units[j] for j in js], i, aval) for i, js in parts]
    seg_of = {j: s for s, (_, js) in enumerate(parts) for j in js}

    def beyond(s: int, j: int) -> bool:
        """Unit ``j`` reads from segment ``s`` past the next one (after the
        last segment, the loop's successor takes the next one's place)."""
        if s + 1 < len(segs):
            return seg_of.get(j) not in (s, s + 1)
        return j in seg_of and seg_of[j] != s

    def flags(s: int) -> tuple:
        """Per value: read after the pass or beyond the next iteration; its marks."""
        return tuple((v in needed or any(beyond(s, j) for j in readers.get(v, ())), marks(v))
                     for v in segs[s].values)

    F = [flags(s) for s in range(len(segs))]
    out: list[Unit | Run] = []
    s, why = 0, None
    while s < len(segs):
        e, desc = s + 1, None
        while e < len(segs):
            broke, desc = _joins(segs, F, s, e, desc, aval, phase)
            if broke is not None:
                why = broke
                break
            e += 1
        while e - s >= MIN_RUN and _loose(segs, s, e, desc, F[s], readers, parts):
            e -= 1  # the iteration after the run reads its last one otherwise than the run's do
        if e - s >= MIN_RUN:
            out.append(_run(segs[s:e], desc, F[s], note.loop))
            note.scanned.setdefault(phase, []).append((segs[s].iteration, segs[e - 1].iteration))
            note.nodes.setdefault(phase, set()).update(u.node for seg in segs[s:e] for u in seg.units)
            s = e
        else:
            out.extend(segs[s].units)
            note.unrolled[phase] = sorted(note.unrolled.get(phase, []) + [segs[s].iteration])
            note.why.setdefault(phase, why or "")
            s += 1
    return out


def _joins(segs: list[_Seg], F: list, s: int, e: int, desc: list | None, aval: Callable, phase: str
           ) -> tuple[str | None, list | None]:
    """Why segment ``e`` cannot join the run ``s..e-1`` (None if it can), and
    how the run's segments read their outside values."""
    a, b = segs[e - 1], segs[e]
    step = b.iteration - a.iteration
    if abs(step) != 1 or (e > s + 1 and step != segs[s + 1].iteration - segs[s].iteration):
        return f"iteration {b.iteration} does not follow {a.iteration}", desc
    if (a.sig != b.sig or not all(_same_params(x, y) for x, y in zip(a.params, b.params))
            or not all(_same_literal(x, y) for x, y in zip(a.literals, b.literals))):
        ra, rb = (sum(u.recompute for u in seg.units) for seg in (a, b))
        if ra != rb:
            return (f"it recomputes {rb} value{'s' * (rb != 1)} in iteration {b.iteration} and {ra} in "
                    f"{a.iteration}"), desc
        return f"iteration {b.iteration} runs other operations than {a.iteration}", desc
    if F[e - 1] != F[e]:
        what = "saves or offloads" if phase == "forward" else "hands on"
        return f"it {what} other values in iteration {b.iteration} than in {a.iteration}", desc
    run_values = {v for seg in segs[s:e - 1] for v in seg.values}
    here = []
    for j, r in enumerate(b.refs):
        if r in a.pos:
            here.append(("carry", a.pos[r]))
        elif r in run_values:
            return f"iteration {b.iteration} reads a value of an iteration before the last", desc
        elif aval(r) != aval(a.refs[j]):
            return f"iteration {b.iteration} reads a value of another shape than {a.iteration}", desc
        else:
            here.append(("outside",))
    if desc is None:
        first = segs[s]
        for j, d in enumerate(here):
            if d[0] == "carry" and aval(first.refs[j]) != aval(first.values[d[1]]):
                return f"a value carried into iteration {b.iteration} changes shape", desc
        return None, here
    if here != desc:
        return f"iteration {b.iteration} reads other values from the iteration before than {a.iteration}", desc
    return None, desc


def _run(segs: list[_Seg], desc: list, flags: tuple, loop: str) -> Run:
    """The scan of alike segments ``segs``, reading outside values as
    ``desc`` says and handing on the values ``flags`` marks."""
    first, last = segs[0], segs[-1]
    ascending = sorted(segs, key=lambda seg: seg.iteration)
    carries = [(first.refs[j], first.values[d[1]]) for j, d in enumerate(desc) if d[0] == "carry"]
    closed, scanned = [], []
    for j, d in enumerate(desc):
        if d[0] == "outside":
            refs = [seg.refs[j] for seg in ascending]
            if len(set(refs)) == 1:
                closed.append(refs[0])
            else:
                scanned.append((first.refs[j], refs))
    stacked = [v for v, (outside, _) in zip(first.values, flags) if outside]
    return Run(loop, tuple(seg.iteration for seg in segs), list(first.units), carries, closed, scanned, stacked,
               {first.values[p]: [seg.values[p] for seg in ascending] for p in range(len(first.values))},
               {first.values[p]: last.values[p] for p in range(len(first.values))})


def _loose(segs: list[_Seg], s: int, e: int, desc: list, flags: tuple, readers: dict, parts: list) -> bool:
    """Whether a value of the run ``s..e-1``'s last iteration is read after
    the run though the run neither carries nor stacks it (the iteration
    after it differs in what it reads)."""
    kept = {d[1] for d in desc if d[0] == "carry"} | {p for p, (outside, _) in enumerate(flags) if outside}
    inside = {j for _, js in parts[s:e] for j in js}
    return any(p not in kept and any(j not in inside for j in readers.get(v, ()))
               for p, v in enumerate(segs[e - 1].values))


def _contiguous(units: list[Unit], loop: str) -> tuple[list[Unit], str | None]:
    """``units`` with the operations that sit between ``loop``'s iterations
    but neither read from them nor feed them moved before (or after) the loop."""
    at = [k for k, u in enumerate(units) if u.loop and u.loop[0] == loop]
    lo, hi = at[0], at[-1]
    inside = set(at)
    between = [k for k in range(lo, hi + 1) if k not in inside]
    if not between:
        return units, None
    made = {v: k for k in range(lo, hi + 1) for v in _outs(units[k])}
    reads = {k: {made[r] for r in unit_inputs(units[k]) if r in made} for k in range(lo, hi + 1)}
    before: set[int] = set()
    for k in between:
        if reads[k] <= before:
            before.add(k)
    after: set[int] = set()
    for k in reversed(between):
        if k not in before and all(j in after for j in range(k + 1, hi + 1) if k in reads[j]):
            after.add(k)
    if set(between) - before - after:
        return units, "an operation outside the loop sits between its iterations, reading one and feeding the next"
    order = list(range(lo)) + sorted(before) + at + sorted(after) + list(range(hi + 1, len(units)))
    return [units[k] for k in order], None


def _outs(u: Unit) -> list[int]:
    return [v for e in u.eqns for v in e.outs]


# -- running a pass -------------------------------------------------------------------


def value(env: dict, r: Any) -> Any:
    """The value of ``r``, a :class:`Piece` taken out of its stack."""
    if isinstance(r, Const):
        return r.value
    x = env[r]
    return x.base[x.index] if isinstance(x, Piece) else x


def gather(env: dict, refs: Sequence[int]) -> Any:
    """One array stacking ``refs``' values: a slice of the stack they came
    from when they are consecutive pieces of one (no copy), else a new stack."""
    xs = [env[r] for r in refs]
    if all(isinstance(x, Piece) for x in xs) and len({id(x.base) for x in xs}) == 1:
        idx = [x.index for x in xs]
        varying = [d for d in range(len(idx[0])) if len({ix[d] for ix in idx}) > 1]
        if len({len(ix) for ix in idx}) == 1 and len(varying) == 1:
            d, lo = varying[0], idx[0][varying[0]]
            if [ix[d] for ix in idx] == list(range(lo, lo + len(xs))):
                base = xs[0].base
                if len(idx[0]) == 1 and lo == 0 and len(xs) == base.shape[0]:
                    return base
                return base[tuple(slice(lo, lo + len(xs)) if k == d else c for k, c in enumerate(idx[0]))]
    return jax.numpy.stack([value(env, r) for r in refs])


# ``do(unit, env, last) -> last`` runs one unit on an environment holding its inputs
# (and adds its outputs); ``last`` is what the backward pass orders recomputations after.
Do = Callable[[Unit, dict, Any], Any]


def execute(items: Sequence[Unit | Run], env: dict, do: Do, last: Any = None) -> Any:
    """Run a pass: units one by one, runs as scans; ``env`` gains every value made."""
    for it in items:
        if isinstance(it, Run):
            last = _scan(it, env, do, last)
            continue
        local = {r: value(env, r) for r in unit_inputs(it)}
        last = do(it, local, last)
        env.update((v, local[v]) for v in _outs(it))
    return last


def _scan(run: Run, env: dict, do: Do, last: Any) -> Any:
    closed = {r: value(env, r) for r in run.closed}
    init = [value(env, r) for r, _ in run.carries]
    xs = [gather(env, refs) for _, refs in run.scanned]

    def body(carry, x):
        local = dict(closed)
        local.update(zip((r for r, _ in run.carries), carry))
        local.update(zip((r for r, _ in run.scanned), x))
        execute(run.body, local, do, tuple(carry))  # recomputations follow the carried values
        return [local[v] for _, v in run.carries], [local[v] for v in run.stacked]

    final, ys = jax.lax.scan(body, init, xs, length=len(run.iterations), reverse=run.reverse)
    for (_, v), x in zip(run.carries, final):
        env[run.last[v]] = x
    for v, y in zip(run.stacked, ys):
        env.update((w, Piece(y, (k,))) for k, w in enumerate(run.outs[v]))
    return tuple(final) or last
