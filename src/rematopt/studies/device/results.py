"""What the bench measured: a row per variant, and the run's state the report is written from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...xla.cost import Calibration, StepCost
from ...xla.machine import Machine
from .settings import RATIOS


# the kinds of row a plan is compared with: the plain step, per-layer and whole-step policies, XLA's GPU remat
BASELINES = ("plain", "layer", "step", "xla-gpu")


@dataclass
class Row:
    model: str
    variant: str
    kind: str  # a baseline's (BASELINES), rematopt (a plan), applied (settings.NO_REMAT)
    budget_ratio: float | None = None
    compiled_peak: int | None = None
    compiled_peak_is: str = ""
    device_peak: int | None = None
    step_ms: float | None = None
    step_ms_spread: float | None = None  # fastest step of the even rounds against the odd ones, over step_ms
    # the prediction (bench._calibrate), on the plain step (rematopt's rows: on NO_REMAT's program first): a
    # kernel alike to one of that step's (xla.cost.signature) at its profiled time there, any other priced at
    # one scale, and page faults
    predicted_ms: float | None = None
    predicted_raw_ms: float | None = None  # on the data-sheet profile
    predicted_scale_ms: float | None = None  # as predicted_ms, every kernel priced at one scale
    predicted_class_ms: float | None = None  # as predicted_ms, one scale per kernel class (xla.cost.kernel_class)
    predicted_peak: int | None = None  # the plan's peak on the graph (rematopt rows)
    predicted_overhead: float | None = None  # the plan's recompute overhead on the graph
    page_faults: int | None = None  # minor page faults per step (median over the rounds)
    predicted_faults: int | None = None  # per step, from the compiled program (xla.cost.step_faults)
    kernels: int | None = None
    bytes_moved: int | None = None
    grad_error: float | None = None
    # which limit ended planning (rematopt rows; xla.verify's stopped_by): deterministic_time, max_rounds,
    # bracket (every order's bracket closed first) or time_limit (the wall clock cut it: not reproducible)
    stopped_by: str | None = None
    deterministic_spent: float | None = None  # the deterministic seconds cpsat spent on the plan
    rounds: int | None = None  # the planning rounds the loop ran, all orders together (rematopt rows)
    compile_s: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    device_memory: int | None = None  # what the device reports it can hold (GPU)
    note: str = ""


@dataclass
class Bench:
    backend: str
    device: str  # the cost profile's name
    kind: str = ""  # the device as XLA names it (device_kind)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planning: str = ""
    ratios: tuple[float, ...] = RATIOS
    deterministic_time: float | None = None  # each budget's planning, in CP-SAT's deterministic seconds
    clock: str = "cpu"  # what a step time is: "cpu" (the process's CPU time, one core) or "wall"
    costs: dict[tuple[str, str], StepCost] = field(default_factory=dict)  # (model, variant): its kernels, data sheet
    machine: Machine | None = None  # the CPU's measured rates (None on a GPU: its data sheet)
    # per model, the prediction's calibration (per kernel; one scale where not profiled), or why there is none
    calibrations: dict[str, Calibration | str] = field(default_factory=dict)
    scale_calibrations: dict[str, Calibration | str] = field(default_factory=dict)  # one scale, per model
    # (model, variant): seconds per kernel name, profiled in the timing process (plain and the plans)
    profiles: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    # (model, variant): the step's milliseconds in each interleaved round, as timed (its row keeps the fastest)
    rounds: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    # (model, variant): per kernel name, the page faults its profiled time holds (xla.cost.profiled_faults)
    kernel_faults: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    # per model whose plain step faults: the plain step with its pages kept (settings.KEPT), its fastest
    # milliseconds and its page faults a step (median over the rounds)
    kept: dict[str, tuple[float, int]] = field(default_factory=dict)
    class_calibrations: dict[str, Calibration | str] = field(default_factory=dict)  # per kernel class, per model
    # per model, what rematopt's rows are predicted with (xla.cost.beside: NO_REMAT's program, then the plain
    # step's), or why they are predicted from the plain step's alone
    plan_calibrations: dict[str, Calibration | str] = field(default_factory=dict)
    # per kind of worker process: how many, their wall and CPU seconds, and their phases' wall seconds
    spent: dict[str, dict[str, float]] = field(default_factory=dict)
    run: dict[str, float] = field(default_factory=dict)  # the whole run: wall, cpu, load_start, load_end, two_at_once
    processes: list[tuple[str, str, float, float, float]] = field(default_factory=list)  # Workers.ran
    # per model: (CPU seconds the machine's other processes ran while its variants were timed, the timing's
    # wall seconds; bench._time)
    beside: dict[str, tuple[float, float]] = field(default_factory=dict)

    def predicted_ms(self, calibration: Calibration, row: Row) -> float:
        """``row``'s step on ``calibration``: its compiled program's kernels, its predicted page faults and
        its compiled peak (:meth:`rematopt.xla.cost.Calibration.seconds`), in milliseconds."""
        return 1e3 * calibration.seconds(self.costs[row.model, row.variant], row.predicted_faults or 0,
                                         row.compiled_peak or 0)
