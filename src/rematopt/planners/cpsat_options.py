"""The options ``cpsat`` reads (see :mod:`.options`). The objective's
default depends on the budget (overhead with one, peak without), so it is
None here and settled by the planner, as is ``workers`` (0: all cores)."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Plan
from .options import option


def recompute_depth(text: str) -> int | str:
    """The command line's ``--recompute-depth``: auto, full or an integer >= 0."""
    if text in ("auto", "full"):
        return text
    if not text.isdigit():
        raise ValueError(f"expected auto, full or an integer >= 0, got {text!r}")
    return int(text)


@dataclass(frozen=True)
class Options:
    objective: str | None = option(None, "minimise overhead under the budget, or the peak.",
                                   choices=("overhead", "peak"))
    max_overhead: float | None = option(None, "overhead cap (with --objective peak).", minimum=0, finite=True)
    offload: bool = option(False, "allow host offload.")
    host_bandwidth: float | None = option(None, "transfer cost = bytes / this (bytes per cost unit).")
    transfer_cost_per_byte: float | None = option(None, "transfer cost = bytes x this.", minimum=0, finite=True)
    max_clone_expansion: float | None = option(None, "compute events <= X x compute nodes (0: unbounded).",
                                               minimum=0, finite=True)
    time_limit: float = option(60.0, "solver time limit, seconds.", minimum=0, finite=True)
    workers: int = option(0, "solver threads (default: all cores).", minimum=0)
    seed: int = option(0, "solver random seed.")
    hint: Plan | None = option(None, "a plan to start the solver from.", from_text=Plan.load)
    warm_start: str = option("auto", "run fast planners first.", choices=("auto", "none"))
    log_path: str | None = option(None, "write incumbent/bound over time (CSV).", cli="--log")
    progress: bool = option(False, "show the incumbent and bound while solving.", cli=False)
    lp_bound: bool = option(True, "bound the objective by the LP relaxation too.", cli=False)
    export_model: str | None = option(None, "write the first round's CP-SAT model (proto text) here and its LP "
                                      "beside it (.mps).")
    recompute_depth: int | str = option("auto", "auto, full, or recompute only within N producer hops of "
                                        "each stage's node.", choices=("auto", "full"), minimum=0,
                                        from_text=recompute_depth)

    def __post_init__(self) -> None:
        if self.host_bandwidth is not None and self.transfer_cost_per_byte is not None:
            raise ValueError("give --host-bandwidth or --transfer-cost-per-byte, not both")
        if self.host_bandwidth is not None and not self.host_bandwidth > 0:
            raise ValueError(f"host bandwidth must be > 0, got {self.host_bandwidth}")
