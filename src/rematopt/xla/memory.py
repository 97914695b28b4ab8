"""The compiled step's memory: a liveness walk over XLA's scheduled entry computation.

XLA's buffer assignment gives every array an instruction writes its own buffer, except where values
share one. The walk follows the same rules:

- fusion internals never own memory; only what a kernel writes does;
- ``bitcast``, ``get-tuple-element``, ``tuple`` and ``optimization-barrier`` are aliases of their
  operands, and a ``while`` runs in the buffers of its operand (copy insertion made that safe);
- in-place ops write their operand's buffer: ``dynamic-update-slice`` and ``scatter`` (alone or as a
  fusion's root) and anything with ``output_to_operand_aliasing`` (custom calls, XLA's own pairs);
- an elementwise kernel (a loop or input fusion, or a lone elementwise op) may write into an operand
  of the same shape whose last use it is (``CanShareOperandBufferWithUser``);
- entry parameters are the caller's: live throughout; an output that is a parameter counts once;
- outputs as the backend counts them: on GPU they own their memory for the whole step (as
  ``peak_memory_in_bytes`` counts them); on CPU each has an allocation that XLA's buffer assignment
  lends to temporaries until the output is written (:func:`cpu_allocations`);
- a while / conditional / call body's own peak (what it allocates beyond its operands) is added at
  the call point.

A buffer is allocated when its instruction runs and freed after its last use; the peak is taken with
the instruction's outputs and inputs live together.

That live peak is XLA's figure on GPU. On CPU XLA computes no peak: its figure is the sum of the
allocations (temp + arguments + outputs), and its temp is a heap into which buffer assignment packs
the temporaries with gaps between them, larger than their live peak (gpt: 808,448 B against
760,320 B). There :mod:`rematopt.xla.assignment` makes the heap, and the live peak, where it falls
and what is live there are read from it (over the schedule flattened through loop bodies), not
from this walk, which adds a loop body's peak on top of everything live at the loop (5.4% over on
gpt_scan). :func:`compiled_memory` reports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .assignment import ELEMENTWISE, Assignment, assign, in_place_pairs
from .heap import live_at, occupancy
from .hlo import POINTER_BYTES, HloModule, Instruction

ALIASES = frozenset({"bitcast", "get-tuple-element", "tuple", "opt-barrier", "optimization-barrier"})
# Ops that produce no buffer of their own in device memory.
NO_BUFFER = frozenset({"constant", "after-all", "partition-id", "replica-id"})


@dataclass(frozen=True)
class Buffer:
    """One array XLA allocates: written by ``instruction`` at shape index ``index``. ``id`` numbers
    it in the walk, or for a CPU temporary is its value in the assignment
    (:attr:`rematopt.xla.assignment.Assignment.values`, ``offsets``). On CPU an output's
    allocation may hold a temporary before the output is written: ``holds`` is the one it holds
    at the peak."""

    id: int
    instruction: str
    index: tuple[int, ...]
    bytes: int
    kind: str  # "parameter", "output", "temp"; "caller" for a nested computation's parameters
    op_name: str = ""
    source: str = ""  # "file:line" of the innermost frame, where the metadata names one
    holds: Buffer | None = None


@dataclass(frozen=True)
class Call:
    """One instruction on the way from the entry to the computation the peak falls in: it
    ``runs`` that computation ("body", "condition", "branch" or "call"); a while loop's
    ``trip_count`` where XLA knows it. XLA reuses a body's buffers on every iteration, so a peak in a
    body falls on each of them."""

    instruction: str
    computation: str
    runs: str
    trip_count: int | None = None


@dataclass
class CompiledMemory:
    """The compiled step's memory. ``peak_bytes`` is the figure to set beside XLA's own
    (:func:`xla_reference`): on GPU / TPU the live peak, on CPU the allocations XLA makes
    (parameters + outputs + ``heap_bytes``). ``heap_bytes`` (CPU only) is XLA's
    ``temp_size_in_bytes``: the heap its buffer assignment packs the temporaries into, gaps
    included, and the tuple tables after it (:mod:`rematopt.xla.assignment`). ``live_peak_bytes``
    is the most memory live at once, what a device's allocator would hold: on GPU / TPU
    ``peak_bytes``; on CPU parameters + outputs + tuple tables + the heap's temporaries at their
    live peak (the heap without its gaps, over XLA's own live ranges, loop bodies included).

    Where ``live_peak_bytes`` falls: ``peak_instruction``, at ``peak_index`` in the schedule of
    ``peak_computation``, run from the entry through ``peak_context`` (outermost first; empty in
    the entry). ``live`` is every buffer live there, largest first, each of kind "parameter",
    "output" or "temp" (XLA's arguments, outputs and temp): their bytes sum to
    ``live_peak_bytes``, the temps' to ``temp_peak_bytes``. On GPU / TPU they come from the walk,
    where a loop at the peak contributes its body's live buffers at the body's own peak; on CPU
    from XLA's buffer assignment, the heap's temporaries as it holds them (a group of values
    sharing an address counted once, at its size) and every temporary tuple table (each has an
    allocation of its own); a temporary XLA houses in an output's allocation is counted as that
    output (it is the output's ``holds``). ``timeline`` is the live bytes at each step of the schedule (GPU / TPU: the entry's;
    CPU: the flattened one, loop bodies before their loop), ``peak_step`` the peak's step there."""

    peak_bytes: int
    peak_index: int
    peak_instruction: str
    parameter_bytes: int
    output_bytes: int
    temp_peak_bytes: int
    live: list[Buffer]
    timeline: list[int] = field(default_factory=list)
    live_peak_bytes: int = 0
    heap_bytes: int | None = None
    peak_computation: str = ""
    peak_context: list[Call] = field(default_factory=list)
    peak_step: int = 0

    def summary(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes, "live_peak_bytes": self.live_peak_bytes, "heap_bytes": self.heap_bytes,
            "peak_index": self.peak_index, "peak_instruction": self.peak_instruction,
            "peak_computation": self.peak_computation,
            "peak_context": [{"instruction": c.instruction, "computation": c.computation, "runs": c.runs,
                              "trip_count": c.trip_count} for c in self.peak_context],
            "parameter_bytes": self.parameter_bytes,
            "output_bytes": self.output_bytes, "temp_peak_bytes": self.temp_peak_bytes,
            "live": [{**_entry(b), "holds": _entry(b.holds) if b.holds else None} for b in self.live],
        }

    @property
    def where(self) -> str:
        """The peak's place in words: ``#12 fusion.3`` or ``#4 add.7 in the body of while.2 (2 iterations)``."""
        out = f"#{self.peak_index} {self.peak_instruction}"
        for call in reversed(self.peak_context):
            trips = f" ({call.trip_count} iterations)" if call.trip_count is not None else ""
            out += f" in the {call.runs} of {call.instruction}{trips}"
        return out


def _entry(b: Buffer) -> dict:
    return {"instruction": b.instruction, "index": list(b.index), "bytes": b.bytes, "kind": b.kind,
            "op_name": b.op_name, "source": b.source}


def compiled_memory(module: HloModule, backend: str | None = None) -> CompiledMemory:
    """The compiled step's memory counted as XLA counts it on ``backend`` ("cpu", "gpu", "tpu"; by
    default the one the module was compiled for, :func:`backend_of`): its figure, the live peak,
    where that falls and what is live there; on CPU, also the heap XLA packs the temporaries into."""
    backend = backend or backend_of(module)
    walk = _Walk(module, module.entry.name, entry=True)
    if backend != "cpu":
        result = walk.result()
        return replace(result, live_peak_bytes=result.peak_bytes)
    return _heap_peak(module, walk.fixed(), assign(module))


def _heap_peak(module: HloModule, fixed: list[Buffer], done: Assignment) -> CompiledMemory:
    """CPU: the allocations XLA makes, and the live peak read from its buffer assignment: the
    first tick of the heap simulator's clock at which the heap holds the most, the instruction
    running then, and the heap's temporaries live then beside the parameters, the outputs (each
    with the temporary its allocation holds then, if any) and the tuple tables. Where the heap
    holds nothing, everything live is live throughout: the peak is put at the first step."""
    at, after = occupancy(done.intervals), occupancy(done.intervals, after=True)
    tick = int(at.argmax()) if at.size else None
    step = done.ticks[tick] if tick is not None else done.schedule.index(module.schedule[0])
    inst = done.schedule[step]
    by_name = {i.name: i for i in done.schedule}

    def value(v: int, nbytes: int | None = None) -> Buffer:
        val = done.values[v]
        return _buffer(by_name[val.instruction], v, val.index, val.bytes if nbytes is None else nbytes, "temp")

    held = {}  # output (instruction, index) -> the temporary its allocation holds at the peak
    for v, out in sorted(done.in_outputs.items(), key=lambda pair: done.ranges[pair[0]]):
        if done.ranges[v][0] <= step <= done.ranges[v][1]:
            held[done.values[out].instruction, done.values[out].index] = value(v)
    heap = [(done.intervals[i].key, nbytes) for i, nbytes in (live_at(done.intervals, tick) if at.size else [])]
    live = [replace(b, holds=held.get((b.instruction, b.index))) for b in fixed]
    live += [value(v, nbytes) for v, nbytes in [*heap, *done.tables.items()]]
    live.sort(key=lambda b: (-b.bytes, b.kind, b.instruction, b.index))
    parameter_bytes = sum(b.bytes for b in fixed if b.kind == "parameter")
    output_bytes = sum(b.bytes for b in fixed if b.kind == "output")
    temp_peak = done.heap.live_peak + done.table_bytes
    comp = module.computations[inst.computation]
    return CompiledMemory(
        peak_bytes=parameter_bytes + output_bytes + done.temp_bytes, peak_index=comp.instructions.index(inst),
        peak_instruction=inst.name, parameter_bytes=parameter_bytes, output_bytes=output_bytes,
        temp_peak_bytes=temp_peak, live=live,
        timeline=_steps(done, at, after, parameter_bytes + output_bytes + done.table_bytes),
        live_peak_bytes=parameter_bytes + output_bytes + temp_peak, heap_bytes=done.temp_bytes,
        peak_computation=comp.name, peak_context=_context(module, done.callers, comp.name), peak_step=step)


def _steps(done: Assignment, at: np.ndarray, after: np.ndarray, base: int) -> list[int]:
    """Live bytes at each step of the flattened schedule: the most at any of its heap events, or
    for a step without one, what the last event before it left."""
    out, left = [], 0
    ticks = {}
    for k, pos in enumerate(done.ticks[:len(at)]):
        ticks.setdefault(pos, []).append(k)
    for pos in range(len(done.schedule)):
        mine = ticks.get(pos, [])
        out.append(base + (int(at[mine].max()) if mine else left))
        left = int(after[mine[-1]]) if mine else left
    return out


def _context(module: HloModule, callers: dict[str, str], computation: str) -> list[Call]:
    """The calls from the entry down to ``computation``, outermost first."""
    by_name = module.by_name
    out: list[Call] = []
    while computation in callers and len(out) <= len(callers):
        caller = by_name[callers[computation]]
        out.append(Call(caller.name, caller.computation, _runs(caller, computation), _trip_count(caller)))
        computation = caller.computation
    return out[::-1]


def _runs(caller: Instruction, computation: str) -> str:
    if caller.opcode == "while":
        return "condition" if caller.callee("condition") == computation else "body"
    return "branch" if caller.opcode == "conditional" else "call"


def _trip_count(inst: Instruction) -> int | None:
    """A while loop's trip count where XLA knows it (its backend config's ``known_trip_count``)."""
    n = inst.backend_config().get("known_trip_count", {}).get("n") if inst.opcode == "while" else None
    return int(n) if n is not None else None


def _buffer(inst: Instruction, id: int, index: tuple[int, ...], nbytes: int, kind: str) -> Buffer:
    """A buffer of ``inst``, attributed to the program through its metadata."""
    meta = inst.metadata
    source = f"{meta.source_file}:{meta.source_line}" if meta.source_file else ""
    return Buffer(id, inst.name, index, nbytes, kind, meta.op_name, source)


def temporaries(module: HloModule) -> list[tuple[Buffer, int, int]]:
    """The entry computation's temporaries, each with its live range ``(first, last)`` in schedule
    positions (parameters and outputs aside)."""
    walk = _Walk(module, module.entry.name, entry=True)
    span = walk.ranges()[0]
    return [(walk.buffers[b], first, last) for b, (first, last) in sorted(span.items())]


def housed_in_outputs(module: HloModule) -> set[Buffer]:
    """The entry's temporaries that XLA's CPU buffer assignment houses in the outputs' allocations
    (:func:`cpu_allocations`): on CPU they cost no memory of their own."""
    walk = _Walk(module, module.entry.name, entry=True)
    span, shares, pinned, params, _ = walk.ranges()
    sizes = {b.id: b.bytes for b in walk.buffers}
    outs = pinned - params
    housed = cpu_allocations(span, shares, {b: sizes[b] for b in outs}, walk._defined_positions(outs), sizes,
                             len(walk.comp.instructions), walk._operand_buffers(), walk._post_order())
    return {walk.buffers[b] for b in housed}


def backend_of(module: HloModule) -> str:
    """"gpu" where the module launches GPU kernels (cuBLAS / cuDNN calls, Triton fusions, GPU
    backend configs), "cpu" otherwise."""
    for comp in module.computations.values():
        for inst in comp.instructions:
            if inst.custom_call_target.startswith(("__cublas", "__cudnn", "__triton")):
                return "gpu"
            raw = inst.attrs.get("backend_config", "")
            if "operation_queue_id" in raw or "fusion_backend_config" in raw:
                return "gpu"
    return "cpu"


def _named_last(b) -> tuple:
    """A buffer's key, comparable across kinds: the applied step (exporters.jax_applied) names
    buffers ``(node, output)`` and allocations ``("stack", leaf)`` / ``("allocation", copy)``; two of
    different kinds tied on size and position compared an int with a str (flax_linen's eager-order plans
    at the bench's full size failed to apply on it). Named keys after the others; ints as before."""
    return isinstance(b, tuple) and isinstance(b[0], str), b


def cpu_allocations(span: dict[int, tuple[int, int]], shares: dict[int, list[int]], outputs: dict[int, int],
                     out_at: dict[int, int], sizes: dict[int, int], end: int,
                     operands: dict[int, list[int]], post_order: dict[int, int]) -> set[int]:
    """The temporaries XLA's CPU buffer assignment houses in the outputs' allocations.

    XLA gives each output its own allocation (an output is live from its definition to the end)
    and, taking buffers largest first (ties: the earlier defined first), puts a temporary into an
    allocation it fits in when its live range overlaps nothing already there (touching only where
    it writes into a dying operand's memory), trying its operands' allocations first, then the
    others smallest first. The rest go to the heap simulator; this walk takes their live peak
    for its size (a lower bound: the packing may leave gaps). Returns the housed temporaries."""
    allocations = sorted(outputs, key=lambda b: (-outputs[b], post_order[b], _named_last(b)))  # creation order
    held: dict[int, list[int]] = {a: [] for a in allocations}
    home: dict[int, int] = {a: a for a in allocations}
    ranges = dict(span)
    ranges.update((a, (out_at[a], end)) for a in allocations)

    def fits(b: int, a: int) -> bool:
        first, last = ranges[b]
        for v in [a, *held[a]]:
            s, e = ranges[v]
            if last < s or first > e:
                continue
            if (e == first and v in shares.get(b, ())) or (last == s and b in shares.get(v, ())):
                continue
            return False
        return True

    housed: set[int] = set()
    for b in sorted(span, key=lambda b: (-sizes[b], post_order[b], _named_last(b))):
        if not sizes[b]:
            continue
        tried = [home[o] for o in operands.get(b, []) if o in home]
        for a in [*dict.fromkeys(tried), *reversed(allocations)]:
            if sizes[b] <= outputs[a] and fits(b, a):
                held[a].append(b)
                home[b] = a
                housed.add(b)
                break
    return housed


class _Walk:
    """One computation's liveness walk. The entry's parameters and outputs are pinned; a nested
    computation's parameters are its caller's buffers, and what it passes out through its root is
    written into its caller's buffers (XLA colocates them), so neither is counted inside."""

    def __init__(self, module: HloModule, computation: str, entry: bool, depth: int = 0):
        self.module = module
        self.comp = module.computations[computation]
        self.entry = entry
        self.depth = depth
        self.buffers: list[Buffer] = []
        self.of: dict[str, dict[tuple[int, ...], int]] = {}  # instruction -> shape index -> buffer id
        self._assign()

    # -- which buffer each instruction's leaves live in ------------------------------------------

    def _new(self, inst: Instruction, index: tuple[int, ...], nbytes: int, kind: str) -> int:
        self.buffers.append(_buffer(inst, len(self.buffers), index, nbytes, kind))
        return len(self.buffers) - 1

    def _leaves_of(self, name: str, prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], int]:
        n = len(prefix)
        return {i[n:]: b for i, b in self.of.get(name, {}).items() if i[:n] == prefix}

    def _assign(self) -> None:
        for inst in self.comp.instructions:
            ids: dict[tuple[int, ...], int] = {}
            op = inst.opcode
            if op == "parameter":
                kind = "parameter" if self.entry else "caller"
                for idx, leaf in zip(inst.shape.index, inst.shape.leaves):
                    ids[idx] = self._new(inst, idx, leaf.bytes if self.entry else 0, kind)
            elif op in ("bitcast", "opt-barrier", "optimization-barrier", "while") and inst.operands:
                ids = dict(self._leaves_of(inst.operands[0]))
            elif op == "get-tuple-element":
                ids = self._leaves_of(inst.operands[0], (int(inst.attrs.get("index", "0")),))
            elif op == "tuple":
                for k, operand in enumerate(inst.operands):
                    for idx, b in self._leaves_of(operand).items():
                        ids[(k,) + idx] = b
            elif op in NO_BUFFER:
                pass
            else:
                aliased = in_place_pairs(self.module, inst)
                for idx, leaf in zip(inst.shape.index, inst.shape.leaves):
                    if idx in aliased:
                        number, operand_index = aliased[idx]
                        if number < len(inst.operands):
                            b = self._leaves_of(inst.operands[number]).get(operand_index)
                            if b is not None:
                                ids[idx] = b
                                continue
                    ids[idx] = self._new(inst, idx, leaf.bytes, "temp")
            self.of[inst.name] = ids

    # -- the walk --------------------------------------------------------------------------------

    def _uses(self, inst: Instruction) -> set[int]:
        if inst.opcode in ALIASES:
            return set()
        used: set[int] = set()
        for operand in inst.operands:
            used.update(self.of.get(operand, {}).values())
        return used

    def ranges(self) -> tuple[dict[int, tuple[int, int]], dict[int, list[int]], set[int], set[int],
                              list[CompiledMemory | None]]:
        """Each temporary's live range ``(first, last)`` in schedule positions; ``{new: donors}``
        where an elementwise kernel may write ``new`` into a dying operand's memory; the pinned output
        buffers; the parameters; and at each position the walk of a body run there, at its peak."""
        schedule = self.comp.instructions
        pinned = set(self.of.get(self.comp.root.name, {}).values())
        params = {b.id for b in self.buffers if b.kind in ("parameter", "caller")}
        last_use: dict[int, int] = {}
        defined_at: dict[int, int] = {}
        for pos, inst in enumerate(schedule):
            for b in self.of[inst.name].values():
                defined_at.setdefault(b, pos)
            for b in self._uses(inst):
                last_use[b] = pos
        span: dict[int, tuple[int, int]] = {}
        shares: dict[int, list[int]] = {}
        nested: list[CompiledMemory | None] = []
        for pos, inst in enumerate(schedule):
            nested.append(self._nested_peak(inst))
            new = [b for b in dict.fromkeys(self.of[inst.name].values())
                   if defined_at.get(b) == pos and b not in params and b not in pinned]
            dying = {b for b in self._uses(inst) if last_use.get(b) == pos and b not in params and b not in pinned}
            for b in new:
                span[b] = (pos, last_use.get(b, pos))
                donors = self._donors(inst, b, dying)
                if donors:
                    shares[b] = donors
        return span, shares, pinned, params, nested

    def fixed(self) -> list[Buffer]:
        """The entry's parameters and outputs (an output that is a parameter once), and the
        output tuple's pointer tables: what is live throughout."""
        pinned = set(self.of.get(self.comp.root.name, {}).values())
        out = [replace(b, kind="output") if b.id in pinned and b.kind == "temp" else b
               for b in self.buffers if b.bytes and (b.id in pinned or b.kind == "parameter")]
        tables = POINTER_BYTES * sum(self.comp.root.shape.tuple_tables)
        if tables:
            out.append(_buffer(self.comp.root, len(self.buffers), (), tables, "output"))
        return out

    def result(self) -> CompiledMemory:
        """The walk's peak: outputs own their memory from the start (XLA's GPU figure); a nested
        body's peak is added at its call, and where the peak falls there it is located at the
        body's own peak, with the body's live temporaries."""
        schedule = self.comp.instructions
        span, shares, pinned, params, nested = self.ranges()
        sizes = {b.id: b.bytes for b in self.buffers}
        fixed = self.fixed() if self.entry else []
        delta = [0] * (len(schedule) + 1)
        for b, (first, last) in span.items():
            delta[first] += sizes[b]
            delta[last + 1] -= sizes[b]
        taken: set[int] = set()
        for b, donors in shares.items():  # the two occupy one buffer where they meet
            donor = next((d for d in donors if d not in taken), None)
            if donor is not None:
                taken.add(donor)
                first = span[b][0]
                delta[first] -= sizes[b]
                delta[first + 1] += sizes[b]
        base = sum(b.bytes for b in fixed)
        current, timeline = 0, []
        for pos in range(len(schedule)):
            current += delta[pos]
            timeline.append(base + current + (nested[pos].temp_peak_bytes if nested[pos] else 0))
        pos = max(range(len(timeline)), key=timeline.__getitem__) if timeline else 0
        peak = timeline[pos] if timeline else base
        live = fixed + [self.buffers[b] for b, (first, last) in span.items() if first <= pos <= last and sizes[b]]
        where = nested[pos] if nested[pos] and nested[pos].temp_peak_bytes else None
        if where is not None:  # the peak falls inside a body run here
            inst = schedule[pos]
            live += where.live
            called = where.peak_context[0].computation if where.peak_context else where.peak_computation
            call = Call(inst.name, self.comp.name, _runs(inst, called), _trip_count(inst))
            where = replace(where, peak_context=[call, *where.peak_context])
        live.sort(key=lambda b: (-b.bytes, b.kind, b.instruction, b.index))
        return CompiledMemory(
            peak_bytes=max(peak, base), peak_index=where.peak_index if where else pos,
            peak_instruction=where.peak_instruction if where else schedule[pos].name if schedule else "",
            parameter_bytes=sum(b.bytes for b in fixed if b.kind == "parameter"),
            output_bytes=sum(b.bytes for b in fixed if b.kind == "output"), temp_peak_bytes=max(peak - base, 0),
            live=live, timeline=timeline, peak_computation=where.peak_computation if where else self.comp.name,
            peak_context=where.peak_context if where else [], peak_step=pos)

    def _post_order(self) -> dict[int, int]:
        """buffer -> its instruction's position in a post order from the root (XLA breaks ties
        between buffers of one size by it)."""
        order = {name: k for k, name in enumerate(self.comp.post_order)}
        out: dict[int, int] = {}
        for inst in self.comp.instructions:
            for b in self.of[inst.name].values():
                out.setdefault(b, order.get(inst.name, 0))
        return out

    def _operand_buffers(self) -> dict[int, list[int]]:
        """buffer -> the buffers its instruction reads (XLA first tries those allocations)."""
        out: dict[int, list[int]] = {}
        for inst in self.comp.instructions:
            used = sorted(self._uses(inst))
            for b in self.of[inst.name].values():
                out.setdefault(b, used)
        return out

    def _defined_positions(self, ids: set[int]) -> dict[int, int]:
        out = {}
        for pos, inst in enumerate(self.comp.instructions):
            for b in self.of[inst.name].values():
                if b in ids:
                    out.setdefault(b, pos)
        return out

    def _donors(self, inst: Instruction, new: int, dying: set[int]) -> list[int]:
        """The dying operand buffers of the same shape that the elementwise kernel may write into."""
        if not dying or not may_write_into_operand(self.module, inst):
            return []
        out = self.buffers[new]
        leaf = inst.shape.leaf_at(out.index)
        found = []
        for operand in inst.operands:
            view = self.comp.by_name.get(operand)
            if view is None or leaf is None:
                continue
            for idx, b in self.of.get(operand, {}).items():
                vleaf = view.shape.leaf_at(idx)
                if (b in dying and b not in found and self.buffers[b].kind == "temp" and vleaf is not None
                        and vleaf.dims == leaf.dims and vleaf.dtype == leaf.dtype):
                    found.append(b)
        return found

    def _nested_peak(self, inst: Instruction) -> CompiledMemory | None:
        """The walk of the while / conditional / call body that allocates the most beyond its
        operands, at its own peak."""
        if inst.opcode not in ("while", "conditional", "call") or self.depth > 16:
            return None
        walks = [_Walk(self.module, name, entry=False, depth=self.depth + 1).result()
                 for name in inst.called if name in self.module.computations]
        return max(walks, key=lambda w: w.temp_peak_bytes, default=None)


def may_write_into_operand(module: HloModule, inst: Instruction) -> bool:
    """XLA lets an elementwise kernel (a loop or input fusion, or a lone elementwise op) write its
    output into the buffer of an operand of the same shape whose last use it is."""
    if inst.opcode == "fusion":
        return inst.fusion_kind in ("kLoop", "kInput")
    return inst.opcode in ELEMENTWISE


@dataclass(frozen=True)
class Reference:
    """XLA's own figure for a compiled module, and which figure it is."""

    bytes: int
    what: str  # "peak_memory_in_bytes" or "temp + arguments + outputs - aliases"


def xla_reference(stats, backend: str) -> Reference:
    """XLA's figure for ``compiled.memory_analysis()`` (or a dict of its fields): its own peak on
    GPU / TPU; on CPU, which computes none (its peak equals arguments + outputs), the sum of the
    allocations it makes: temp + arguments + outputs - aliases."""
    get = stats.get if isinstance(stats, dict) else lambda k: getattr(stats, k)
    if backend != "cpu" and get("peak_memory_in_bytes"):
        return Reference(int(get("peak_memory_in_bytes")), "peak_memory_in_bytes")
    total = (get("temp_size_in_bytes") + get("argument_size_in_bytes") + get("output_size_in_bytes")
             - get("alias_size_in_bytes"))
    return Reference(int(total), "temp + arguments + outputs - aliases")
