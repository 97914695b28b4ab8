"""XLA's buffer assignment of a scheduled module, as its CPU backend makes it: what
``compiled.memory_analysis()`` sums into ``temp_size_in_bytes``.

XLA's CPU figure is not a peak but the size of the allocations its buffer assignment makes, in
three steps reproduced here (the live peak, where it falls and what is live there are read from
the heap's replay, :func:`rematopt.xla.memory.compiled_memory`):

1. **Values and buffers.** Every array (and tuple index table) an instruction of the entry
   computation or of a computation it runs in sequence (a while's condition and body, a call, a
   conditional's branches) defines is a value; values that must share memory form one buffer
   (those meeting in a while loop's state, an in-place op's output and operand). Fusion bodies and
   reducers own nothing here.
2. **Live ranges** over the flattened schedule (a while's condition, then its body, are placed
   before the loop instruction): from the definition to the last use or the last place the value
   is seen; a root's values live to their computation's end; entry parameters and outputs to the
   end; a loop's initial value ends where the body starts; in one buffer, each value ends where
   the next begins.
3. **Allocations.** Buffers are taken largest first. Parameters, constants and tuple tables get
   their own allocations, each output its own, and a temporary goes into an output's allocation
   it fits in when their live ranges do not meet (:func:`_interferes`); the remaining temporaries
   are replayed in schedule order (an elementwise kernel may write into an operand that dies
   there) and packed into one heap by :func:`rematopt.xla.heap.best_packing`.

``temp_size_in_bytes`` counts every allocation that is neither a parameter, an output, a constant
nor thread-local: the heap and the temporary tuple tables, which XLA lays one after another in one
allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

from .heap import Interval, Packing, best_packing
from .hlo import POINTER_BYTES, Computation, HloError, HloModule, Instruction

# CPU XLA's buffer alignment: every offset in the preallocated temp of the 22 CPU steps of
# tests/xla_steps.py (1,207 values not a multiple of 64 bytes in size among them) is a multiple of
# 64, and 64 is their greatest common divisor (jax 0.10.2, XLA_FLAGS=--xla_dump_to buffer-assignment).
CPU_ALIGNMENT = 64

# Ops whose output is their operand's values (XLA's dataflow defines no value for them).
FORWARD = frozenset({"bitcast", "opt-barrier", "optimization-barrier", "add-dependency", "domain"})
ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert", "cosine",
    "divide", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one",
    "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real",
    "remainder", "round-nearest-afz", "round-nearest-even", "rsqrt", "select", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh",
    "xor", "erf", "bitcast-convert", "copy", "cosine", "reduce-precision", "stochastic-convert",
})
IN_PLACE = frozenset({"dynamic-update-slice", "scatter"})


@dataclass(frozen=True)
class Value:
    """One array or tuple table an instruction defines."""

    id: int
    instruction: str
    index: tuple[int, ...]
    bytes: int
    is_tuple: bool


@dataclass(frozen=True)
class Assignment:
    """What XLA's buffer assignment allocates for the temporaries. ``temp_bytes`` is XLA's
    ``temp_size_in_bytes``: the heap (the temporaries' packing) followed by the tuple tables'
    allocations (``table_bytes`` in all), each at the next aligned offset, as XLA combines its
    temporary allocations into one; ``offsets`` places each value there; ``in_outputs`` maps each
    temporary housed in an output's allocation to that output's value.

    Where the heap is fullest: ``intervals`` are the heap's temporaries (each keyed by its value)
    on the heap simulator's clock, ``ticks`` maps each tick of that clock to a position in
    ``schedule`` (the flattened schedule of step 2), ``callers`` each computation run in sequence
    to the instruction that runs it, ``tables`` each temporary tuple table's value to its bytes and
    ``ranges`` each value to its live range ``(first, last)`` in ``schedule``."""

    temp_bytes: int
    heap: Packing
    table_bytes: int
    values: list[Value]
    offsets: dict[int, int]
    in_outputs: dict[int, int]
    intervals: list[Interval]
    ticks: list[int]
    schedule: list[Instruction]
    callers: dict[str, str]
    tables: dict[int, int]
    ranges: dict[int, tuple[int, int]]


def in_place_pairs(module: HloModule, inst: Instruction) -> dict[tuple[int, ...], tuple[int, tuple[int, ...]]]:
    """Output index -> (operand number, operand index) for the outputs XLA writes in place:
    ``output_to_operand_aliasing``, dynamic-update-slice and scatter, alone or as a fusion's root
    (through bitcasts) over a fusion parameter."""
    pairs = dict(inst.output_operand_aliasing)
    if inst.opcode in IN_PLACE:
        pairs.setdefault((), (0, ()))
    elif inst.opcode == "fusion" and inst.called:
        fused = module.computations.get(inst.called[0])
        if fused is not None:
            roots = [fused.root]
            if fused.root.opcode == "tuple":
                roots = [fused.by_name[o] for o in fused.root.operands]
            for k, root in enumerate(roots):
                target = root
                while target.opcode == "bitcast" and target.operands:
                    target = fused.by_name[target.operands[0]]
                if target.opcode in IN_PLACE and target.operands:
                    src = fused.by_name.get(target.operands[0])
                    if src is not None and src.opcode == "parameter":
                        idx = (k,) if fused.root.opcode == "tuple" else ()
                        pairs.setdefault(idx, (src.parameter_number, ()))
    return pairs


def _indices(inst: Instruction) -> list[tuple[tuple[int, ...], int, bool]]:
    """(shape index, bytes, is a tuple table) for every array and tuple table of the output."""
    leaves = list(zip(inst.shape.index, inst.shape.leaves))
    arity = {(): inst.shape.tuple_arity or 0} if inst.shape.is_tuple else {}
    for idx, _ in leaves:  # nested tuples: their arity from the indices below them
        for n in range(1, len(idx)):
            arity[idx[:n]] = max(arity.get(idx[:n], 0), idx[n] + 1)
    out = [(idx, POINTER_BYTES * n, True) for idx, n in sorted(arity.items())]
    return out + [(idx, leaf.bytes, False) for idx, leaf in leaves]


class _Module:
    """Values, buffers and live ranges of a scheduled module (steps 1 and 2 of the module doc)."""

    def __init__(self, module: HloModule):
        self.module = module
        self.values: list[Value] = []
        self.defined: dict[tuple[str, tuple[int, ...]], int] = {}
        self.sets: dict[str, dict[tuple[int, ...], list[int]]] = {}
        self.inst: dict[str, Instruction] = {}
        self.time: dict[str, int] = {}
        self.span: dict[str, tuple[int, int]] = {}
        self.flat: list[Instruction] = []
        self.callers: dict[str, str] = {}  # computation run in sequence -> the instruction running it
        self.param_sets: dict[str, list[dict[tuple[int, ...], list[int]]]] = {}  # computation -> per parameter
        self.constant: set[int] = set()
        self.entry_param: set[int] = set()
        self.variant: dict[str, set[tuple[int, ...]]] = {}  # while -> the indices its body changes
        self.loop_joins: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # (while, index) -> its values
        self._flatten(module.entry)
        self._dataflow()
        self.parent = list(range(len(self.values)))
        self._merge_buffers()
        self.outputs = {v for vs in self.sets.get(module.entry.root.name, {}).values() for v in vs}
        self.ranges = self._live_ranges()

    # -- step 1: the flattened schedule, values and their sets ----------------------------------

    def _sequential(self, inst: Instruction) -> list[str]:
        if inst.opcode == "while":
            return [inst.callee("condition"), inst.callee("body")]
        if inst.opcode in ("call", "conditional"):
            return list(inst.called)
        return []

    def _flatten(self, comp: Computation) -> None:
        if comp.name in self.span:
            return
        begin = len(self.flat)
        self.span[comp.name] = (begin, begin)  # guards recursion
        for inst in comp.instructions:
            for name in self._sequential(inst):
                if name in self.module.computations:
                    self.callers.setdefault(name, inst.name)
                    self._flatten(self.module.computations[name])
            if inst.name in self.time:
                raise HloError(f"instruction name {inst.name} repeats across computations "
                               "(XLA names each instruction of a module once)")
            self.time[inst.name] = len(self.flat)
            self.inst[inst.name] = inst
            self.flat.append(inst)
        self.span[comp.name] = (begin, len(self.flat))

    def _define(self, inst: Instruction, idx: tuple[int, ...], nbytes: int, is_tuple: bool) -> int:
        key = (inst.name, idx)
        if key not in self.defined:
            self.defined[key] = len(self.values)
            self.values.append(Value(len(self.values), inst.name, idx, nbytes, is_tuple))
        return self.defined[key]

    def _define_all(self, inst: Instruction, top_only: bool = False) -> dict[tuple[int, ...], list[int]]:
        return {idx: [self._define(inst, idx, n, t)] for idx, n, t in _indices(inst) if idx == () or not top_only}

    def _of(self, name: str, prefix: tuple[int, ...] = ()) -> dict[tuple[int, ...], list[int]]:
        n = len(prefix)
        return {i[n:]: v for i, v in self.sets.get(name, {}).items() if i[:n] == prefix}

    @staticmethod
    def _union(*sets: dict[tuple[int, ...], list[int]]) -> dict[tuple[int, ...], list[int]]:
        out: dict[tuple[int, ...], list[int]] = {}
        for s in sets:
            for idx, vs in s.items():
                out.setdefault(idx, [])
                out[idx] += [v for v in vs if v not in out[idx]]
        return out

    def _dataflow(self) -> None:
        """Value sets of every position, to a fixed point (a loop inside a loop body is revisited
        as the outer loop learns which of its indices change)."""
        for _ in range(8):
            before = {k: {i: list(v) for i, v in s.items()} for k, s in self.sets.items()}
            self._visit(self.module.entry)
            if before == self.sets:
                return

    def _visit(self, comp: Computation) -> None:
        entry = comp.name == self.module.entry_name
        for inst in comp.instructions:
            op = inst.opcode
            if op == "parameter":
                if entry:
                    sets = self._define_all(inst)
                    self.entry_param.update(v for vs in sets.values() for v in vs)
                else:
                    given = self.param_sets.get(comp.name, [])
                    k = inst.parameter_number or 0
                    sets = given[k] if k < len(given) else self._define_all(inst)
            elif op == "constant":
                sets = self._define_all(inst)
                self.constant.update(v for vs in sets.values() for v in vs)
            elif op == "get-tuple-element":
                sets = self._of(inst.operands[0], (int(inst.attrs.get("index", "0")),))
            elif op == "tuple":
                sets = self._define_all(inst, top_only=True)
                for k, operand in enumerate(inst.operands):
                    for idx, vs in self._of(operand).items():
                        sets[(k,) + idx] = list(vs)
            elif op in FORWARD and inst.operands:
                sets = self._of(inst.operands[0])
            elif op == "while":
                sets = self._loop(inst)
            elif op == "call" and inst.called and inst.called[0] in self.module.computations:
                callee = self.module.computations[inst.called[0]]
                self.param_sets[callee.name] = [self._of(o) for o in inst.operands]
                self._visit(callee)
                sets = self._of(callee.root.name)
            elif op == "conditional":
                branches = [self.module.computations[n] for n in inst.called if n in self.module.computations]
                for k, b in enumerate(branches):
                    self.param_sets[b.name] = [self._of(inst.operands[k + 1])] if k + 1 < len(inst.operands) else []
                    self._visit(b)
                sets = self._union(*[self._of(b.root.name) for b in branches])
            elif op == "copy" and inst.shape.is_tuple:
                sets = self._define_all(inst, top_only=True)
                for idx, vs in self._of(inst.operands[0]).items():
                    sets.setdefault(idx, list(vs))
            else:
                sets = self._define_all(inst)
            self.sets[inst.name] = sets

    def _loop(self, inst: Instruction) -> dict[tuple[int, ...], list[int]]:
        """A while loop in SSA form, as XLA's dataflow has it: where the body returns another value
        than it was given, the body's and the condition's parameters and the loop's output each
        hold a value of their own there (a phi), one buffer with what enters and what the body
        returns; where it passes its parameter through, every one of them holds what entered."""
        cond, body = (self.module.computations.get(n) for n in self._sequential(inst))
        init = self._of(inst.operands[0])
        variant = self.variant.setdefault(inst.name, set())
        while True:
            states = {}
            for holder in [c.parameters[0] for c in (cond, body) if c is not None and c.parameters] + [inst]:
                states[holder.name] = {idx: [self._define(holder, idx, n, t)] if idx in variant else init.get(idx, [])
                                       for idx, n, t in _indices(inst)}
            for c in (cond, body):
                if c is not None and c.parameters:
                    self.param_sets[c.name] = [states[c.parameters[0].name]]
                    self._visit(c)
            if body is None or not body.parameters:
                break
            given, returned = states[body.parameters[0].name], self._of(body.root.name)
            more = {idx for idx, vs in returned.items() if idx not in variant and vs != given.get(idx)}
            if not more:
                break
            variant |= more
        for idx in variant:
            back = self._of(body.root.name).get(idx, []) if body else []
            held = [init.get(idx, []), *(s.get(idx, []) for s in states.values()), back]
            self.loop_joins[(inst.name, idx)] = [v for vs in held for v in vs]
        return states[inst.name]

    # -- buffers -----------------------------------------------------------------------------------

    def find(self, v: int) -> int:
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def _join(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)

    def _merge_buffers(self) -> None:
        for values in self.loop_joins.values():
            for v in values[1:]:
                self._join(values[0], v)
        for name, sets in self.sets.items():
            for vs in sets.values():
                for v in vs[1:]:
                    self._join(vs[0], v)
            inst = self.inst[name]
            for out_idx, (number, operand_idx) in in_place_pairs(self.module, inst).items():
                mine = self.defined.get((name, out_idx))
                if mine is None or number >= len(inst.operands):
                    continue
                for v in self.sets.get(inst.operands[number], {}).get(operand_idx, []):
                    self._join(mine, v)

    def buffers(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for v in range(len(self.values)):
            out.setdefault(self.find(v), []).append(v)
        return out

    # -- step 2: live ranges -------------------------------------------------------------------------

    def _live_ranges(self) -> dict[int, tuple[int, int, str, tuple[int, ...]]]:
        """value -> (start, end, end position's instruction, its index)."""
        end_of = len(self.flat)
        positions: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        for name in self.time:
            for idx, vs in self.sets.get(name, {}).items():
                for v in vs:
                    positions.setdefault(v, []).append((name, idx))
        last_use: dict[int, int] = {}
        for name, t in self.time.items():
            inst = self.inst[name]
            if inst.opcode in ("tuple", "call"):
                continue
            when = t
            if inst.opcode == "while":
                body = self._sequential(inst)[1]
                params = [i for i in self.module.computations[body].instructions if i.opcode == "parameter"]
                when = self.time.get(params[0].name, t) if params else t
            for operand in inst.operands[:1] if inst.opcode == "get-tuple-element" else inst.operands:
                for idx, vs in self.sets.get(operand, {}).items():
                    if inst.opcode == "get-tuple-element" and idx:
                        continue
                    for v in vs:
                        last_use[v] = max(last_use.get(v, -1), when)
        ranges = {}
        for value in self.values:
            inst = self.inst[value.instruction]
            comp = inst.computation
            t = self.time[inst.name]
            start = self.span[comp][0] if inst.opcode == "parameter" else t
            end = self.span[comp][1] if inst.is_root else t
            at = (inst.name, value.index)
            for name, idx in positions.get(value.id, []):
                if name == inst.name and idx == value.index:
                    continue
                p = self.inst[name]
                when = self.span[p.computation][1] if p.is_root else self.time[name]
                if when > end:
                    end, at = when, (name, idx)
            if value.id in self.entry_param and not self._aliased_parameter(inst, value.index):
                end = end_of
            else:
                end = max(end, last_use.get(value.id, -1))
            ranges[value.id] = (start, end, at[0], at[1])
        for members in self.buffers().values():  # in one buffer each value ends where the next starts
            chain = sorted(members, key=lambda v: (ranges[v][0], ranges[v][1], v))
            for a, b in zip(chain, chain[1:]):
                sa, ea, *pa = ranges[a]
                sb, eb, *pb = ranges[b]
                ranges[b] = (sb, max(ea, eb), *pb)
                ranges[a] = (sa, min(ea, sb), *pa)
        return ranges

    def _aliased_parameter(self, inst: Instruction, index: tuple[int, ...]) -> bool:
        return any(p == inst.parameter_number and i == index for p, i, _ in self.module.input_output_alias.values())

    def lives_out(self, members: list[int]) -> bool:
        return any(v in self.outputs for v in members)


# -- CanShareOperandBufferWithUser ------------------------------------------------------------------

def _elementwise_uses(fused: Computation, param: Instruction) -> bool:
    """Every instruction reached from ``param`` inside the fusion reads it elementwise (or tuples it)."""
    users: dict[str, list[Instruction]] = {}
    for i in fused.instructions:
        for o in dict.fromkeys(i.operands):
            users.setdefault(o, []).append(i)
    todo, seen = [param.name], set()
    while todo:
        name = todo.pop()
        for user in users.get(name, []):
            if user.opcode not in ELEMENTWISE and user.opcode != "tuple":
                return False
            if user.name not in seen:
                seen.add(user.name)
                todo.append(user.name)
    return True


def can_share(module: HloModule, operand: Instruction, operand_index: tuple[int, ...], user: Instruction,
              user_index: tuple[int, ...]) -> bool:
    """Whether XLA lets ``user`` write its output at ``user_index`` into the buffer of
    ``operand``'s output at ``operand_index`` (when that is the operand's last use): same dtype,
    dims and layout, and the user either writes it in place (dynamic-update-slice, scatter), reads
    it elementwise (a loop or input fusion whose every use of it is elementwise, a lone
    elementwise op), or adds a dot's result to it (an output fusion rooted at that add)."""
    if operand.opcode == "constant" or operand.name not in user.operands:
        return False
    a, b = operand.shape.leaf_at(operand_index), user.shape.leaf_at(user_index)
    if a is None or b is None or (a.dtype, a.dims, a.layout) != (b.dtype, b.dims, b.layout):
        return False
    number = user.operands.index(operand.name)
    pair = in_place_pairs(module, user).get(user_index)
    if pair is not None and pair == (number, operand_index):
        return True
    if user.opcode == "fusion" and user.called and user.called[0] in module.computations:
        fused = module.computations[user.called[0]]
        param = next((p for p in fused.instructions if p.opcode == "parameter" and p.parameter_number == number), None)
        if param is None:
            return False
        if user.fusion_kind in ("kLoop", "kInput"):
            return _elementwise_uses(fused, param)
        root = fused.root
        if user.fusion_kind == "kOutput" and root.opcode == "add":
            kinds = [fused.by_name[o].opcode if o in fused.by_name else "" for o in root.operands]
            if "dot" not in kinds and "convolution" not in kinds:
                return False
            other = 1 if kinds[0] in ("dot", "convolution") else 0
            uses = [(i, k) for i in fused.instructions for k, o in enumerate(i.operands) if o == param.name]
            return uses == [(root, other)]
        return _elementwise_uses(fused, param)
    if user.opcode in ("while", "conditional"):
        return True
    if user.opcode in IN_PLACE:
        return [k for k, o in enumerate(user.operands) if o == operand.name] == [0]
    return user.opcode in ELEMENTWISE


# -- step 3: allocations and the heap -------------------------------------------------------------

def _post_order(module: HloModule, flat: list[Instruction]) -> dict[str, int]:
    """instruction -> its position in a post order of its computation from the root (then the
    others, in order), the entry's first: XLA's tie-break between buffers of one size."""
    order: dict[str, int] = {}
    for cname in dict.fromkeys(i.computation for i in flat):
        for name in module.computations[cname].post_order:
            order.setdefault(name, len(order))
    return order


def _interferes(m: _Module, new: int, old: int) -> bool:
    """XLA's LiveRangeInterferes: two values may share an allocation when their live ranges do not
    meet, or meet only where the later one's instruction writes into the earlier one as it dies."""
    s1, e1, *_ = m.ranges[new]
    s2, e2, *_ = m.ranges[old]
    if s1 > e2 or s2 > e1:
        return False
    if e1 == s2:
        return not _shares_at_end(m, old, new)
    if e2 == s1:
        return not _shares_at_end(m, new, old)
    return True


def _shares_at_end(m: _Module, user_value: int, operand_value: int) -> bool:
    user = m.inst[m.values[user_value].instruction]
    _, _, at, at_index = m.ranges[operand_value]
    return user.opcode != "copy" and at in user.operands and can_share(
        m.module, m.inst[at], at_index, user, m.values[user_value].index)


def assign(module: HloModule, alignment: int = CPU_ALIGNMENT) -> Assignment:
    """Run XLA's buffer assignment over the scheduled module (see the module doc)."""
    m = _Module(module)
    buffers = m.buffers()
    size = {b: max(m.values[v].bytes for v in members) for b, members in buffers.items()}
    allocation, heap_buffers, tables = _output_allocations(m, buffers, size)
    intervals, ticks = _heap_intervals(m, buffers, heap_buffers, size)
    heap = best_packing(intervals, alignment)
    offsets = {intervals[k].key: off for k, off in heap.offsets.items()}
    end = heap.heap_bytes
    for b in sorted(tables, key=lambda b: min(m.ranges[v][0] for v in buffers[b])):  # one after another
        base = -(-end // alignment) * alignment
        offsets.update((v, base) for v in buffers[b])
        end = base + size[b]
    housed = {v: buffers[home][0] for b, home in allocation.items() if b != home for v in buffers[b]}
    return Assignment(temp_bytes=end, heap=heap, table_bytes=sum(size[b] for b in tables), values=m.values,
                      offsets=offsets, in_outputs=housed, intervals=intervals, ticks=ticks, schedule=m.flat,
                      callers=m.callers, tables={buffers[b][0]: size[b] for b in tables},
                      ranges={v: (first, last) for v, (first, last, *_) in m.ranges.items()})


def _output_allocations(m: _Module, buffers: dict[int, list[int]],
                        size: dict[int, int]) -> tuple[dict[int, int], list[int], list[int]]:
    """Take the buffers largest first (then outputs first, then by post order): each output gets
    an allocation of its own, and a temporary the first output allocation it fits in without
    interfering, trying its operands' allocations first and then the others smallest first. A
    tuple's table gets an allocation of its own, never shared. Returns ``{buffer: its allocation's
    first buffer}``, the temporaries left for the heap and the temporary tuple tables."""
    post = _post_order(m.module, m.flat)
    out_of = {b: m.lives_out(members) for b, members in buffers.items()}
    ranked = sorted(buffers, key=lambda b: (-size[b], not out_of[b],
                                            min(post.get(m.values[v].instruction, 0) for v in buffers[b]), b))
    allocation: dict[int, int] = {}
    held: dict[int, list[int]] = {}  # allocation -> its values
    outputs: list[int] = []  # reusable output allocations, largest first
    heap_buffers: list[int] = []
    tables: list[int] = []
    for b in ranked:
        members = buffers[b]
        if any(v in m.constant or v in m.entry_param for v in members):
            continue
        if any(m.values[v].is_tuple for v in members):
            if not out_of[b]:
                tables.append(b)
            continue

        def fits(a: int) -> bool:
            if size[b] > size[a] or (out_of[b] and size[b] != size[a]):
                return False
            for old in held[a]:
                for new in members:
                    if _interferes(m, new, old):
                        return False
                    new_inst = m.inst[m.values[new].instruction]
                    if new_inst.opcode == "copy" and m.values[old].instruction in new_inst.operands:
                        return False
            return True

        tried = []
        for v in members:
            if m.values[v].index == ():
                for operand in m.inst[m.values[v].instruction].operands:
                    for w in m.sets.get(operand, {}).get((), []):
                        a = allocation.get(m.find(w))
                        if a is not None and a not in tried:
                            tried.append(a)
        home = next((a for a in [*tried, *reversed(outputs)] if fits(a)), None)
        if home is None and not out_of[b]:
            heap_buffers.append(b)
            continue
        if home is None:
            home = b
            outputs.append(b)
            held[b] = []
        allocation[b] = home
        held[home].extend(members)
    return allocation, heap_buffers, tables


def _heap_intervals(m: _Module, buffers: dict[int, list[int]], heap_buffers: list[int],
                    size: dict[int, int]) -> tuple[list[Interval], list[int]]:
    """Replay the temporaries in schedule order as XLA's heap simulator does: at each time, the
    values defined there are allocated (or share the address of their buffer's first value, or of
    an operand value dying there that the instruction may write into), then the values ending there
    are freed; each event is one tick of the heap's clock. Returns the intervals and, for each
    tick, its position in the flattened schedule."""
    chosen = {v for b in heap_buffers for v in buffers[b] if size[b]}
    order = sorted(chosen, key=lambda v: (m.ranges[v][0], m.ranges[v][1], v))
    ends = {v: m.ranges[v][1] for v in chosen}
    defined: dict[int, list[int]] = {}
    freed: dict[int, list[int]] = {}
    for v in order:
        defined.setdefault(m.ranges[v][0], []).append(v)
        freed.setdefault(ends[v], []).append(v)
    ticks: list[int] = []  # tick -> schedule position; the clock is len(ticks) after each event
    start: dict[int, int] = {}
    stop: dict[int, int] = {}
    colocated: dict[int, list[int]] = {}
    placed: dict[int, bool] = {}
    first_of: dict[int, int] = {}
    for t in range(len(m.flat) + 1):
        for v in defined.get(t, []):
            b = m.find(v)
            start[v], placed[v] = len(ticks), False
            ticks.append(t)
            if b in first_of:
                colocated[first_of[b]].append(v)
                colocated.setdefault(v, [])
                continue
            donor = _dying_operand(m, v, t, freed, buffers) if len(buffers[b]) == 1 else None
            colocated.setdefault(v, [])
            if donor is not None:
                freed[t].remove(donor)
                stop[donor] = start[v]  # freed just before the share, one tick earlier
                start[v] = stop[donor] + 1
                ticks.append(t)
                colocated[donor].append(v)
                continue
            placed[v] = True
            first_of[b] = v
        for v in freed.get(t, []):
            stop[v] = len(ticks)
            ticks.append(t)
    index = {v: k for k, v in enumerate(start)}
    return [Interval(key=v, size=size[m.find(v)], start=start[v], end=stop.get(v, len(ticks)), placed=placed[v],
                     colocated=tuple(index[c] for c in colocated[v])) for v in start], ticks


def _dying_operand(m: _Module, v: int, t: int, freed: dict[int, list[int]], buffers: dict[int, list[int]]) -> int | None:
    """An operand value ending at ``t``, alone in its buffer and not yet shared, that the
    instruction defining ``v`` may write into (XLA's heap simulator reuses it in place)."""
    value = m.values[v]
    inst = m.inst[value.instruction]
    if inst.opcode == "copy":
        return None
    for operand in inst.operands:
        for idx, ws in m.sets.get(operand, {}).items():
            for w in ws:
                if w not in freed.get(t, []) or len(buffers[m.find(w)]) != 1:
                    continue
                source = m.inst[m.values[w].instruction]
                if source.name in inst.operands and can_share(m.module, source, m.values[w].index, inst, value.index):
                    return w
    return None
