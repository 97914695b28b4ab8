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

For XLA (a StableHLO function, by default): each run of clones is pinned
behind an optimization barrier as JAX pins ``jax.checkpoint``, so that CSE
keeps it, and offload / prefetch become XLA's host-offload annotations
(:mod:`.host_offload`), besides the ``tessera.*`` attributes written for
compilers that read those (``docs/mlir.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PlanError
from ..importers.mlir import ATTR_PHASE, ATTR_RECOMPUTE, MlirFunction, load_function, replace_operands, used_values
from ..plan import COMPUTE, OFFLOAD, PREFETCH, Plan
from ..reference import no_remat_peak
from ..simulate import simulate

# Function attributes recording the figures under the remat pass's own names (i64).
ATTR_AUTO_SELECTED = "tessera.remat_auto_selected"
ATTR_BUDGET_BYTES = "tessera.remat_budget_bytes"
ATTR_PEAK_BEFORE = "tessera.remat_peak_before_bytes"
ATTR_PEAK_AFTER = "tessera.remat_peak_after_bytes"
ATTR_SELECTED_COST = "tessera.remat_selected_cost_ns"
ATTR_REMATERIALIZED = "tessera.rematerialized"
NS_PER_UNIT = {"ns": 1.0, "s": 1e9}
# Offload decisions, on the value's defining op (in ``arg_attrs`` for an argument).
ATTR_OFFLOAD = "tessera.offload"
ATTR_OFFLOAD_AFTER = "tessera.offload_after"
ATTR_PREFETCH_BEFORE = "tessera.prefetch_before"


def export_mlir(path: str | Path, plan: Plan, function: str | None = None,
                plan_source: str | None = None, drop_unsafe_marks: bool = False,
                xla: bool | None = None) -> str:
    """The text of ``path``'s module with ``plan`` applied to ``function``.

    ``xla``: also write what XLA reads (default: when the function is
    StableHLO, i.e. has a ``stablehlo`` op): each run of recomputations
    pinned behind a ``stablehlo.optimization_barrier``, so that CSE cannot
    merge the clones back into the forward ops, and offload / prefetch as
    XLA's host-offload annotations.

    Raises PlanError when the plan does not replay on the function's graph or
    computes an op that is not recomputable out of program order (its effects
    would move).
    """
    from jax.interpreters.mlir import ir

    fn = load_function(path, function, drop_unsafe_marks=drop_unsafe_marks)
    graph = fn.graph
    where = plan_source or "plan"
    replay = simulate(graph, plan)
    if not replay.valid:
        raise PlanError(f"{where}: does not replay on {fn.path} (function "
                        f"{graph.meta['function']!r}): {replay.error}")
    with fn.context, ir.Location.unknown():
        pin = _is_stablehlo(fn) if xla is None else xla
        layout = _Layout(fn)
        layout.apply(ir, plan, where)
        layout.erase_unused()
        if pin:
            layout.pin_recomputations(ir)
        layout.annotate_offload(ir)
        if pin:
            layout.place_offloads(ir)
        layout.name_values(ir)
        layout.write_phases(ir)
        for op in fn.func.regions[0].blocks[0].operations:
            if ATTR_RECOMPUTE in op.attributes:
                del op.attributes[ATTR_RECOMPUTE]
        i64 = ir.IntegerType.get_signless(64)
        clones = sum(1 for x in layout.instances if x.clone and x.op is not None)
        for key, value in pass_figures(graph, plan, replay, clones).items():
            fn.func.attributes[key] = ir.IntegerAttr.get(i64, value)
        if not fn.module.operation.verify():
            raise PlanError(f"{where}: the rewritten {fn.path} does not verify")
        return fn.module.operation.get_asm(use_name_loc_as_prefix=True, assume_verified=True)


def _is_stablehlo(fn: MlirFunction) -> bool:
    return any(op is not None and op.operation.name.startswith("stablehlo.") for op in fn.node_ops)


def pass_figures(graph, plan: Plan, replay, clones: int) -> dict[str, int]:
    """The remat pass's function figures for ``plan``: from greedy's stats
    where it states them in the pass's terms (its peak model before and
    after, the selected nodes' own cost, the automatic selections), else
    from the replay (no-remat and replayed peak, recompute cost, the nodes
    recomputed without a mark). Costs in ns."""
    stats = plan.stats

    def stated(key: str, default):
        value = stats.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    counts = np.bincount(plan.nodes[plan.ops == COMPUTE], minlength=graph.n)
    recomputed = np.flatnonzero(counts > 1).tolist()
    out = {
        ATTR_AUTO_SELECTED: int(stated("auto_selected", len([i for i in recomputed
                                                             if not graph.nodes[i].recompute]))),
        ATTR_PEAK_BEFORE: int(stated("peak_before_bytes", no_remat_peak(graph))),
        ATTR_PEAK_AFTER: int(stated("peak_after_bytes", replay.peak_bytes)),
        ATTR_SELECTED_COST: round(stated("selected_cost", replay.recompute_cost) * NS_PER_UNIT[graph.cost_unit]),
        ATTR_REMATERIALIZED: clones,
    }
    if isinstance(stats.get("budget_bytes"), int):
        out[ATTR_BUDGET_BYTES] = stats["budget_bytes"]
    return out


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

    def pin_recomputations(self, ir) -> None:
        """Pin each run of consecutive clones the way JAX lowers
        ``jax.checkpoint``: the values the run reads from outside pass through
        one ``stablehlo.optimization_barrier`` together with the value computed
        right before the run (the backward value it must follow), and the
        clones read the barrier's results. XLA cannot then hoist the run above
        that value, nor CSE a clone with its original (their operands differ)."""
        alive = [x for x in self.instances if x.op is not None]
        k = 0
        while k < len(alive):
            if not alive[k].clone:
                k += 1
                continue
            end = k
            while end < len(alive) and alive[end].clone:
                end += 1
            run = alive[k:end]
            made = {r for x in run for r in x.op.results}
            inputs = list(dict.fromkeys(v for x in run for v in used_values(x.op)
                                        if v not in made and not _constant(v)))
            before = next((x.op.results[0] for x in reversed(alive[:k]) if x.op.results), None)
            follow = [before] if before is not None and before not in inputs else []
            if inputs:
                barrier = ir.Operation.create(
                    "stablehlo.optimization_barrier", results=[v.type for v in inputs + follow],
                    operands=inputs + follow, ip=ir.InsertionPoint(run[0].op))
                barrier.location = ir.Location.name(f"{run[0].name}.barrier")
                mapping = dict(zip(inputs, barrier.results))
                for x in run:
                    replace_operands(x.op, mapping)
            k = end

    def _alive(self, index: int, step: int):
        """The kept instance's op at ``index``, else the nearest one in
        direction ``step`` (None past the end)."""
        while 0 <= index < len(self.instances):
            if self.instances[index].op is not None:
                return self.instances[index].op
            index += step
        return None

    def place_offloads(self, ir) -> None:
        """Offload and prefetch as XLA's host-offload annotations: a copy to
        pinned host memory right after the offload point, a copy back to the
        device right before the first reader after the prefetch, and the
        readers from there on (to the next prefetch) read the device copy."""
        from .host_offload import DEVICE, HOST, placement_attributes

        records = [x for x in self.instances if x.op is not None] + list(self.arg_offload.values())
        records = [x for x in records if x.offload_after or x.prefetch_before]
        if not records:
            return
        attrs = placement_attributes(ir)
        block_ops = list(self.block.operations)
        for inst in records:
            values = [self.fn.args[inst.node]] if inst.op is None else list(inst.op.results)
            events = sorted([(t, 0) for t in inst.offload_after] + [(t, 1) for t in inst.prefetch_before])
            host: list = values
            copies: dict = {}  # device copy op -> the values it stands for
            for k, (index, prefetch) in enumerate(events, start=1):
                if not prefetch:
                    anchor = self._alive(index, -1)
                    if anchor is None or (inst.op is not None and _before(block_ops, anchor, inst.op)):
                        anchor = inst.op
                    at = ir.InsertionPoint(_next_op(self.block, anchor))
                    host = [self._copy(ir, attrs[HOST], v, at, f"{inst.name}.host{k}").results[0] for v in values]
                else:
                    reader = self._alive(index, 1) or self.terminator
                    dev = [self._copy(ir, attrs[DEVICE], h, ir.InsertionPoint(reader), f"{inst.name}.device{k}")
                           for h in host]
                    copies[dev[0].operation] = dict(zip(values, [d.results[0] for d in dev]))
            current: dict = {}
            for op in list(self.block.operations):
                if op.operation in copies:
                    current = copies[op.operation]
                elif current:
                    replace_operands(op, current)

    @staticmethod
    def _copy(ir, attrs: dict, value, at, name: str):
        op = ir.Operation.create("stablehlo.custom_call", results=[value.type], operands=[value],
                                 attributes=dict(attrs), ip=at)
        op.location = ir.Location.name(name)
        return op

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

    def write_phases(self, ir) -> None:
        """Phases read from JAX's locations, as the pass's attribute on the
        backward ops: the output is printed without locations."""
        graph = self.fn.graph
        for inst in self.instances:
            if inst.op is not None and graph.nodes[inst.node].phase == "backward" \
                    and ATTR_PHASE not in inst.op.attributes:
                inst.op.attributes[ATTR_PHASE] = ir.StringAttr.get("backward")

    def name_values(self, ir) -> None:
        """Name locations, so the printer keeps the graph's names as SSA names."""
        for i, arg in self.fn.args.items():
            arg.set_location(ir.Location.name(self.fn.graph.nodes[i].name, childLoc=arg.location))
        for inst in self.instances:
            if inst.op is not None:  # the old location (its source) stays inside the name
                inst.op.location = ir.Location.name(inst.name, childLoc=inst.op.location)


def _next_op(block, op):
    """The op after ``op`` in ``block`` (``op`` None: the first op)."""
    ops = [x.operation for x in block.operations]
    return ops[0] if op is None else ops[ops.index(op.operation) + 1]


def _before(ops: list, a, b) -> bool:
    """Whether ``a`` comes before ``b`` in ``ops``."""
    ops = [x.operation for x in ops]
    return ops.index(a.operation) < ops.index(b.operation)


def _constant(value) -> bool:
    """A constant's result: left out of barriers, which would hide it from
    XLA's algebraic simplifier (measured on a lowered MLP step: a clone of
    ``broadcast(1.0)`` read through a barrier kept a multiply by one, 65,536
    FLOPs, that the simplifier otherwise removes)."""
    owner = getattr(value, "owner", None)
    return owner is not None and getattr(owner, "name", None) in ("stablehlo.constant", "arith.constant")


def _strings(ir, names: list[str]):
    return ir.ArrayAttr.get([ir.StringAttr.get(n) for n in names])


def _has_uses(op) -> bool:
    return any(True for r in op.results for _ in r.uses)
