"""Every share of the time limit, every floor in seconds and every size
threshold a cpsat run decides by, in one frozen table with the measurement
that set each. A run reads the :class:`Tuning` of its settings (``TUNING``
unless a caller passes another: the tests pass one instead of patching
the modules that read it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tuning:
    # -- the warm start (run.outside_plan, run.warm_start) ---------------------
    # The warm start (outside plan and staged eviction) may use this share of
    # the time limit, the search the rest ...
    warm_start_share: float = 0.25
    # ... and past warm_start.MODEL_MAX_NODES nodes, where no model is built
    # in the time left anyway (the 99,847-node chain's depth-1 model is not
    # built in 120 s), the fast planners (rotor above all) take this share.
    large_warm_start_share: float = 0.6
    # When no fast plan fits, staged eviction in a deeper space may take the
    # warm start up to this share of the limit (random_layered_n1000 at 0.8:
    # the fast planners 24 s on a loaded machine, eviction at depth 2 13 s more).
    eviction_share: float = 0.45
    # Graphs from this size on search the order of the best outside plan
    # (the 48-layer decoder has 8,484 nodes; gpt_l2_w64's 498 are proven in
    # program order in seconds): staged.order.search_order.
    reorder_min_nodes: int = 1000

    # -- the rounds (strategy, search) ------------------------------------------
    # The gap relaxation (staged/bounds/gaps.py) takes well under a second on
    # the benchmark graphs; this share of the limit caps it on bigger ones.
    gap_bound_share: float = 0.1
    # Largest full staged model (sum over values of the stages they live in)
    # solved as is; beyond it, depth 1 then 2 (the full model of
    # random_layered_n100, about 5,000 pairs, found no solution in 30 s, its
    # depth-1 model is solved to optimality in under 2 s), then the full model
    # warm-started from their best if it has at most full_round_pairs (hinted,
    # n100's is proven in 12-15 s, mobilenet_train's 17,000 pairs in 25 s;
    # building random_layered_n250's 31,000 takes 11 s and presolving it 40 s).
    full_model_pairs: int = 2500
    full_round_pairs: int = 40_000
    # While restricted rounds hold no plan the depth doubles, up to a space
    # with this share of the full space's re-materialisations; then the full space.
    doubling_share: float = 0.5
    # The stronger relaxations' proof that a round's optimum is the whole
    # space's gets at most this share of the time left (random_layered_n250 at
    # 0.9: 3 s by chains; random_layered_n100 at 0.9 and 0.8: 0.2 s and 1.6 s
    # by slots; where they cannot prove it, slots may take 17 s on mobilenet_train).
    proof_share: float = 1 / 3
    # A deeper round starts only with twice the time spent so far left (the
    # depth-2 proofs took 2-3x the depth-1 ones on the benchmark graphs) and
    # at least this much: building and presolving the depth-2 model of
    # random_layered_n250 alone takes about 5 s.
    min_round_s: float = 5.0
    # A round with no plan to start from searches this share of the time left
    # (at least min_round_s) before it looks for any plan within the budget
    # by minimising the peak (search.fit): presolve shows most empty spaces at
    # once (resnet_s2_c16 at 0.8, depths 1-8: 0.4-3 s each), where the peak
    # search takes 2-5x longer to prove that no plan fits.
    fit_after_share: float = 0.25
    # The peak search starts only from a plan within this share over the
    # budget: it lowers the peak by a few percent in seconds (resnet_s2_c16 at
    # 0.8 from dtr's plan, 2% over: 12% in 5 s; random_layered_n100 at 0.7
    # from the no-remat plan, 43% over, the lowest-peak fast plan there: 3% in 8 s).
    fit_margin: float = 0.1
    # ... and it gets this share of what is left then; the overhead search
    # resumes for the rest (resnet_s2_c16 at 0.6: the full model proves that
    # no plan fits only after most of a 20 s limit).
    fit_share: float = 0.5

    # -- after the rounds (run.bounded, lns) ---------------------------------------
    # Where the rounds cannot search the whole staged space, they leave this
    # share of the limit to the bounds asked after them (bounds.AFTER), and
    # those run only with at least min_after_s left (gpt_l2_w64 at 0.8, 120 s:
    # docs/cpsat.md, "Whole-space bounds").
    after_share: float = 0.25
    min_after_s: float = 1.0
    # A round that LNS will follow searches for this share of the time left,
    # LNS the rest (lns.AUTO_VARIABLES says when it follows: measured there).
    lns_share: float = 0.5
    # LNS stops this long before the time limit: the plan is still to be replayed.
    lns_margin_s: float = 0.5
    # A window solved to optimality within this share of its limit makes the
    # next one lns.GROWTH times wider; one that is not shrinks by the same factor.
    window_fast_share: float = 0.25
    # A window's search gets at most this many seconds (at least min_window_s).
    window_s: float = 5.0
    min_window_s: float = 0.2
    # LNS stops after this many windows (None: only at its deadline): a
    # search whose amount of work does not depend on the machine's load, as
    # the tests ask of it (a 3 s LNS ran no window while other jobs loaded the machine).
    max_windows: int | None = None

    # -- the peak objective's bisection (peak) ----------------------------------
    # The usual rounds get this share of the limit, the bisection the rest.
    # The probes' overhead searches find lower peaks where an overhead cap
    # binds (mobilenet_train within 10%: the rounds reach 11.3 GB in 24 s, two
    # probes 7.7 GB in 18 s); the rounds where they must find the plan first
    # (random_layered_n100 within 10%: 34,320 B with 30% of 60 s, 30,640 B
    # with 50%, the bound the same 26,2xx B).
    peak_rounds_share: float = 0.5
    # The bounds asked after the peak rounds get this share of what the rounds
    # leave, the bisection the rest (after_share is a share of the whole limit).
    peak_after_share: float = 0.3
    # A probe gets this share of the time left, at least min_probe_s.
    probe_share: float = 0.35
    min_probe_s: float = 2.0
    # Shares of a probe's time the relaxations may take (each stops at its
    # first solution, so a feasible one returns at once); the overhead search the rest.
    probe_level_share: dict[str, float] = field(
        default_factory=lambda: {"gaps": 0.1, "chains": 0.2, "slots": 0.2})


TUNING = Tuning()
