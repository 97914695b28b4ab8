"""MLIR back end: write a program back with a plan applied.

The function is re-read exactly as the importer reads it (calls inlined), so
plan node ids name its ops. Then, following the plan's events in order:

* a first computation is the original op, a recomputation a clone of it
  (named ``<name>.remat<k>``);
* each op's operands are rewired to the instance of their producer that is
  resident at that point of the plan (the latest one computed);
* ops are laid out in the plan's compute order, so a clone lands right before
  the consumers that use it; instances left without users are erased (a clone
  nobody reads, an original whose consumers all moved to clones); the returned
  values are the last instances.

Memory: in the output a value lives from its op to its last use, which is when
a plan that frees eagerly frees it (every planner here does), so the output's
no-remat peak equals such a plan's peak, and is never above a plan's peak.
Offload and prefetch cannot be said in plain ops: they become attributes
(``docs/mlir.md``) and the program text itself keeps the value live across them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PlanError
from ..importers.mlir import ATTR_RECOMPUTE, MlirFunction, load_function, replace_operands, used_values
from ..plan import COMPUTE, OFFLOAD, PREFETCH, Plan
from ..reference import no_remat_peak
from ..simulate import simulate

# Function attributes recording the figures, in the remat pass's naming style.
ATTR_PEAK_BEFORE = "tessera.remat_peak_before_bytes"
ATTR_PEAK_AFTER = "tessera.remat_peak_after_bytes"
ATTR_SELECTED_COST = "tessera.remat_selected_cost"
ATTR_NUM_CLONES = "tessera.remat_num_clones"
ATTR_COST_UNIT = "tessera.remat_cost_unit"
# Offload decisions, on the value's defining op (in ``arg_attrs`` for an argument).
ATTR_OFFLOAD = "tessera.offload"
ATTR_OFFLOAD_AFTER = "tessera.offload_after"
ATTR_PREFETCH_BEFORE = "tessera.prefetch_before"


def export_mlir(path: str | Path, plan: Plan, function: str | None = None,
                plan_source: str | None = None) -> str:
    """The text of ``path``'s module with ``plan`` applied to ``function``.

    Raises PlanError when the plan does not replay on the function's graph or
    computes an op that is not recomputable out of program order (its effects
    would move).
    """
    from jax.interpreters.mlir import ir

    fn = load_function(path, function)
    graph = fn.graph
    where = plan_source or "plan"
    replay = simulate(graph, plan)
    if not replay.valid:
        raise PlanError(f"{where}: does not replay on {fn.path} (function "
                        f"{graph.meta['function']!r}): {replay.error}")
    with fn.context, ir.Location.unknown():
        layout = _Layout(fn)
        layout.apply(ir, plan, where)
        layout.erase_unused()
        layout.annotate_offload(ir)
        layout.name_values(ir)
        for op in fn.func.regions[0].blocks[0].operations:
            if ATTR_RECOMPUTE in op.attributes:
                del op.attributes[ATTR_RECOMPUTE]
        i64 = ir.IntegerType.get_signless(64)
        attrs = fn.func.attributes
        attrs[ATTR_PEAK_BEFORE] = ir.IntegerAttr.get(i64, no_remat_peak(graph))
        attrs[ATTR_PEAK_AFTER] = ir.IntegerAttr.get(i64, replay.peak_bytes)
        attrs[ATTR_SELECTED_COST] = ir.FloatAttr.get(ir.F64Type.get(), replay.recompute_cost)
        clones = sum(1 for x in layout.instances if x.clone and x.op is not None)
        attrs[ATTR_NUM_CLONES] = ir.IntegerAttr.get(i64, clones)
        attrs[ATTR_COST_UNIT] = ir.StringAttr.get(graph.cost_unit)
        if not fn.module.operation.verify():
            raise PlanError(f"{where}: the rewritten {fn.path} does not verify")
        return fn.module.operation.get_asm(use_name_loc_as_prefix=True, assume_verified=True)


@dataclass
class _Instance:
    """One computation of node ``node``: the original op or a clone."""

    node: int
    op: Any
    name: str
    clone: bool
    offload_after: list[int] = field(default_factory=list)  # indices into instances
    prefetch_before: list[int] = field(default_factory=list)


class _Layout:
    def __init__(self, fn: MlirFunction):
        self.fn = fn
        self.block = fn.func.regions[0].blocks[0]
        self.terminator = list(self.block.operations)[-1]
        self.instances: list[_Instance] = []
        # node -> resident instance (None for an argument: the block argument)
        self.current: dict[int, _Instance | None] = {i: None for i in fn.args}
        self.owner: dict[Any, tuple[int, int]] = {arg: (i, 0) for i, arg in fn.args.items()}
        for i, op in enumerate(fn.node_ops):
            if op is not None:
                self.owner.update((r, (i, k)) for k, r in enumerate(op.results))
        self.arg_offload: dict[int, _Instance] = {}  # argument node -> its offload record
        self.had_uses = {i for i, op in enumerate(fn.node_ops) if op is not None and _has_uses(op)}

    def value(self, i: int, k: int):
        inst = self.current[i]
        return self.fn.args[i] if inst is None else inst.op.results[k]

    def apply(self, ir, plan: Plan, where: str) -> None:
        """One instance per compute event, wired to the resident producers and
        laid out in event order before the terminator."""
        graph = self.fn.graph
        clones_of: dict[int, int] = {}
        pinned_at = -1
        events = list(zip(plan.ops.tolist(), plan.nodes.tolist()))
        for t, (code, i) in enumerate(events):
            if code == OFFLOAD:
                self._record(i).offload_after.append(len(self.instances) - 1)
            elif code == PREFETCH:
                reader = next((s for s, (c, j) in enumerate(
                    (e for e in events[t + 1:] if e[0] == COMPUTE)) if i in graph.preds[j]), None)
                if reader is not None:
                    self._record(i).prefetch_before.append(len(self.instances) + reader)
            if code != COMPUTE:
                continue
            v = graph.nodes[i]
            if i in self.current:
                clones_of[i] = clones_of.get(i, 0) + 1
                op = self.fn.node_ops[i].operation.clone(ip=ir.InsertionPoint(self.terminator))
                self.owner.update((r, (i, k)) for k, r in enumerate(op.results))
                inst = _Instance(i, op, f"{v.name}.remat{clones_of[i]}", True)
            else:
                op = self.fn.node_ops[i].operation
                if not v.recomputable:
                    if graph.position[i] < pinned_at:
                        raise PlanError(f"{where}: computes {v.name!r} out of program order; it is "
                                        "not recomputable, so its effects cannot move")
                    pinned_at = graph.position[i]
                op.move_before(self.terminator)
                inst = _Instance(i, op, v.name, False)
            self._rewire(op)
            self.current[i] = inst
            self.instances.append(inst)
        self._rewire(self.terminator.operation)

    def _record(self, i: int) -> _Instance:
        """Where node i's offload decisions are written: its resident instance."""
        inst = self.current[i]
        if inst is None:
            inst = self.arg_offload.setdefault(i, _Instance(i, None, self.fn.graph.nodes[i].name, False))
        return inst

    def _rewire(self, op) -> None:
        """Point every use in ``op`` (regions included) at the resident instance."""
        resident = {v: self.value(*self.owner[v]) for v in used_values(op) if v in self.owner}
        replace_operands(op, {v: new for v, new in resident.items() if new != v})

    def erase_unused(self) -> None:
        """Erase, last first so that chains of dead instances go too, clones
        nobody reads and recomputable originals whose readers all moved to clones."""
        graph = self.fn.graph
        for inst in reversed(self.instances):
            orphan = not inst.clone and graph.nodes[inst.node].recomputable and inst.node in self.had_uses
            if inst.op.results and (inst.clone or orphan) and not _has_uses(inst.op):
                inst.op.erase()
                inst.op = None

    def _anchor(self, index: int, step: int) -> str | None:
        """Name of the kept instance at ``index``, else the nearest one in
        direction ``step``."""
        while 0 <= index < len(self.instances):
            if self.instances[index].op is not None:
                return self.instances[index].name
            index += step
        return None

    def annotate_offload(self, ir) -> None:
        records = [x for x in self.instances if x.op is not None] + list(self.arg_offload.values())
        for inst in records:
            if not inst.offload_after and not inst.prefetch_before:
                continue
            after = [self._anchor(t, -1) or inst.name for t in inst.offload_after]
            before = [a for a in (self._anchor(t, 1) for t in inst.prefetch_before) if a]
            attrs = {ATTR_OFFLOAD: ir.UnitAttr.get(),
                     ATTR_OFFLOAD_AFTER: _strings(ir, after),
                     ATTR_PREFETCH_BEFORE: _strings(ir, before)}
            if inst.op is not None:
                for key, attr in attrs.items():
                    inst.op.attributes[key] = attr
            else:
                self._set_arg_attrs(ir, inst.node, attrs)

    def _set_arg_attrs(self, ir, node: int, new: dict) -> None:
        func = self.fn.func
        args = list(self.block.arguments)
        current = list(func.attributes["arg_attrs"]) if "arg_attrs" in func.attributes \
            else [ir.DictAttr.get({}) for _ in args]
        k = args.index(self.fn.args[node])
        merged = {na.name: na.attr for na in current[k]}
        merged.update(new)
        current[k] = ir.DictAttr.get(merged)
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(current)

    def name_values(self, ir) -> None:
        """Name locations, so the printer keeps the graph's names as SSA names."""
        for i, arg in self.fn.args.items():
            arg.set_location(ir.Location.name(self.fn.graph.nodes[i].name))
        for inst in self.instances:
            if inst.op is not None:
                inst.op.location = ir.Location.name(inst.name)


def _strings(ir, names: list[str]):
    return ir.ArrayAttr.get([ir.StringAttr.get(n) for n in names])


def _has_uses(op) -> bool:
    return any(True for r in op.results for _ in r.uses)
