"""The options ``cpsat`` reads, declared once (:class:`Options`: the CLI's
flags, their help, the batch's parsing), and resolved with the budget into a
frozen :class:`Settings` the rest of the package reads."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ...errors import PlannerError
from ...plan import Plan
from ..options import names, option, parse
from .tuning import TUNING, Tuning


def recompute_depth(text: str) -> int | str:
    """The command line's ``--recompute-depth``: auto, full or an integer >= 0."""
    if text in ("auto", "full"):
        return text
    if not text.isdigit():
        raise ValueError(f"expected auto, full or an integer >= 0, got {text!r}")
    return int(text)


@dataclass(frozen=True)
class Options:
    """What ``cpsat`` reads (see :mod:`rematopt.planners.options`). The
    objective's default depends on the budget (overhead with one, peak
    without), so it is None here and settled by :class:`Settings`, as is
    ``workers`` (0: all cores)."""

    objective: str | None = option(None, "minimise overhead under the budget, or the peak.",
                                   choices=("overhead", "peak"))
    max_overhead: float | None = option(None, "overhead cap (with --objective peak).", minimum=0, finite=True)
    offload: bool = option(False, "allow host offload.")
    host_bandwidth: float | None = option(None, "transfer cost = bytes / this (bytes per cost unit).")
    transfer_cost_per_byte: float | None = option(None, "transfer cost = bytes x this.", minimum=0, finite=True)
    max_clone_expansion: float | None = option(None, "compute events <= X x compute nodes (0: unbounded).",
                                               minimum=0, finite=True)
    time_limit: float = option(60.0, "solver time limit, seconds.", minimum=0, finite=True)
    deterministic_time: float | None = option(None, "also stop after this much of CP-SAT's deterministic time "
                                              "(its seconds-like units), on one worker: the same plan and bounds "
                                              "whatever the machine's load; the time limit still ends it first "
                                              "if it comes first.", minimum=0, finite=True)
    workers: int = option(0, "solver threads (default: all cores).", minimum=0)
    seed: int = option(0, "solver random seed.")
    hint: Plan | None = option(None, "a plan to start the solver from (a plan file; it must replay on GRAPH).",
                               from_text=str)  # the CLI loads and checks it against the graph (cli.core.load_hint)
    warm_start: str = option("auto", "run fast planners first.", choices=("auto", "none"))
    log_path: str | None = option(None, "write incumbent/bound over time (CSV).", cli="--log")
    progress: bool = option(False, "show the incumbent and bound while solving.", cli=False)
    lp_bound: bool = option(True, "bound the objective by the LP relaxation too.", cli=False)
    export_model: str | None = option(None, "write the first round's CP-SAT model (proto text) here and its LP "
                                      "beside it (.mps).")
    recompute_depth: int | str = option("auto", "auto, full, or recompute only within N producer hops of "
                                        "each stage's node.", choices=("auto", "full"), minimum=0,
                                        from_text=recompute_depth)
    lns: str = option("auto", "large-neighbourhood search: re-solve windows of stages around the round's best "
                      "(auto: when the model is large).", choices=("auto", "on", "off"))
    tuning: Tuning | None = option(None, "the run's shares of the time limit and thresholds (default: TUNING).",
                                   cli=False)

    def __post_init__(self) -> None:
        if self.host_bandwidth is not None and self.transfer_cost_per_byte is not None:
            raise ValueError("give --host-bandwidth or --transfer-cost-per-byte, not both")
        if self.host_bandwidth is not None and not self.host_bandwidth > 0:
            raise ValueError(f"host bandwidth must be > 0, got {self.host_bandwidth}")


OPTIONS = names(Options)


@dataclass(frozen=True)
class Settings:
    """The options resolved against the budget: the objective settled, the
    transfer cost per byte from either spelling, the worker count."""

    objective: str
    budget: int | None
    offload: bool
    transfer_cost_per_byte: float
    max_overhead: float | None
    max_clone_expansion: float | None
    time_limit: float  # wall seconds: the outer bound
    deterministic_time: float | None  # CP-SAT's deterministic seconds (one worker), or None: the wall clock alone
    workers: int
    seed: int
    hint: Plan | None
    warm_start: str
    log_path: str | None
    progress: bool
    lp_bound: bool
    depth: int | str | None  # None: automatic; "full"; or a number of producer hops
    export_model: str | None  # write the first round's model here (proto text) and its LP (.mps)
    lns: str = "auto"  # large-neighbourhood search after the rounds: auto, on, off
    tuning: Tuning = TUNING

    @classmethod
    def parse(cls, budget: int | None, options: dict) -> "Settings":
        o = parse(Options, options, "cpsat")
        objective = o.objective or ("overhead" if budget is not None else "peak")
        if objective == "overhead" and budget is None:
            raise PlannerError("cpsat: --objective overhead needs a budget (--budget or --budget-ratio)")
        per_byte = 1.0 / o.host_bandwidth if o.host_bandwidth is not None else float(o.transfer_cost_per_byte or 0.0)
        if o.deterministic_time is not None and o.workers > 1:
            raise PlannerError(f"cpsat: --deterministic-time runs one worker (a result that does not depend on "
                               f"the machine's load), not --workers {o.workers}")
        workers = 1 if o.deterministic_time is not None else o.workers or os.cpu_count() or 1
        return cls(objective, budget, o.offload, per_byte, o.max_overhead, o.max_clone_expansion or None,
                   float(o.time_limit), o.deterministic_time, workers, o.seed, o.hint, o.warm_start, o.log_path,
                   o.progress, o.lp_bound, None if o.recompute_depth == "auto" else o.recompute_depth,
                   o.export_model, o.lns, o.tuning or TUNING)


def max_recomputes(cfg: Settings, compute_nodes: int) -> int | None:
    """``--max-clone-expansion`` as a cap on compute events beyond the first ones."""
    x = cfg.max_clone_expansion
    return math.floor(x * compute_nodes) - compute_nodes if x else None
