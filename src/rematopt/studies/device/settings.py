"""What the bench runs: its models at each size, the stock policies and budgets, its rounds, and
the limits on its processes and planning (each figure with the measurement that set it)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path


CPU_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
RATIOS = (0.8, 0.6, 0.5)
# --quick: fewer rows and one budget (7.6 min of CPU on the idle 2-core machine, 62% of it planning: 6 min 13 s
# one process after another, 4 min 20 s two at a time, measured at 9538fcc; 4 min 26 s at b286b1b; on
# 2026-12-06's slower machine 5 min 29 s at 3008b92, 4 min 36 s planning in 3 rounds an order; docs/device.md)
QUICK_POLICIES = {"layer": ("nothing_saveable", "dots_saveable"), "step": ("dots_saveable",)}
QUICK_RATIOS = (0.8,)
# Interleaved timing rounds (one step of every variant each). On the shared 2-core machine the CPU
# time of one step varies by under 5% between rounds (quick gpt, load average 10); the fastest of
# 5 rounds is steady to within that.
ROUNDS, QUICK_ROUNDS = 9, 5
# Short steps get more rounds, up to ROUND_SECONDS of each variant's steps (at most MAX_ROUNDS): quick
# keras_llama's 12.8 ms steps, fastest of 5 rounds, differed by 10.6% between the even and odd rounds.
ROUND_SECONDS, MAX_ROUNDS = 0.5, 60
# A full run's rounds go on past ROUNDS, up to SETTLE_ROUNDS in all, until each variant's fastest step of the
# even rounds is within SETTLED of its fastest of the odd rounds (worker.settled). A plan is predicted from
# NO_REMAT's fastest step and measured by its own: in the thirteenth full run (2026-12-07) gpt's 1.3-s steps
# differed by up to 5.1% between even and odd rounds in 9, NO_REMAT's fastest (801 ms, in the first round) 5%
# under the odd rounds' (842), and its three plans were predicted 3.9 to 5.0 points under their measured
# overheads; the same data from NO_REMAT's and the plans' last 7 rounds, 1.8 to 2.7 (docs/device.md).
SETTLED, SETTLE_ROUNDS = 0.02, 18
# Steps profiled per kernel (xla.profile.kernel_seconds), each kernel's fastest taken: the plain step's
# for the per-class calibration, the plans' for the report. quick gpt's plain step profiled 218 ms of
# kernels in its fastest of 5 (wall time, pinned, a load average of 5).
PROFILE_STEPS = 5
AGAIN = "plain (again)"
# The plain step with its pages kept (xla.machine.keep_pages), timed in the same rounds where it faults: what
# its page faults cost it, as it pays them. The micro-benchmark's fault (a byte written a page, then given
# back) priced flax_linen's 13,147 faults a step at 2.51 us each, a third more than its plain step paid
# against its per-layer policies (about 1.9); its plans were predicted 7 to 10 points fast on that price,
# 1 to 3 at 1.9 us (docs/device.md, "A kernel's page faults are in its profile").
KEPT = "plain, pages kept"
# the no-remat plan as apply_plan writes it: its ties and its backward sums written once, no recomputation; a
# row of its own, timed and profiled, that rematopt's plans are predicted from (bench._calibrate)
NO_REMAT = "apply_plan, no remat"
# XLA's GPU memory limit is (0.8 x device memory - inputs - outputs) x slop / 100 (issue 36).
GPU_LIMIT_SHARE = 0.8
# Planning runs on CP-SAT's deterministic clock (one worker, seed 0; rematopt.planners.meter), so the
# same plans come out at any load: D deterministic seconds per budget's closed loop, in at most
# PLAN_ROUNDS rounds per order (each round compiles its plan twice on CPU: the rounds are the time).
# Quick at D = 5 and 8 rounds made the plans the 40 wall seconds had made (gpt 107.49 MB compiled, +5.5%
# on the graph, in 11 rounds; unet 8.38 MB, +0.0%, 7 rounds; flax_linen 12.26 MB against 12.13, 10
# rounds); at 4 rounds gpt's plan was +7.0%, but every quick plan still fits at 0.8 and is at or below
# the fastest fitting baseline, and quick took 6 min 13 s on the idle 2-core machine (planning 189 of
# its 372 s) where 8 rounds took 9 min of CPU: quick planned in 4. On the slower machine of 2026-12-06
# 4 rounds took 5 min 29 s (planning 368 s of CPU), 3 rounds 4 min 36 s (281 s): every quick plan still
# fits and is at or below the fastest fitting baseline (keras_llama 0.952x, its plan +34% on the graph
# against +9%; gpt +2.8% against +6.5%): quick plans in 3. The full sizes: 4 rounds, so that the four
# models' three budgets end within the hour the full run had (quick gpt's 8 rounds took 99 s of CPU).
DETERMINISTIC_S, QUICK_DETERMINISTIC_S = 10.0, 5.0
PLAN_ROUNDS, QUICK_PLAN_ROUNDS = 4, 3
# The wall clock's bound on one budget's loop where the command has no --time-limit: far above what D
# takes, so that only a machine many times slower cuts it (a cut loop says so: stopped_by time_limit).
PLAN_WALL_S = 1800.0
# A row, measuring or timing process never runs longer than this.
WORKER_WALL_S = 900.0
# On CPU, the row and planning processes run this many at a time, each row process pinned to a core of
# its own: the 2-core machine ran them one after another, one core idle (quick on the idle machine:
# rows 89 s, planning 189 s of its 372 s; two at a time on the loaded machine, two processes ran at once
# for 790 of its 1,008 s; docs/device.md).
AT_ONCE = 2
# On an accelerator, the processes at once: each budget's planning in a process of its own on the host's
# cores (CP-SAT on one worker, XLA's compiles), beside one process at a time measuring rows on the
# device; timing alone. A lent GPU host has 16 cores and 15 minutes, and the CPU run's gpt planning alone
# took 624 s of its 1,685 s for three budgets one after another (docs/device.md, "On a GPU").
GPU_AT_ONCE = 8


@dataclass(frozen=True)
class Model:
    label: str
    spec: str  # MODULE:FACTORY
    config: dict  # on CPU
    quick: dict  # under --quick, on any backend
    accelerator: dict  # on a GPU or TPU

    def config_for(self, backend: str, quick: bool) -> dict:
        return self.quick if quick else self.config if backend == "cpu" else self.accelerator


# Defaults: the GPT decoder at a size where activations dominate (issue 36), a U-Net, one Flax and
# one Keras model. On CPU, sizes chosen so a row compiles and runs in seconds on the 2-core machine. On
# an accelerator, widths, sequences and images at the size of ../shared/gpu's GPT step (its plain step
# 16.1 GB as XLA compiled it on an H200) and layers as on CPU, so planning takes as long as there; every
# one traced at that size on CPU (gpt, keras_llama: 1,699 and 1,079 equations; their outputs 125 and
# 62 GB in all, unet 23, flax_linen 14), none compiled there.
MODELS = {
    "gpt": Model("gpt", "models.gpt:factory", {"layers": 8, "width": 256, "heads": 8, "seq": 256, "batch": 4,
                                               "vocab": 512},
                 {"layers": 4, "width": 64, "heads": 4, "seq": 256, "batch": 8, "vocab": 256},
                 {"layers": 8, "width": 1024, "heads": 16, "seq": 1024, "batch": 8, "vocab": 8192}),
    "unet": Model("unet", "models.unet:factory", {"depth": 3, "channels": 16, "image": 64, "batch": 4},
                  {"depth": 2, "channels": 8, "image": 64, "batch": 4},
                  {"depth": 3, "channels": 64, "image": 256, "batch": 16}),
    "flax_linen": Model("flax_linen", "models.flax_linen:factory",
                        {"layers": 4, "width": 128, "heads": 4, "seq": 128, "vocab": 256, "batch": 4},
                        {"layers": 2, "width": 32, "heads": 2, "seq": 128, "vocab": 64, "batch": 8},
                        {"layers": 4, "width": 1024, "heads": 16, "seq": 1024, "vocab": 8192, "batch": 8}),
    "keras_llama": Model("keras_llama", "models.keras_lm:factory",
                         {"backbone": "llama", "layers": 4, "width": 128, "heads": 4, "kv_heads": 2, "hidden": 256,
                          "seq": 128, "vocab": 256, "batch": 4},
                         {"backbone": "llama", "layers": 2, "width": 32, "heads": 4, "kv_heads": 2, "hidden": 64,
                          "seq": 128, "vocab": 64, "batch": 8},
                         {"backbone": "llama", "layers": 4, "width": 1024, "heads": 16, "kv_heads": 8,
                          "hidden": 2816, "seq": 1024, "vocab": 8192, "batch": 8}),
}
DEFAULT_MODELS = tuple(MODELS)
# not a default: the smallest step, for checking the bench itself
MODELS["mlp"] = Model("mlp", "models.mlp:factory", {"layers": 8, "width": 512, "batch": 256},
                      {"layers": 3, "width": 32, "in_dim": 16, "batch": 16},
                      {"layers": 8, "width": 4096, "batch": 4096})


def unimportable(names: tuple[str, ...]) -> list[str]:
    """The models' modules that the current directory does not hold: the workers import them
    from there (a checkout's ``models/``), so the bench says so before it starts rather than
    failing every row. Looked up, not imported: the parent process stays free of JAX."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    missing = []
    for name in names:
        module = MODELS[name].spec.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found and module not in missing:
            missing.append(module)
    return missing
