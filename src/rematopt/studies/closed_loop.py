"""The closed loop measured: every model in ``models/`` on this machine's XLA at
several budgets (shares of the compiled plain step's peak), with
:func:`rematopt.xla.verify.verify`: which candidate it chose, its predicted and
compiled peaks, and whether it fits. Run from a checkout (models/ is imported):

    python -m rematopt.studies.closed_loop OUT.jsonl [ratios=0.8,0.6,0.5] [MODEL ...]
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from ..xla import flags

# Every model at its instance config (models/export_instances.py).
MODELS = {
    "mlp": ("models.mlp:factory", {}),
    "gpt": ("models.gpt:factory", {}),
    "gpt_scan": ("models.gpt_scan:factory", {}),
    "resnet": ("models.resnet:factory", {}),
    "unet": ("models.unet:factory", {}),
    "flax_linen": ("models.flax_linen:factory", {}),
    "flax_nnx": ("models.flax_nnx:factory", {}),
    "equinox_lm": ("models.equinox_lm:factory", {}),
    "keras_llama": ("models.keras_lm:factory", {"backbone": "llama"}),
    "keras_gemma": ("models.keras_lm:factory", {"backbone": "gemma"}),
    "keras_gpt2": ("models.keras_lm:factory", {"backbone": "gpt2", "dropout": 0.1}),
}
RATIOS = (0.8, 0.6, 0.5)


def rows(names: list[str], ratios: tuple[float, ...] = RATIOS, planner: str = "cpsat", time_limit: float = 40.0,
         workers: int = 1, say=lambda line: None) -> list[dict[str, Any]]:
    """One record per (model, ratio). The plain and stock compiles are made
    once per model, before the loops, so each ratio's ``time_limit`` goes to
    its planning rounds."""
    from ..xla.factory import load_step, plan_graphs
    from ..xla.verify import compile_figures, verify

    out = []
    for name in names:
        spec, config = MODELS[name]
        start = time.perf_counter()
        step = load_step(spec, config, say=lambda line: say(f"{name}: {line}"))
        graph, fallback = plan_graphs(step, say=lambda line: say(f"{name}: {line}"))
        traced = fallback or graph
        how = "compiled" if fallback is not None else "traced"
        settings = flags.for_backend("cpu")
        known = {label: compile_figures(f, step.args, step.argnums, settings)
                 for label, f in {"plain": step.fn, **step.stock}.items()}
        for ratio in ratios:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                v = verify(step.fn, step.args, graph, planner, ratio, time_limit=time_limit,
                           options={"workers": workers}, stock=step.stock, known=known, fallback=fallback,
                           progress=lambda line: say(f"{name} {ratio}: {line}"))
            rec = {"model": name, "spec": spec, "config": config, "graph": how, "graph_nodes": graph.n,
                   "traced_nodes": traced.n,
                   "planner": planner, "time_limit": time_limit, "trace_s": time.perf_counter() - start,
                   **v.summary()}
            out.append(rec)
            say(f"{name} {ratio}: {v.headline()}")
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    head = ("| model | ratio | budget | plain XLA peak | graph no-remat peak | chosen | predicted | XLA peak | fits "
            "| any candidate fits | rounds |\n|---|---:|---:|---:|---:|---|---:|---:|---|---|---:|\n")
    mib = lambda b: "—" if b is None else f"{b / 2**20:.3f}"  # noqa: E731
    lines = []
    for r in records:
        anyfit = any(c["fits"] for c in r["candidates"])
        lines.append(f"| {r['model']} | {r['budget_ratio']} | {mib(r['budget_bytes'])} | "
                     f"{mib(r['xla_plain_peak_bytes'])} | {mib(r['graph_no_remat_peak_bytes'])} | {r['chosen']} | "
                     f"{mib(r['predicted_peak_bytes'])} | {mib(r['xla_peak_bytes'])} | "
                     f"{'yes' if r['fits'] else 'no'} | {'yes' if anyfit else 'no'} | {r['rounds']} |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    flags.apply(flags.CPU_VERIFY)  # before the backend starts
    path = Path(sys.argv[1])
    given = sys.argv[2:]
    ratios = tuple(float(x) for x in given.pop(0).split("=")[1].split(",")) if given[:1] and \
        given[0].startswith("ratios=") else RATIOS
    with path.open("a") as f:
        for name in given or list(MODELS):
            for rec in rows([name], ratios, say=lambda line: print(line, file=sys.stderr, flush=True)):
                f.write(json.dumps(rec, default=str) + "\n")
                f.flush()
