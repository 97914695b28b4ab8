"""The options ``cpsat`` reads, checked once into a frozen :class:`Settings`."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

from ...errors import PlannerError
from ...plan import Plan

# What plan() reads (Settings.parse).
OPTIONS = frozenset({"objective", "max_overhead", "offload", "host_bandwidth", "transfer_cost_per_byte",
                     "max_clone_expansion", "time_limit", "workers", "seed", "hint", "warm_start", "log_path",
                     "progress", "lp_bound", "recompute_depth", "export_model"})


@dataclass(frozen=True)
class Settings:
    """The planner's options, checked once."""

    objective: str
    budget: int | None
    offload: bool
    transfer_cost_per_byte: float
    max_overhead: float | None
    max_clone_expansion: float | None
    time_limit: float
    workers: int
    seed: int
    hint: Plan | None
    warm_start: str
    log_path: str | None
    progress: bool
    lp_bound: bool
    depth: int | str | None  # None: automatic; "full"; or a number of producer hops
    export_model: str | None  # write the first round's model here (proto text) and its LP (.mps)

    @classmethod
    def parse(cls, budget: int | None, o: dict[str, Any]) -> "Settings":
        objective = o.get("objective") or ("overhead" if budget is not None else "peak")
        if objective not in ("overhead", "peak"):
            raise PlannerError(f"cpsat: objective must be 'overhead' or 'peak', got {objective!r}")
        if objective == "overhead" and budget is None:
            raise PlannerError("cpsat: --objective overhead needs a budget (--budget or --budget-ratio)")
        bw, tcpb = o.get("host_bandwidth"), o.get("transfer_cost_per_byte")
        if bw is not None and tcpb is not None:
            raise PlannerError("cpsat: give --host-bandwidth or --transfer-cost-per-byte, not both")
        if bw is not None and not bw > 0:
            raise PlannerError(f"cpsat: host bandwidth must be > 0, got {bw}")
        per_byte = 1.0 / bw if bw is not None else float(tcpb or 0.0)
        for key in ("max_overhead", "max_clone_expansion", "time_limit", "transfer_cost_per_byte"):
            if o.get(key) is not None and not (o[key] >= 0 and math.isfinite(o[key])):
                raise PlannerError(f"cpsat: {key.replace('_', '-')} must be a finite number >= 0, got {o[key]}")
        workers = o.get("workers")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, numbers.Integral)
                                    or workers < 0):
            raise PlannerError(f"cpsat: workers must be an integer >= 0 (0: all cores), got {workers!r}")
        hint = o.get("hint")
        if hint is not None and not isinstance(hint, Plan):
            raise PlannerError("cpsat: hint must be a Plan")
        return cls(objective, budget, bool(o.get("offload", False)), per_byte, o.get("max_overhead"),
                   o.get("max_clone_expansion") or None, float(60.0 if o.get("time_limit") is None else o["time_limit"]),
                   int(o.get("workers") or os.cpu_count() or 1), int(o.get("seed") or 0), hint,
                   o.get("warm_start") or "auto", o.get("log_path"), bool(o.get("progress", False)),
                   bool(o.get("lp_bound", True)), _depth(o.get("recompute_depth")), o.get("export_model"))


def _depth(value: Any) -> int | str | None:
    if value in (None, "auto"):
        return None
    if value == "full":
        return "full"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlannerError(f"cpsat: recompute depth must be 'auto', 'full' or an integer >= 0, got {value!r}")
    return value


def max_recomputes(cfg: Settings, compute_nodes: int) -> int | None:
    """``--max-clone-expansion`` as a cap on compute events beyond the first ones."""
    x = cfg.max_clone_expansion
    return math.floor(x * compute_nodes) - compute_nodes if x else None
