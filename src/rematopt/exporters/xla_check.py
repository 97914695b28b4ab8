"""Does XLA keep an exported plan? Compile the original and the exported
module with the installed jaxlib's XLA and compare.

* **Recomputations kept**: the exported text names every clone
  (``%h.remat1 = ...``); XLA carries each instruction's source line into the
  optimized HLO's metadata, fused instructions included, so a clone survives
  when some instruction of the optimized module still comes from its line.
  The original is compiled as the exporter prints it without a plan (the
  no-remat plan), so its ops have lines too. A clone counts when XLA keeps
  its original: an op XLA folds away (a constant expression, a reduction
  over a size-1 dimension, a maximum with -inf) goes with or without a
  recomputation, and so does one that only moves data (:data:`NO_FLOPS`: a
  reshape becomes a bitcast, a broadcast joins its reader).
* **Recomputations computed**: the FLOPs the optimized module spends on
  instructions from the clones' lines (``compiled_flops``) must be the counted
  clones' FLOPs, counted the way XLA's cost analysis counts them
  (:func:`xla_flops`), within :data:`FLOPS_TOLERANCE`: XLA neither
  simplified them away nor made them again in several fusions.
* **FLOPs rise**, reported, not checked: ``cost_analysis()["flops"]`` of the
  exported module less the original's. It is what the recomputation costs
  as compiled, and it moves with more than the clones: XLA fuses and
  duplicates the ops around them differently once they are there (jax
  0.10.2's CPU XLA: the lowered gpt's greedy plan at 0.9 rose 2.8% over its
  clones' FLOPs, the MLP's 133,632 against 1,280 where a recomputed tanh's
  fusion redoes the add it reads; 0.12.1's: the tests' small gpt step's
  16% under them, an elementwise chain on the MLP's activations that XLA
  had computed in two fusions computed in one; docs/mlir.md).

On CPU, XLA removes optimization barriers before CSE, which then merges a
clone with its original (measured: an 8-layer tanh MLP with per-layer
``jax.checkpoint`` compiles to the same FLOPs as without it, and to 35% more
with CSE off). So on CPU the check compiles with the ``cse`` pass disabled
(the control ``reports/jax_measure`` uses); on an accelerator it runs the
full pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..importers.mlir import contraction_flops, element_counts, load_function
from ..xla.hlo import parse_hlo
from ..xla.kernels import TRANSCENDENTAL, instruction_flops

FLOPS_TOLERANCE = 0.10
_CLONE = re.compile(r"\.remat\d+$")
_SOURCE_LINE = re.compile(r"source_line=(\d+)")
_DEFINES = re.compile(r"\s*%([^\s:=]+)(?::\d+)?\s*=")
# Ops XLA's cost analysis gives no FLOPs: data movement, constants, barriers
# and annotations.
NO_FLOPS = frozenset({
    "broadcast_in_dim", "broadcast", "reshape", "transpose", "slice", "dynamic_slice", "dynamic_update_slice",
    "concatenate", "constant", "iota", "pad", "gather", "reverse", "bitcast_convert", "optimization_barrier",
    "get_tuple_element", "tuple", "custom_call", "sharding_constraint",
})
# Transcendentals: XLA counts them apart ("transcendentals"), not as FLOPs.
TRANSCENDENTALS = frozenset({
    "exponential", "exponential_minus_one", "log", "log_plus_one", "tanh", "logistic", "sqrt", "rsqrt", "cbrt",
    "sine", "cosine", "tan", "atan2", "power", "erf", "erf_inv",
})


@dataclass(frozen=True)
class XlaCheck:
    backend: str
    cse: bool                # whether XLA's CSE pass ran
    clones: int              # recomputations in the exported module whose original XLA keeps
    clones_kept: int         # of them, those the optimized HLO still computes
    flops_before: float      # cost_analysis FLOPs of the original module
    flops_after: float       # ... of the exported one
    planned_flops: float     # the counted clones' FLOPs, counted as XLA counts them
    compiled_flops: float    # what the optimized exported module spends on instructions from their lines

    @property
    def rise(self) -> float:
        return self.flops_after - self.flops_before

    @property
    def flops_error(self) -> float:
        """|compiled_flops - planned_flops| / planned_flops (0 when both are 0)."""
        if self.planned_flops == 0:
            return 0.0 if self.compiled_flops == 0 else float("inf")
        return abs(self.compiled_flops - self.planned_flops) / self.planned_flops

    @property
    def ok(self) -> bool:
        return self.clones_kept == self.clones and self.flops_error <= FLOPS_TOLERANCE

    def summary(self) -> dict:
        return {"backend": self.backend, "cse": self.cse, "clones": self.clones, "clones_kept": self.clones_kept,
                "planned_clone_flops": self.planned_flops, "compiled_clone_flops": self.compiled_flops,
                "flops_error": self.flops_error, "flops_before": self.flops_before, "flops_after": self.flops_after,
                "flops_rise": self.rise, "ok": self.ok}


def xla_flops(ir, op) -> float:
    """FLOPs of one op as XLA's HLO cost analysis counts them: 2 per
    multiply-add in contractions, 1 per result element for elementwise ops,
    1 per folded element for reductions, 0 for data movement and for
    transcendentals (counted apart)."""
    flops = contraction_flops(ir, op)
    if flops is not None:
        return flops
    base = op.operation.name.rsplit(".", 1)[-1]
    if base in NO_FLOPS or base in TRANSCENDENTALS:
        return 0.0
    ins, outs = element_counts(ir, op)
    if base in ("reduce", "reduce_window"):
        half = len(ins) // 2  # operands, then their init values
        return float(max(sum(ins[:half]) - sum(outs), 0))
    return float(sum(outs))


def compile_module(text: str, cse: bool):
    """The module compiled by the default backend's XLA (one device)."""
    from jax._src import compiler, xla_bridge
    from jax._src.lib import xla_client as xc

    backend = xla_bridge.get_backend()
    overrides = {} if cse else {"xla_disable_hlo_passes": "cse"}
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=backend,
                                           env_options_overrides=overrides)
    return backend.compile_and_load(text, xc.DeviceList(tuple(backend.local_devices()[:1])), options)


def check_export(original: str | Path, exported: str | Path, function: str | None = None,
                 cse: bool | None = None) -> XlaCheck:
    """Compile both modules and compare (``cse``: default off on CPU, on
    elsewhere). ``exported`` is :func:`~rematopt.exporters.mlir.export_mlir`'s
    text written to a file, so its clones are named ``<name>.remat<k>``."""
    from jax._src import xla_bridge
    from jax._src.lib.mlir import ir

    from ..reference import no_remat_plan
    from .mlir import export_mlir

    platform = xla_bridge.get_backend().platform
    if cse is None:
        cse = platform != "cpu"
    base = load_function(original, function)
    base_text = export_mlir(original, no_remat_plan(base.graph), function=function)
    before = compile_module(base_text, cse)
    lines = _defined_at(base_text)
    kept = {lines[n] for n in _hlo_lines(before) if n in lines}
    fn = load_function(exported, function)
    with fn.context:
        counted = {}
        for v in fn.graph.nodes:
            op = fn.node_ops[v.id]
            if not v.is_input and _CLONE.search(v.name) and _CLONE.sub("", v.name) in kept \
                    and op.operation.name.rsplit(".", 1)[-1] not in NO_FLOPS:
                counted[op.location.start_line] = xla_flops(ir, op)
    after = compile_module(Path(exported).read_text(), cse)
    return XlaCheck(platform, cse, len(counted), len(_hlo_lines(after) & counted.keys()),
                    float(before.cost_analysis().get("flops", 0.0)), float(after.cost_analysis().get("flops", 0.0)),
                    sum(counted.values()), _flops_at(after, counted.keys()))


def _hlo_lines(executable) -> set[int]:
    """Source lines of the instructions left in the optimized HLO."""
    return {int(n) for m in executable.hlo_modules() for n in _SOURCE_LINE.findall(m.to_string())}


def _flops_at(executable, lines) -> float:
    """FLOPs of the optimized HLO's instructions from ``lines`` (fused ones by their own line), each
    counted once as XLA's cost analysis counts it (transcendentals apart)."""
    lines = set(lines)
    return float(sum(instruction_flops(inst) for m in executable.hlo_modules()
                     for comp in parse_hlo(m.to_string()).computations.values() for inst in comp.instructions
                     if inst.metadata.source_line in lines and inst.opcode not in TRANSCENDENTAL))


def _defined_at(text: str) -> dict[int, str]:
    """Line -> SSA name of the value defined on it (``%h = ...``, ``%w:2 = ...``)."""
    out = {}
    for k, line in enumerate(text.splitlines(), start=1):
        m = _DEFINES.match(line)
        if m:
            out[k] = m.group(1)
    return out
