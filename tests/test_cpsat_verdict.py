"""The verdict as pure functions (planners/cpsat/verdict.py), checked on
made-up facts: what a bound may claim depends on what proved it, never on
text; the staged claim follows the rounds, the proofs and the memory unit."""

from __future__ import annotations

import pytest

from rematopt.planners.cpsat.verdict import ALL_PLANS, STAGED, Bound, Source, over_all_plans, reaching, staged, verdict


def test_the_highest_bound_speaks_and_never_passes_the_plan():
    v = verdict(10.0, [Bound(4.0, Source.GAPS), Bound(7.0, Source.CHAINS), Bound(7.0, Source.MODEL)])
    assert (v.best_bound, v.bound_by, v.status, v.proved_by) == (7.0, Source.CHAINS, "FEASIBLE", None)  # ties: first
    assert v.gap == pytest.approx(0.3)
    over = verdict(10.0, [Bound(12.0, Source.SLOTS)], reaching(10.0, Bound(12.0, Source.SLOTS)))
    assert (over.best_bound, over.gap, over.status, over.proved_by) == (10.0, 0.0, "OPTIMAL", Source.SLOTS)
    assert verdict(10.0, []).stats() == {"status": "FEASIBLE", "best_bound": None, "gap": None}
    assert over.stats()["proved_by"] == "slots" and type(over.stats()["bound_by"]) is str


def test_a_bound_proves_only_where_it_reaches_and_may():
    b = Bound(5.0, Source.COARSE_CHAINS)
    assert reaching(5.0, b) is Source.COARSE_CHAINS
    assert reaching(5.5, b) is None
    assert reaching(5.0, b, may_prove=False) is None  # a plan from outside the staged space
    assert reaching(5.0, None) is None


def test_only_a_bound_every_plan_obeys_makes_a_plan_optimal():
    assert all(s.every_plan for s in (Source.WORKING_SET, Source.PINNED_VALUES, Source.TRIVIAL, Source.ZERO_COST))
    assert not any(s.every_plan for s in (Source.GAPS, Source.CHAINS, Source.SLOTS, Source.COARSE_CHAINS,
                                          Source.MODEL, Source.ROUNDED_DOWN))
    staged_optimum = {"status": "OPTIMAL", "peak_bytes": 100, "objective": 3.0, "proved_by": "chains"}
    st = over_all_plans(staged_optimum, None, None)
    assert (st["status"], st["optimal_in"]) == ("FEASIBLE", STAGED)
    st = over_all_plans(staged_optimum, Bound(100, Source.WORKING_SET), None)
    assert (st["status"], st["optimal_in"], st["proved_by"], st["gap"]) == ("OPTIMAL", ALL_PLANS, "working set", 0.0)
    empty = {"status": "INFEASIBLE", "peak_bytes": None}
    assert over_all_plans(empty, None, None)["status"] == "UNKNOWN"
    st = over_all_plans(empty, None, Bound(18, Source.PINNED_VALUES))
    assert (st["status"], st["infeasible_in"], st["proved_by"]) == ("INFEASIBLE", ALL_PLANS, "pinned values")
    assert "18 bytes" in st["reason"]


FACTS = dict(gaps_empty=False, shown_empty=False, memory_exact=True, automatic=True, has_plan=True,
             proven_whole=False)


@pytest.mark.parametrize("round_, depth, facts, expect", [
    # the full space solved to optimality: optimal in it
    ("OPTIMAL", None, {}, ("OPTIMAL", None, False, None)),
    # a depth-restricted optimum says nothing of the whole space ...
    ("OPTIMAL", 1, {}, ("FEASIBLE", 1, True, "OPTIMAL")),
    # ... unless a whole-space bound reaches it
    ("OPTIMAL", 1, {"proven_whole": True}, ("OPTIMAL", 1, True, "OPTIMAL")),
    # a depth the user chose is the space the claim is about
    ("OPTIMAL", 2, {"automatic": False}, ("OPTIMAL", 2, False, None)),
    # sizes rounded up: the model's optimum is no proof
    ("OPTIMAL", None, {"memory_exact": False}, ("FEASIBLE", None, False, None)),
    # the gaps relaxation showed the whole space empty
    ("UNKNOWN", 1, {"gaps_empty": True, "has_plan": False}, ("INFEASIBLE", None, False, None)),
    # a later proof did: the round's INFEASIBLE speaks for the whole space
    ("INFEASIBLE", 1, {"shown_empty": True, "has_plan": False}, ("INFEASIBLE", None, False, None)),
    # only a restricted space was shown empty: unknown
    ("INFEASIBLE", 1, {"has_plan": False}, ("UNKNOWN", 1, True, "INFEASIBLE")),
])
def test_the_staged_claim(round_, depth, facts, expect):
    claim = staged(round_, depth, **{**FACTS, **facts})
    assert (claim.status, claim.depth, claim.restricted, claim.space_status) == expect


def test_an_empty_model_with_sizes_rounded_up_is_undecided():
    claim = staged("INFEASIBLE", None, **{**FACTS, "memory_exact": False, "has_plan": False})
    assert (claim.status, claim.unproven_empty, claim.restricted_empty) == ("UNKNOWN", True, False)
    proven = staged("INFEASIBLE", None, **{**FACTS, "memory_exact": False, "has_plan": False, "shown_empty": True})
    assert (proven.status, proven.unproven_empty) == ("INFEASIBLE", False)
