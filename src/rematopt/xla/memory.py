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
760,320 B). :func:`compiled_memory` reports both; :mod:`rematopt.xla.assignment` makes the heap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .assignment import ELEMENTWISE, assign, in_place_pairs
from .hlo import POINTER_BYTES, HloModule, Instruction

ALIASES = frozenset({"bitcast", "get-tuple-element", "tuple", "opt-barrier", "optimization-barrier"})
# Ops that produce no buffer of their own in device memory.
NO_BUFFER = frozenset({"constant", "after-all", "partition-id", "replica-id"})


@dataclass(frozen=True)
class Buffer:
    """One array XLA allocates: written by ``instruction`` at shape index ``index``."""

    id: int
    instruction: str
    index: tuple[int, ...]
    bytes: int
    kind: str  # "parameter", "output", "temp"; "caller" for a nested computation's parameters
    op_name: str = ""
    source: str = ""  # "file:line" of the innermost frame, where the metadata names one


@dataclass
class CompiledMemory:
    """The walk's result. ``peak_bytes`` is the figure to set beside XLA's own
    (:func:`xla_reference`): on GPU / TPU the live peak, on CPU the allocations XLA makes
    (parameters + outputs + ``heap_bytes``). ``heap_bytes`` (CPU only) is XLA's
    ``temp_size_in_bytes``: the heap its buffer assignment packs the temporaries into, gaps
    included, and the tuple tables after it (:mod:`rematopt.xla.assignment`). ``live_peak_bytes``
    is the most memory live at once, what a device's allocator would hold: on GPU / TPU
    ``peak_bytes``; on CPU parameters + outputs + tuple tables + the heap's temporaries at their
    live peak (the heap without its gaps, over XLA's own live ranges, loop bodies included).

    ``temp_peak_bytes``, ``peak_index`` (a position in ``schedule``), ``peak_instruction`` and
    ``live`` (what is live there, largest first) locate the walk's own peak over the entry
    computation, where a loop's body adds its peak at the loop (an upper bound there: gpt_scan's
    walk reads 5.4% over its live peak)."""

    peak_bytes: int
    peak_index: int
    peak_instruction: str
    parameter_bytes: int
    output_bytes: int
    temp_peak_bytes: int
    live: list[Buffer]
    timeline: list[int] = field(default_factory=list)  # live bytes after each schedule step's allocation
    live_peak_bytes: int = 0
    heap_bytes: int | None = None

    def summary(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes, "live_peak_bytes": self.live_peak_bytes, "heap_bytes": self.heap_bytes,
            "peak_index": self.peak_index,
            "peak_instruction": self.peak_instruction, "parameter_bytes": self.parameter_bytes,
            "output_bytes": self.output_bytes, "temp_peak_bytes": self.temp_peak_bytes,
            "live": [{"instruction": b.instruction, "index": list(b.index), "bytes": b.bytes, "kind": b.kind,
                      "op_name": b.op_name, "source": b.source} for b in self.live],
        }


def compiled_memory(module: HloModule, backend: str | None = None) -> CompiledMemory:
    """Peak memory of the module's entry schedule, and what is live at the peak, counted as XLA
    counts it on ``backend`` ("cpu", "gpu", "tpu"; by default the one the module was compiled for,
    :func:`backend_of`); on CPU, also the heap XLA packs the temporaries into."""
    backend = backend or backend_of(module)
    walk = _Walk(module, module.entry.name, entry=True).result("allocations" if backend == "cpu" else "pinned")
    if backend != "cpu":
        return replace(walk, live_peak_bytes=walk.peak_bytes)
    done = assign(module)
    fixed = walk.parameter_bytes + walk.output_bytes
    return replace(walk, live_peak_bytes=fixed + done.heap.live_peak + done.table_bytes, heap_bytes=done.temp_bytes,
                   peak_bytes=fixed + done.temp_bytes)


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
    allocations = sorted(outputs, key=lambda b: (-outputs[b], post_order[b], b))  # creation order
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
    for b in sorted(span, key=lambda b: (-sizes[b], post_order[b], b)):
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
        meta = inst.metadata
        source = f"{meta.source_file}:{meta.source_line}" if meta.source_file else ""
        self.buffers.append(Buffer(len(self.buffers), inst.name, index, nbytes, kind, meta.op_name, source))
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

    def ranges(self) -> tuple[dict[int, tuple[int, int]], dict[int, list[int]], set[int], set[int], list[int]]:
        """Each temporary's live range ``(first, last)`` in schedule positions; ``{new: donors}``
        where an elementwise kernel may write ``new`` into a dying operand's memory; the pinned output buffers; the parameters; and what nested bodies
        add at each position."""
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
        nested = []
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

    def result(self, outputs: str = "pinned") -> CompiledMemory:
        """``outputs="pinned"``: outputs own their memory from the start (XLA's GPU figure);
        ``"allocations"``: XLA's CPU accounting, where a temporary may live in an output's allocation
        before the output is written (see :func:`cpu_allocations`); ``"defined"``: each output
        from the kernel writing it (a graph's accounting, where an output is a value like any)."""
        schedule = self.comp.instructions
        span, shares, pinned, params, nested = self.ranges()
        sizes = {b.id: b.bytes for b in self.buffers}
        param_bytes = sum(sizes[b] for b in params) if self.entry else 0
        out_bytes = sum(sizes[b] for b in pinned if b not in params) if self.entry else 0
        if self.entry and self.comp.root.shape.is_tuple:
            out_bytes += POINTER_BYTES * sum(self.comp.root.shape.tuple_tables)
        housed: set[int] = set()
        if outputs == "allocations" and self.entry:
            outs = pinned - params
            housed = cpu_allocations(span, shares, {b: sizes[b] for b in outs}, self._defined_positions(outs),
                                      sizes, len(schedule), self._operand_buffers(), self._post_order())
        delta = [0] * (len(schedule) + 1)
        for b, (first, last) in span.items():
            if b in housed:
                continue
            delta[first] += sizes[b]
            delta[last + 1] -= sizes[b]
        if outputs == "defined" and self.entry:  # each output from the kernel writing it
            at = self._defined_positions(pinned - params)
            for b, pos in at.items():
                delta[pos] += sizes[b]
            out_bytes -= sum(sizes[b] for b in at)
        taken: set[int] = set()
        for b, donors in shares.items():  # the two occupy one buffer where they meet
            donor = next((d for d in donors if d not in housed and d not in taken), None)
            if b not in housed and donor is not None:
                taken.add(donor)
                first = span[b][0]
                delta[first] -= sizes[b]
                delta[first + 1] += sizes[b]
        fixed = param_bytes + out_bytes
        current, timeline = 0, []
        for pos in range(len(schedule)):
            current += delta[pos]
            timeline.append(fixed + current + nested[pos])
        peak_pos = max(range(len(timeline)), key=timeline.__getitem__) if timeline else 0
        peak = timeline[peak_pos] if timeline else fixed
        live_ids = {b for b, (first, last) in span.items() if first <= peak_pos <= last and b not in housed}
        if self.entry:
            live_ids |= pinned | params
        shown = []
        for b in live_ids:
            buf = self.buffers[b]
            if buf.bytes:
                kind = "output" if b in pinned and buf.kind == "temp" else buf.kind
                shown.append(Buffer(buf.id, buf.instruction, buf.index, buf.bytes, kind, buf.op_name, buf.source))
        shown.sort(key=lambda b: (-b.bytes, b.id))
        return CompiledMemory(
            peak_bytes=max(peak, fixed), peak_index=peak_pos,
            peak_instruction=schedule[peak_pos].name if schedule else "",
            parameter_bytes=param_bytes, output_bytes=out_bytes, temp_peak_bytes=max(peak - fixed, 0),
            live=shown, timeline=timeline)

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

    def _nested_peak(self, inst: Instruction) -> int:
        """What a while / conditional / call body allocates beyond its operands, at its own peak."""
        if inst.opcode not in ("while", "conditional", "call") or self.depth > 16:
            return 0
        peaks = [0]
        for name in inst.called:
            if name in self.module.computations:
                peaks.append(_Walk(self.module, name, entry=False, depth=self.depth + 1).result().temp_peak_bytes)
        return max(peaks)


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
