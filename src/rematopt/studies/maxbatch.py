"""The largest batch (or sequence length) that fits in a device's memory at
an accepted overhead, for each planner: Checkmate's headline question.

A *size* is the knob's value; ``graph_at(size)`` gives the training graph at
that size (a JAX factory traced there, or a graph whose activations are
scaled, :func:`scaled`). A heuristic's answer is the largest size whose plan
replays within the memory and the overhead cap (sizes searched by doubling
then bisection: memory grows with the size). cpsat's answer asks, at each
size, whether any plan fits: first every plan already found (at any size:
a plan only names nodes, so it replays at every size), then the exact
planner (under the memory as its budget with an overhead cap, else peak
mode), hinted with the known plan that peaks lowest there. A size is
*proven* not to fit when its working set exceeds the memory or cpsat
proves that no staged plan within the cap fits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ..graph import Graph
from ..plan import Plan
from ..reference import peak_lower_bound
from ..simulate import Replay, simulate
from ..solve import solve

HEURISTICS = ("no-remat", "chen-sqrt", "chen-greedy", "greedy", "dtr", "jax-nothing-saveable", "jax-dots-saveable",
              "jax-offload-dots")


@dataclass(frozen=True)
class Answer:
    """One planner's largest size (0: not even size 1 fits) with the plan's
    peak and overhead there. ``upper``: the largest size not ruled out (for
    cpsat: one below the smallest size proven not to fit; equal to ``size``
    when the answer is proven)."""

    planner: str
    size: int
    peak_bytes: int | None
    overhead: float | None
    upper: int | None = None
    note: str = ""

    @property
    def proven(self) -> bool:
        return self.upper is not None and self.upper == self.size


def scaled(graph: Graph, factor: float) -> Graph:
    """``graph`` with every non-persistent value's bytes times ``factor``
    (rounded): activations and the batch grow with the batch, parameters
    (persistent) do not. Costs stay: the overhead is a ratio."""
    nodes = [dataclasses.replace(v, bytes=v.bytes if v.persistent else round(v.bytes * factor))
             for v in graph.nodes]
    return Graph(graph.name, nodes, graph.edges, graph.order, graph.meta, extra=graph.extra)


def fits(graph: Graph, plan: Plan, memory: int, max_overhead: float | None) -> Replay | None:
    """The replay of ``plan`` on ``graph`` if it is valid, peaks within
    ``memory`` and costs at most ``max_overhead`` x base (transfers aside)."""
    r = simulate(graph, plan)
    ok = r.valid and r.peak_bytes <= memory and (max_overhead is None or r.overhead <= max_overhead + 1e-12)
    return r if ok else None


def largest(ok: Callable[[int], bool], top: int) -> int:
    """The largest size in 1..top for which ``ok`` holds, assuming it holds
    below some size and not above (0 if not at 1): doubling, then bisection."""
    if top < 1 or not ok(1):
        return 0
    lo, step = 1, 1
    while lo + step <= top and ok(lo + step):
        lo, step = lo + step, step * 2
    hi = min(top, lo + step - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def working_set_limit(graph_at: Callable[[int], Graph], memory: int, max_size: int) -> int:
    """The largest size whose working set (:func:`peak_lower_bound`) fits: no plan fits above it."""
    return largest(lambda s: peak_lower_bound(graph_at(s)) <= memory, max_size)


def heuristic_answer(planner: str, graph_at: Callable[[int], Graph], memory: int, max_overhead: float | None,
                     top: int, pool: list[Plan]) -> Answer:
    """A heuristic's largest size; its plan there joins ``pool``."""
    seen: dict[int, tuple[Plan, Replay] | None] = {}

    def ok(size: int) -> bool:
        if size not in seen:
            g = graph_at(size)
            sol = solve(g, planner, budget=memory, check_budget=False)
            r = fits(g, sol.plan, memory, max_overhead) if len(sol.plan) else None
            seen[size] = (sol.plan, r) if r is not None else None
        return seen[size] is not None

    size = largest(ok, top)
    if not size:
        return Answer(planner, 0, None, None, note="no plan fits at size 1")
    plan, r = seen[size]
    pool.append(plan)
    return Answer(planner, size, r.peak_bytes, r.overhead)


def cpsat_answer(graph_at: Callable[[int], Graph], memory: int, max_overhead: float | None, top: int, start: int,
                 pool: list[Plan], time_limit: float, workers: int,
                 log: Callable[[str], None] = lambda s: None) -> Answer:
    """The exact planner's largest size, searched up from ``start`` (a size
    some plan of ``pool`` fits) below the working-set limit ``top``: sizes
    start + 1, + 2, + 4... while they fit, back to one above the last fit
    after a miss. Just above a known plan's reach a size is easiest to fit
    (the GPT decoder: from batch 33, bisection's first probes at 48 and 40
    found no plan in 60 s each). Each size is decided by :func:`decide`;
    proven when the next size up is proven not to fit."""
    lo, hi, no, step = start, top, top + 1, 1
    best = _replayed(graph_at(lo), pool, memory, max_overhead) if lo else None
    while lo < hi:
        size = min(hi, lo + step)
        verdict, plan, r = decide(graph_at(size), pool, memory, max_overhead, time_limit, workers)
        log(f"cpsat at size {size}: {verdict}")
        if verdict == "yes":
            lo, best, step = size, (plan, r), 2 * step
        else:
            hi, step = size - 1, 1
            if verdict == "no":
                no = min(no, size)
    if not lo:
        return Answer("cpsat", 0, None, None, upper=no - 1, note="no plan fits at size 1")
    proof = "size + 1 proven not to fit" if no == lo + 1 else f"sizes above {no - 1} proven not to fit"
    if best[0].planner != "cpsat":  # the size's best known plan is a heuristic's
        proof += f"; {best[0].planner}'s plan"
    return Answer("cpsat", lo, best[1].peak_bytes, best[1].overhead, upper=no - 1, note=proof)


def _replayed(g: Graph, pool: list[Plan], memory: int, max_overhead: float | None) -> tuple[Plan, Replay] | None:
    """The plan of ``pool`` that fits ``g`` with the lowest overhead there (then peak), if any."""
    fitting = [(p, r) for p in pool if (r := fits(g, p, memory, max_overhead)) is not None]
    return min(fitting, key=lambda x: (x[1].overhead, x[1].peak_bytes), default=None)


def decide(g: Graph, pool: list[Plan], memory: int, max_overhead: float | None, time_limit: float,
           workers: int) -> tuple[str, Plan | None, Replay | None]:
    """Whether some plan of ``g`` fits: "yes" (with it), "no" (proven for the
    staged space) or "unknown". The plans of ``pool`` are replayed first (a
    plan only names nodes, so one found at another size replays here); then
    cpsat starts from the one that peaks lowest on ``g``. With an overhead
    cap it is the overhead search under the memory as budget (no: its
    INFEASIBLE, or a cost bound above the cap); without one, peak mode
    (no: its bound above the memory), which improves on its start where the
    overhead search needs a plan within the budget first (the GPT decoder at
    batch 40: none in 60 s from jax-nothing-saveable's plan, 21% over).
    cpsat's plan joins ``pool`` whether it fits or not: it may fit a smaller size."""
    if peak_lower_bound(g) > memory:
        return "no", None, None
    known = _replayed(g, pool, memory, max_overhead)
    if known is not None:
        return "yes", known[0], known[1]
    # a traced model's graph may differ between sizes (batch 1 drops a
    # broadcast, say): only plans that replay on ``g`` can be its hint
    replays = [(r.peak_bytes, k, p) for k, p in enumerate(pool) if (r := simulate(g, p)).valid]
    hint = min(replays, key=lambda x: x[:2], default=(None, None, None))[2]
    if max_overhead is None:
        sol = solve(g, "cpsat", objective="peak", time_limit=time_limit, workers=workers, lp_bound=False, hint=hint)
    else:
        sol = solve(g, "cpsat", budget=memory, check_budget=False, time_limit=time_limit, workers=workers,
                    lp_bound=False, hint=hint)
    st = sol.plan.stats
    if len(sol.plan):
        pool.append(sol.plan)
        r = fits(g, sol.plan, memory, max_overhead)
        if r is not None:
            return "yes", sol.plan, r
    bound = st.get("best_bound")
    if max_overhead is None:
        return ("no" if bound is not None and bound > memory else "unknown"), None, None
    if st.get("infeasible_in"):  # all plans, or the staged space
        return "no", None, None
    base = sum(g.cost[i] for i in g.compute_ids)
    if bound is not None and bound > max_overhead * base * (1 + 1e-9) + 1e-12:
        return "no", None, None
    return "unknown", None, None


def max_batch(graph_at: Callable[[int], Graph], memory: int, *, max_overhead: float | None = None,
              planners: tuple[str, ...] = HEURISTICS, time_limit: float = 60.0, workers: int = 2,
              max_size: int = 1 << 20, log: Callable[[str], None] = lambda s: None) -> list[Answer]:
    """Every planner's largest size, the heuristics first (their plans seed
    cpsat's search), cpsat last."""
    top = working_set_limit(graph_at, memory, max_size)
    log(f"working set fits up to size {top}")
    pool: list[Plan] = []
    out = [heuristic_answer(p, graph_at, memory, max_overhead, top, pool) for p in planners]
    for a in out:
        log(f"{a.planner}: size {a.size}")
    start = max((a.size for a in out), default=0)
    out.append(cpsat_answer(graph_at, memory, max_overhead, top, start, pool, time_limit, workers, log))
    return out


def memoised(fn: Callable[[int], Graph]) -> Callable[[int], Graph]:
    """``fn`` called once per size (tracing a model takes seconds)."""
    cache: dict[int, Graph] = {}

    def at(size: int) -> Graph:
        if size not in cache:
            cache[size] = fn(size)
        return cache[size]

    return at


def scaled_sizes(graph: Graph, base: int) -> Callable[[int], Graph]:
    """Sizes of a fixed graph traced at size ``base``: size s scales its activations by s / base."""
    return memoised(lambda s: scaled(graph, s / base))


def gain(ours: int, theirs: int) -> float | None:
    """How much larger rematopt's size is, as a fraction (None when theirs is 0)."""
    return ours / theirs - 1 if theirs else None
