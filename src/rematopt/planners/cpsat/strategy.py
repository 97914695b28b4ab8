"""Which round comes next, and when to stop, prove or widen: pure functions
of the rounds' history (:class:`search.Round` records) and the clock, so
each decision can be checked on a made-up history."""

from __future__ import annotations

from typing import Callable, Sequence

from ortools.sat.python import cp_model

from .search import Round
from .tuning import TUNING, Tuning

DONE = "done"  # next_depth: no round is left


def next_depth(setting: int | str | None, history: Sequence[Round], full_pairs: int,
               remat_pairs: Callable[[int | None], int], tuning: Tuning = TUNING) -> int | None | str:
    """The recompute depth of the next round (None: the full staged space),
    or DONE. ``setting`` is ``--recompute-depth`` (None: automatic). The full
    space when it is small; else depth 1 then 2, each warm-started from the
    previous best (the spaces are nested, so the incumbent only improves),
    then the full space. While the rounds hold no plan, the depth doubles
    instead, as long as that adds re-materialisations (``remat_pairs``) and
    leaves at most ``doubling_share`` of the full space's: the 147-node U-Net at
    0.9 has no plan within 1, 2 or 3 hops, its optimum within 4 (1.6 s), and
    none from the full model in 60 s; a space nearly as big as the full one
    is nearly as slow and still incomplete."""
    if not history:
        if setting == "full" or (setting is None and full_pairs <= tuning.full_model_pairs):
            return None
        return 1 if setting is None else int(setting)
    last = history[-1]
    if setting is not None or last.depth is None:
        return DONE
    found = last.best is not None
    deeper = remat_pairs(2 * last.depth) if not found else 0
    if deeper > remat_pairs(last.depth) and deeper <= tuning.doubling_share * remat_pairs(None):
        return 2 * last.depth
    if found and last.depth == 1:
        return 2
    return None


def may_start(depth: int | None, last: Round, stopped: bool, elapsed: float, time_limit: float,
              proof_s: float, full_pairs: int, tuning: Tuning = TUNING) -> bool:
    """Whether the next round (at ``depth``) may start after ``last``: it
    must have been proven (a deeper space may do better), with ``min_round_s``
    left and, when there is a plan to keep, twice the time spent so far
    outside relaxation proofs (without one, any attempt beats none:
    resnet_s2_c16 at 0.8 has its depth-8 space shown empty after 10 s of a
    20 s limit); the full space, when a round found a plan, only if its
    model is at most ``full_round_pairs``."""
    found = last.best is not None
    if last.status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) or stopped:
        return False
    if time_limit - elapsed < max(tuning.min_round_s, 2 * (elapsed - proof_s) if found else 0):
        return False
    return depth is not None or not found or full_pairs <= tuning.full_round_pairs


def wants_optimality_proof(last: Round, proven: bool, asked_at: int | None) -> bool:
    """Whether to ask the relaxations if ``last``'s optimum (of a restricted
    space) is the whole space's: once per objective value."""
    return (last.best is not None and last.status == cp_model.OPTIMAL and not proven
            and asked_at != last.objective)


def wants_emptiness_proof(last: Round, asked: bool) -> bool:
    """Whether to ask the relaxations if the whole space is empty, after a
    restricted space was shown to be: once per run."""
    return last.best is None and last.status == cp_model.INFEASIBLE and not asked


def proof_time(elapsed: float, time_limit: float, proof_s: float, tuning: Tuning = TUNING) -> float:
    """The relaxation proofs get what the rounds have taken so far (a proof
    saves the deeper rounds, which take about twice that), at least
    ``min_round_s``, at most ``proof_share`` of the time left."""
    return min(tuning.proof_share * (time_limit - elapsed), max(tuning.min_round_s, elapsed - proof_s))


def should_widen(depth: int | None, outside_objective: float | None, hint_objective: float | None,
                 widened: bool) -> bool:
    """Whether to widen the depth-restricted spaces by the
    re-materialisations of the plan from outside the model (objective in
    units): only when that plan beats every hint the space holds, for a wider
    space is harder (random_layered_n250 at 0.9 with jax-dots-saveable's
    recomputes: 32% space gap after 60 s, without them proven in 2 s). The
    GPT decoder's dtr plan at 0.8 recomputes 35 values beyond depth 1, and no
    hint lies within it: widened, the round is proven optimal from dtr's plan."""
    if depth is None or outside_objective is None or widened:
        return False
    return hint_objective is None or hint_objective > outside_objective


def returned_round(history: Sequence[Round]) -> Round | None:
    """The round whose plan the run returns: the last one with a plan,
    unless it only matched an earlier round's proven optimum without a proof
    of its own (a full round that ran out of time from the depth-2
    optimum): then the proven round speaks for the plan."""
    done = None
    for r in history:
        if r.best is None:
            continue
        if (done is not None and done.status == cp_model.OPTIMAL and r.status != cp_model.OPTIMAL
                and r.objective >= done.objective):
            continue
        done = r
    return done
