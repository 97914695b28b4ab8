"""Compile the models' training steps on this machine's CPU under XLA's memory-minimizing scheduler
and write, per step, XLA's figures and the HLO text (a helper the xla tests run in a fresh process:
the scheduler flag only takes effect in ``XLA_FLAGS`` before the backend starts; jax 0.10.2 accepts it
per compile but ignores it there).

    XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false python tests/xla_steps.py OUT_DIR [MODEL...]
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

# Every model in models/ at its instance config, one table with the closed-loop study's (gpt_scan
# compiles to a while loop, so the walk's loop handling is tried on it).
from rematopt.studies.closed_loop import MODELS

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
PLANNED_BUDGET = 0.7  # of the graph's no-remat peak: low enough that greedy recomputes in every model


def stats_dict(compiled) -> dict:
    m = compiled.memory_analysis()
    return {k: int(getattr(m, k)) for k in ("temp_size_in_bytes", "argument_size_in_bytes",
                                           "output_size_in_bytes", "alias_size_in_bytes",
                                           "peak_memory_in_bytes")}


def main(out: Path, names: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    import jax

    from rematopt.jax import apply_plan, load_factory, trace_grad
    from rematopt.reference import no_remat_peak
    from rematopt.solve import solve

    out.mkdir(parents=True, exist_ok=True)
    record = {}
    for name in names:
        spec, config = MODELS[name]
        fn, args = load_factory(spec, **config)
        steps = {"plain": fn}
        graph = trace_grad(fn, *args, name=name)
        plan = solve(graph, "greedy", budget_ratio=PLANNED_BUDGET).plan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # each value computed once: the program these tests pinned (run as planned, gpt's greedy plan
            # compiles to a step whose heap the CPU assignment's emulation reads 892,928 B against XLA's 909,312)
            steps["greedy"] = apply_plan(fn, graph, plan, as_planned=False)
        for variant, f in steps.items():
            compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
            (out / f"{name}_{variant}.hlo").write_text(compiled.as_text())
            record[f"{name}_{variant}"] = stats_dict(compiled)
        xla_graph = trace_grad(fn, *args, name=name, fuse="xla")
        record[f"{name}_graphs"] = {
            "unfused": {"nodes": graph.n, "no_remat_peak": no_remat_peak(graph)},
            "xla": {"nodes": xla_graph.n, "no_remat_peak": no_remat_peak(xla_graph), "meta": xla_graph.meta["xla"]},
        }
    record["_xla_flags"] = __import__("os").environ.get("XLA_FLAGS", "")
    (out / "stats.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or list(MODELS))
