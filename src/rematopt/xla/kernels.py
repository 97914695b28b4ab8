"""The kernels a compiled module launches, in schedule order, with what each reads, writes and computes.

One :class:`Kernel` per instruction of the entry schedule that runs code on the device: a fusion, a
library call (cuBLAS GEMM, cuDNN, oneDNN / YNNPACK custom calls), a copy, a lone dot or elementwise op.
Layout-only and bookkeeping instructions (bitcast, get-tuple-element, tuple, parameter, constant,
optimization-barrier) launch nothing. While loops, conditionals and calls contribute the kernels of
the computations they run, each marked with the loop's trip count where XLA printed it; a loop whose
trip count XLA knows runs its body that many times and its condition never (the CPU runtime's profile
records no condition kernel of such a loop). A call XLA's CPU compiles into one function
(``xla_cpu_small_call``: jax's threefry key splits, a loop of five rounds on a few words) is one
kernel, as its runtime runs and profiles it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .assignment import ELEMENTWISE
from .hlo import DTYPE_BITS, HloModule, Instruction

NOT_KERNELS = frozenset({
    "bitcast", "get-tuple-element", "tuple", "parameter", "constant", "opt-barrier", "optimization-barrier",
    "after-all", "add-dependency", "partition-id", "replica-id", "domain",
})
CONTROL = frozenset({"while", "conditional", "call", "async-start", "async-done"})
# Data movement or layout only: no arithmetic per element.
NO_FLOPS = frozenset({
    "parameter", "constant", "broadcast", "bitcast", "reshape", "transpose", "copy", "slice", "dynamic-slice",
    "dynamic-update-slice", "concatenate", "pad", "gather", "scatter", "tuple", "get-tuple-element", "iota",
    "reverse", "bitcast-convert", "convert", "copy-start", "copy-done", "custom-call", "fusion", "while",
    "conditional", "call", "opt-barrier", "optimization-barrier", "after-all", "rng-get-and-update-state",
})
# The frontend attribute by which XLA's CPU marks a call it compiles into one function with its callees.
SMALL_CALL = 'xla_cpu_small_call="true"'
# Library GEMM calls whose result is a tuple (output, workspace): the workspace is scratch, not output.
WORKSPACE_TARGETS = ("__cublas", "__cudnn")


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # "fusion:kLoop", "custom-call:__cublas$lt$matmul", "copy", "dot", ...
    bytes_read: int  # each distinct operand once
    bytes_written: int
    flops: int
    op_names: tuple[str, ...]  # the program's equations it came from, in first-seen order
    trip_count: int = 1  # how many times it runs per step (inside a while loop: the loop's known trip count)
    computation: str = ""
    # its largest transposition (:func:`transposition`): (bytes of the array moved, bytes of its contiguous
    # run); None where it moves no array across dimensions
    transposes: tuple[int, int] | None = None
    # transcendental functions it evaluates per run, one element at a time (:func:`scalar_transcendentals`)
    scalar_transcendentals: int = 0
    # what it reads per run one cache line an element (:func:`strided_reads`): (elements, their sweep's
    # stride in bytes, lines a sweep of the kernel reads so) per stride
    strided: tuple[tuple[int, int, int], ...] = ()
    # elements of a product it multiplies and sums one at a time (:func:`serial_products`)
    serial_products: int = 0
    # a lone dot's (rows, columns, contracted) per matrix of its batch (:func:`dot_dims`)
    gemm: tuple[int, int, int] | None = None


def kernels(module: HloModule) -> list[Kernel]:
    """The entry schedule's kernels, descending into while / conditional / call bodies."""
    out: list[Kernel] = []
    _collect(module, module.entry.name, 1, out, set())
    return out


def _collect(module: HloModule, computation: str, trips: int, out: list[Kernel], stack: set[str]) -> None:
    if computation in stack or computation not in module.computations:
        return
    stack = stack | {computation}
    comp = module.computations[computation]
    for inst in comp.instructions:
        if inst.opcode in NOT_KERNELS:
            continue
        if inst.opcode == "call" and SMALL_CALL in inst.attrs.get("frontend_attributes", ""):
            out.append(_small_call(module, comp.by_name, inst, trips))
            continue
        if inst.opcode in CONTROL:
            known = known_trip_count(inst) if inst.opcode == "while" else None
            n = trips * (known or 1)
            for called in inst.called:
                # a loop whose trip count XLA knows runs its body that many times, its condition never
                if not (known and called == inst.callee("condition")):
                    _collect(module, called, n, out, stack)
            continue
        out.append(_kernel(module, comp.by_name, inst, trips))


def _small_call(module: HloModule, scope: dict[str, Instruction], inst: Instruction, trips: int) -> Kernel:
    """A call XLA's CPU compiles into one function: one kernel that reads its operands, writes its
    result and does all its callees' work (their kernels' FLOPs times their trip counts). Priced as the
    16 kernels of a threefry key split's loop of 5 rounds, quick flax_linen's took 47 us of launches a
    call where its profile recorded 1.5 us."""
    inner: list[Kernel] = []
    for called in inst.called:
        _collect(module, called, 1, inner, set())
    operands = dict.fromkeys(o for o in inst.operands if o in scope)
    names = (inst.metadata.op_name,) if inst.metadata.op_name else ()
    return Kernel(inst.name, "call", sum(scope[o].bytes for o in operands), inst.shape.bytes,
                  sum(k.flops * k.trip_count for k in inner), names, trips, inst.computation)


def step_flops(module: HloModule) -> int:
    """FLOPs of one run of the module: each kernel's times its trip count. XLA's
    ``cost_analysis()`` counts a while loop's body once (a 4-step ``lax.scan`` of
    64x64 matmuls: 66,049 FLOPs scanned, 262,655 unrolled), so a scanned step's
    figure is not comparable with an unrolled one's."""
    return sum(k.flops * k.trip_count for k in kernels(module))


def known_trip_count(inst: Instruction) -> int | None:
    """The trip count XLA printed for a while loop (``known_trip_count`` in its backend config)."""
    n = inst.backend_config().get("known_trip_count", {}).get("n")
    return int(n) if n is not None else None


def _kernel(module: HloModule, scope: dict[str, Instruction], inst: Instruction, trips: int) -> Kernel:
    inner = module.fused_instructions(inst) if inst.opcode == "fusion" else []
    kind = inst.opcode
    if inst.opcode == "fusion":
        kind = f"fusion:{inst.fusion_kind}"
    elif inst.opcode == "custom-call":
        kind = f"custom-call:{inst.custom_call_target}"
    read, written = _traffic(module, scope, inst)
    flops = sum(instruction_flops(i) for i in inner) if inner else instruction_flops(inst)
    names = [i.metadata.op_name for i in [inst, *inner] if i.metadata.op_name]
    moves = [t for t in map(transposition, inner or [inst]) if t]
    loop = moves and kind != "fusion:kCustom"  # XLA's loop emitter, not a library's
    scalar = scalar_transcendentals(inst, inner or [inst]) if loop else 0
    strided = strided_reads(inst, inner) if loop else ()
    serial = serial_products(module, inner) if ynn_fusion(inst) else 0
    return Kernel(inst.name, kind, read, written, flops, tuple(dict.fromkeys(names)), trips, inst.computation,
                  max(moves, default=None), scalar, strided, serial, dot_dims(inst) if inst.opcode == "dot" else None)


# Elementwise functions that cost tens of cycles an element, where arithmetic costs one.
TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "sine", "cosine", "tan", "tanh", "logistic",
    "power", "sqrt", "rsqrt", "cbrt", "erf", "atan2",
})


def scalar_transcendentals(kernel: Instruction, inner: list[Instruction]) -> int:
    """Transcendental functions a transposing kernel of XLA's CPU loop emitter evaluates per run: it
    computes its output element by element, in the output's order, so each transcendental runs once per
    element of the larger of its own shape and the kernel's output (a broadcast operand is computed again
    for every element it reaches), and without the vectorized functions a streaming kernel uses. quick
    keras_llama's rotary embeddings fuse sin and cos of a [128, 8] table into the transposition of q and k:
    125 us a kernel where a transposing copy of the same [8, 4, 128, 8] takes 4 (docs/device.md)."""
    out = max((leaf.elements for leaf in kernel.shape.leaves), default=0)
    return sum(max(out, i.shape.leaves[0].elements) for i in inner if i.opcode in TRANSCENDENTAL and i.shape.leaves)


# The fusion kind XLA's CPU gives a fusion it hands to YNNPACK (its backend config's fusion_config).
YNN_FUSION = "__ynn_fusion"


def ynn_fusion(inst: Instruction) -> bool:
    """Whether ``inst`` is a fusion XLA's CPU hands to YNNPACK."""
    return inst.opcode == "fusion" and inst.backend_config().get("fusion_config", {}).get("kind") == YNN_FUSION


def serial_products(module: HloModule, inner: list[Instruction]) -> int:
    """Elements a YNNPACK fusion multiplies and sums one at a time: the inputs of each sum it takes of a
    product (a ``reduce`` by ``add`` of a ``multiply``, through bitcasts and converts) that keeps a size-1
    dimension. YNNPACK runs such a sum as a dot, and a dot with a size-1 dimension left over one element
    at a time: on this machine's core (jax 0.10.2), summing [1, 2048, 128] products over the last
    dimension took 0.70 ms where [2048, 128] took 0.08 (and the same sum of ``a * c + 1``, not a dot,
    0.07); a size-1 dimension summed away, a ``max`` of the products, or a sum of one array keep the
    fast path. keras-hub's attention makes one such sum a layer in its softmax gradient
    ([1, heads, groups, tokens, tokens]): 0.71 ms a layer in the bench's keras_llama's plain step, priced
    0.04, where rematopt's plans write the same gradient with one more addition and take 0.1 (docs/device.md)."""
    scope = {i.name: i for i in inner}
    out = 0
    for inst in inner:
        if inst.opcode != "reduce" or not inst.operands or inst.operands[0] not in scope or not _adds(module, inst):
            continue
        if through(scope[inst.operands[0]], scope, ("bitcast", "convert")).opcode != "multiply":
            continue
        source = inst.operand_shapes[0].leaves[0]
        summed = set(_dimensions(inst))
        if any(n == 1 and d not in summed for d, n in enumerate(source.dims)):
            out += source.elements
    return out


def _adds(module: HloModule, reduce: Instruction) -> bool:
    """Whether ``reduce`` sums (its reducer's root is an ``add``)."""
    reducer = module.computations.get(reduce.called[0]) if reduce.called else None
    return reducer is not None and reducer.root.opcode == "add"


# What reads only part of its operand. quick keras_llama's plan fuses the one element it keeps of a
# 2.1 MB attention array (a `slice`): 0.5 us profiled, 32 us priced as reading it whole.
SLICES = ("slice", "dynamic-slice")


def _traffic(module: HloModule, scope: dict[str, Instruction], inst: Instruction) -> tuple[int, int]:
    """(bytes read, bytes written): each distinct operand once and the output, but a slice for what is
    sliced: an operand only read through slices or dynamic-slices reads those slices, and a dynamic-update-slice
    writes its update in place, its buffer operand neither read nor rewritten (as XLA's cost analysis
    counts them). A scan's body slices its step out of the stacked arrays this way; counting the
    whole stack priced flax_linen's plain step at 0.25 GB per step against 0.12 for its plan."""
    operands = list(dict.fromkeys(o for o in inst.operands if o in scope))
    sizes = {o: scope[o].bytes for o in operands}
    written = written_bytes(inst)
    if inst.opcode in SLICES and operands:
        sizes[inst.operands[0]] = inst.shape.bytes
    elif inst.opcode == "dynamic-update-slice" and len(inst.operands) > 1:
        sizes[inst.operands[0]] = 0
        written = scope[inst.operands[1]].bytes if inst.operands[1] in scope else written
    elif inst.opcode == "fusion" and inst.called and inst.called[0] in module.computations:
        fused = module.computations[inst.called[0]]
        users: dict[str, list[Instruction]] = {}
        for i in fused.instructions:
            for o in i.operands:
                users.setdefault(o, []).append(i)
        root = _through_bitcasts(fused.root, fused.by_name)
        for p in fused.parameters:
            if p.parameter_number is None or p.parameter_number >= len(inst.operands):
                continue
            name = inst.operands[p.parameter_number]
            if name not in sizes:
                continue
            uses = _uses(p.name, users)
            if uses and all(u.opcode in SLICES and _through_bitcasts(fused.by_name[u.operands[0]],
                                                                             fused.by_name).name == p.name
                            for u in uses):
                sizes[name] = min(sizes[name], sum(u.shape.bytes for u in uses))
            elif (root.opcode == "dynamic-update-slice" and uses == [root]
                  and _through_bitcasts(fused.by_name[root.operands[0]], fused.by_name).name == p.name):
                sizes[name] = 0
        if root.opcode == "dynamic-update-slice" and root.operands[1] in fused.by_name:
            written = fused.by_name[root.operands[1]].shape.bytes
    return sum(sizes.values()), written


# A cache line. A transposing kernel of XLA's CPU loop emitter computes its output in the output's
# order, so an operand whose minor dimension is not the output's is read one element per cache line
# (its stride: 64 bytes or more between consecutive reads), and the line serves the next element of that
# operand only a sweep later, if the cache still holds it. What that costs depends on the stride and on
# how many lines a sweep reads so, operands times sweep (xla.machine measures a grid of both; the
# bench's keras_llama's [4, 128, 256] -> [256, 512] gradients read four operands a 512-element sweep at 1 KiB
# in 0.66 ns an element, where one [1024, 256] array costs 1.06 more than in order): timed alone on this
# machine's core, summing k [1024, c] arrays (slices of one buffer) times a [c] vector into [c, 1024],
# more than in order by 0.54, 0.78, 1.40 and 2.20 ns an element for k = 1, 8, 16 and 48 at 256 B (the
# prefetcher follows about eight streams), 0.56 to 2.79 at 512 B, and at 1 KiB, whose lines fall in a
# sixteenth of the cache's sets, 1.06, 2.42, 3.18 and 3.80. The bench's gpt's residual-gradient
# transposes read 8 to 46 arrays at 1 KiB, at 2.4 to 4.2 ns an element in its step (docs/device.md).
LINE = 64


def strided_reads(kernel: Instruction, inner: list[Instruction]) -> tuple[tuple[int, int, int], ...]:
    """(elements read one cache line each, their sweep's stride, lines a sweep of the kernel reads so:
    what its cache must hold until the next sweep reads them again) per stride, of a transposing kernel:
    per transposition in it (:func:`transposition`; several on one path from an operand to the output,
    that path's read of the operand as they compose, :func:`_composed`) whose consecutive
    output elements lie a line or more apart in its operand, for as long a sweep as a line holds
    elements, each operand it reads there as large as what moves (a lone copy or transpose: its
    operand; a fusion's operand read through slices alone, each slice) reads one line per element. The
    stride is the greatest common divisor of the strides of the sweep's dimensions (:func:`_stride_and_sweep`):
    what decides which of the cache's sets its lines fall in. A broadcast operand (smaller than what
    moves) stays in cache. The loop emitter computes only the elements its output holds: without a
    reduction in the kernel, an array read so is read at most as many elements as the largest output
    (a tie's one element of a transposed gradient: one element, not the gradient)."""
    scope = {i.name: i for i in inner}
    reduces = any(i.opcode in ("reduce", "reduce-window") for i in inner)
    most = max((leaf.elements for leaf in kernel.shape.leaves), default=0)
    covered, composites = _composed(inner)
    reads: dict[int, int] = {}  # elements per stride
    lines = 0
    geometries = [(move, _stride_and_sweep(move)) for move in inner or [kernel] if move.name not in covered]
    for move, geometry in [*geometries, *composites]:
        if geometry is None:
            continue
        stride, sweep, spread, elements = geometry
        composite = move.opcode == "parameter"  # a composed path's read: of that operand alone
        size = _dtype_bytes(move.shape.leaves[0]) if composite else _element_bytes(move)
        if stride < LINE or sweep < LINE // size:  # a line serves the next elements
            continue
        n = len(_arrays_read(move, scope, elements)) if inner and not composite else 1
        if not reduces:
            elements = min(elements, most)
        reads[spread] = reads.get(spread, 0) + n * elements
        lines += n * sweep
    return tuple((elements, spread, lines) for spread, elements in sorted(reads.items()) if elements)


# What a loop fusion's element passes through unchanged on its way from an operand to the output:
# the emitter computes each output element by following its index back through these.
_PASS = frozenset({"bitcast", "copy", "transpose", "reshape", "parameter"}) | ELEMENTWISE
PATHS = 4096  # partial paths walked at most in one fusion
COMPOSED_ELEMENTS = 1 << 24  # the largest operand whose index map is composed (64 MiB of int32 indices)
# Operands that stay in cache, as :func:`strided_reads` has a broadcast operand do.
_SMALL = frozenset({"broadcast", "constant", "iota"})


def _composed(inner: list[Instruction]) -> tuple[set[str], list[tuple[Instruction, tuple[int, int, int, int]]]]:
    """The transpositions of a loop fusion that lie, several on one path, between an operand and the
    output, and each such path's read as one: (their names, [(the operand, its geometry as
    :func:`_stride_and_sweep` gives one)]). The emitter composes a path's index arithmetic from the
    output back to the operand, so the path reads the operand once, in the order the transpositions
    make together, however each of them alone would: keras_llama's plans' tied gradients take a
    [512, 128] array through three layout-changing copies and two transposes to [4, 4, 128, 32] in its
    own order (0.38 ns an element profiled, where two strided sweeps were priced at five times that).
    A path through anything else (a slice, a concatenation) keeps its transpositions one by one, and so
    does a transposition on any such path; a path to a broadcast or a constant reads what stays in cache."""
    if not inner:
        return set(), []
    scope = {i.name: i for i in inner}
    moving = {i.name for i in inner if transposition(i)}
    alone: set[str] = set()  # transpositions on a path priced one by one
    together: dict[str, list[tuple[Instruction, tuple[int, int, int, int]]]] = {}
    stack = [[i] for i in inner if i.is_root][:1]
    walked = 0
    while stack:
        walked += 1
        if walked > PATHS:  # a wide elementwise graph: its moves are priced one by one, as before
            return set(), []
        path = stack.pop()
        head = path[-1]
        moves = [i.name for i in path if i.name in moving]
        if head.opcode in _SMALL:
            continue
        if head.opcode not in _PASS or len(path) > 64:
            alone.update(moves)
            continue
        if head.opcode == "parameter":
            if len(moves) > 1:
                geometry = _composite_geometry(path)
                for m in moves:
                    together.setdefault(m, [])
                if geometry is None:
                    alone.update(moves)
                else:
                    together[moves[0]].append((head, geometry))
            continue
        for o in dict.fromkeys(head.operands):
            if o not in scope or scope[o].opcode in _SMALL:
                continue
            if scope[o].shape.leaves and scope[o].shape.leaves[0].elements == head.shape.leaves[0].elements:
                stack.append(path + [scope[o]])
            else:
                alone.update(moves)
    covered = {m for m in together if m not in alone}
    reads = {(p.name, g): (p, g) for m in covered for p, g in together[m]}
    return covered, list(reads.values())


def _composite_geometry(path: list[Instruction]) -> tuple[int, int, int, int] | None:
    """(stride, sweep, spread, elements) of the read a path (output first, an operand last) makes of
    the operand, as :func:`_stride_and_sweep` gives them for one transposition: the bytes between the
    operand elements of consecutive output elements in the output's layout, how many consecutive output
    elements are read before the first one's cache line is read again, the greatest common divisor of
    the strides within that sweep, the elements; a stride of one element where it reads in order. None
    where a step of the path does not keep the shape it says (the walk does not follow it), or the
    operand is beyond :data:`COMPOSED_ELEMENTS` (its transpositions are then priced one by one)."""
    source = path[-1].shape.leaves[0]
    if source.elements > COMPOSED_ELEMENTS:
        return None
    value = _logical(np.arange(source.elements, dtype=np.int32), source)
    size = _dtype_bytes(source)
    for k in range(len(path) - 2, -1, -1):
        inst, leaf = path[k], path[k].shape.leaves[0]
        if inst.opcode == "bitcast":
            value = _logical(_physical(value, path[k + 1].shape.leaves[0]), leaf)
        elif inst.opcode == "reshape":
            value = value.reshape(leaf.dims)
        elif inst.opcode == "transpose":
            value = value.transpose(_dimensions(inst))
        if value.shape != tuple(leaf.dims):
            return None
    written = _physical(value, path[0].shape.leaves[0])
    if written.size < 2:
        return size, 1, size, int(source.elements)
    per_line = max(LINE // size, 1)
    line = written // per_line
    again = np.flatnonzero(line[1:] == line[0])
    sweep = int(again[0]) + 1 if again.size else int(written.size)
    steps = np.abs(np.diff(written[:max(sweep, 2)])) * size  # within the sweep
    spread = int(np.gcd.reduce(steps[steps > 0])) if (steps > 0).any() else size
    return int(steps[0]) if steps[0] else size, sweep, spread, int(source.elements)


def _minor_to_major(leaf) -> list[int]:
    """``leaf``'s layout, minor dimension first; the default (row-major) where it prints none."""
    order = _layout(leaf)
    return order if len(order) == len(leaf.dims) else list(reversed(range(len(leaf.dims))))


def _layout(leaf) -> list[int]:
    """The dimensions of ``leaf``'s printed layout, minor first (its tiling left out)."""
    return [int(d) for d in (leaf.layout or "").strip("{}").split(":")[0].split(",") if d.strip()]


def _dimensions(inst: Instruction) -> list[int]:
    """An instruction's ``dimensions`` attribute (a transpose's permutation, a reduction's dimensions)."""
    return [int(d) for d in inst.attrs.get("dimensions", "").strip("{}").split(",") if d.strip()]


def _logical(flat: np.ndarray, leaf) -> np.ndarray:
    """Values in physical order (``leaf``'s layout) as an array of its logical shape."""
    major_first = list(reversed(_minor_to_major(leaf)))
    return flat.reshape([leaf.dims[d] for d in major_first]).transpose(np.argsort(major_first))


def _physical(value: np.ndarray, leaf) -> np.ndarray:
    """A logical array's values in ``leaf``'s physical order."""
    return value.transpose(list(reversed(_minor_to_major(leaf)))).ravel()


def _element_bytes(inst: Instruction) -> int:
    return _dtype_bytes(inst.operand_shapes[0].leaves[0])


def _dtype_bytes(leaf) -> int:
    return max(DTYPE_BITS.get(leaf.dtype, 32) // 8, 1)


def _stride_and_sweep(inst: Instruction) -> tuple[int, int, int, int] | None:
    """Of a transposition, as it reads its operand in its output's order: (bytes between the operand
    elements of two consecutive output elements, the sweep: how many consecutive output elements it
    reads before the operand's minor dimension advances, the greatest common divisor of the strides
    (bytes) of the sweep's dimensions, elements moved); None for anything else."""
    orders = _orders(inst)
    if orders is None or orders[0] == orders[1]:
        return None
    read, written = orders
    source = inst.operand_shapes[0].leaves[0]
    strides, step = {}, _element_bytes(inst)
    for d in read:
        strides[d] = step
        step *= source.dims[d]
    sweep, spread = 1, 0
    for d in written:
        if d == read[0]:
            break
        sweep *= source.dims[d]
        spread = math.gcd(spread, strides[d])
    return strides[written[0]], sweep, spread, source.elements


def _arrays_read(inst: Instruction, scope: dict[str, Instruction], elements: int) -> list[Instruction]:
    """The fusion's operands whose values reach ``inst`` with at least ``elements`` elements: each
    parameter, or each slice of a parameter where the fusion reads it through slices alone (one read
    whole as well, a plan's tie beside its transposition, is read whole)."""
    seen: dict[str, Instruction] = {}
    stack = list(inst.operands)
    while stack:
        name = stack.pop()
        if name in seen or name not in scope:
            continue
        seen[name] = scope[name]
        stack.extend(scope[name].operands)
    sliced, whole = set(), set()  # parameters some path reads through a slice / reads otherwise
    for i in seen.values():
        if i.opcode != "bitcast":
            for o in i.operands:
                if o in scope:
                    (sliced if i.opcode in SLICES else whole).add(_through_bitcasts(scope[o], scope).name)
    sliced -= whole
    return [i for i in seen.values() if i.shape.leaves and i.shape.leaves[0].elements >= elements and (
        (i.opcode == "parameter" and i.name not in sliced) or (
            i.opcode in SLICES and i.operands[0] in scope
            and _through_bitcasts(scope[i.operands[0]], scope).name in sliced))]


def transposition(inst: Instruction) -> tuple[int, int] | None:
    """(bytes, contiguous run in bytes) of what ``inst`` moves across dimensions: a ``transpose``, or a
    ``copy`` that changes the layout, whose elements do not keep their order in memory (size-1
    dimensions aside); None for anything else. The run is how many bytes stay contiguous from the
    input to the output: the minor dimensions both orders share (a 2-D transpose: one element; swapping
    attention heads with tokens: a head's width)."""
    orders = _orders(inst)
    if orders is None:
        return None
    read, written = orders
    source = inst.operand_shapes[0].leaves[0]
    if read == written:
        return None
    run = _element_bytes(inst)
    for a, b in zip(read, written):
        if a != b:
            break
        run *= source.dims[a]
    return source.bytes, run


def _orders(inst: Instruction) -> tuple[list[int], list[int]] | None:
    """The order in which a ``transpose`` or ``copy`` reads its operand's dimensions from memory and the
    order in which it writes them, both as the operand's dimensions, minor first, without size-1
    dimensions (they do not move data); None for anything else."""
    if inst.opcode not in ("transpose", "copy") or not inst.operand_shapes or not inst.operand_shapes[0].leaves:
        return None
    source, out = inst.operand_shapes[0].leaves[0], inst.shape.leaves[0]
    if not source.layout or not out.layout:
        return None
    perm = _dimensions(inst) if inst.opcode == "transpose" else list(range(len(out.dims)))
    return ([d for d in _layout(source) if source.dims[d] > 1], [perm[d] for d in _layout(out) if out.dims[d] > 1])


def _through_bitcasts(inst: Instruction, scope: dict[str, Instruction]) -> Instruction:
    """The instruction whose values ``inst`` forwards through bitcasts (itself if none)."""
    return through(inst, scope, ("bitcast",))


def through(inst: Instruction, scope: dict[str, Instruction], opcodes: tuple[str, ...]) -> Instruction:
    """The instruction whose values ``inst`` forwards through ``opcodes`` (itself if none)."""
    while inst.opcode in opcodes and inst.operands and inst.operands[0] in scope:
        inst = scope[inst.operands[0]]
    return inst


def _uses(name: str, users: dict[str, list[Instruction]]) -> list[Instruction]:
    """The instructions that use ``name``'s values, looking through bitcasts."""
    out: list[Instruction] = []
    for u in users.get(name, []):
        out.extend(_uses(u.name, users) if u.opcode == "bitcast" else [u])
    return out


def written_bytes(inst: Instruction) -> int:
    """Output bytes, without a library GEMM's workspace leaf."""
    if inst.opcode == "custom-call" and inst.custom_call_target.startswith(WORKSPACE_TARGETS) and inst.shape.is_tuple:
        return sum(leaf.bytes for leaf in inst.shape.leaves[:-1])
    return inst.shape.bytes


def instruction_flops(inst: Instruction) -> int:
    """Dots and convolutions from their shapes (2 per multiply-add); reductions one per input element;
    other arithmetic one per output element; data movement none."""
    if inst.opcode == "dot":
        return 2 * inst.shape.leaves[0].elements * _contracted(inst)
    if inst.opcode == "custom-call":
        return _gemm_flops(inst)
    if inst.opcode == "convolution":
        return 2 * inst.shape.leaves[0].elements * _conv_window(inst)
    if inst.opcode in ("reduce", "reduce-window"):
        half = max(1, len(inst.operand_shapes) // 2)  # operands: inputs, then as many init values
        return sum(s.leaves[0].elements for s in inst.operand_shapes[:half] if s.leaves)
    if inst.opcode in NO_FLOPS:
        return 0
    return sum(leaf.elements for leaf in inst.shape.leaves)


def _operand_dims(inst: Instruction, number: int) -> tuple[int, ...] | None:
    if number < len(inst.operand_shapes) and inst.operand_shapes[number].leaves:
        return inst.operand_shapes[number].leaves[0].dims
    return None


def _contracted(inst: Instruction) -> int:
    """Product of the lhs contracting dimensions, read from the operand shapes recorded on the dot."""
    return _product(_operand_dims(inst, 0), _dot_attr(inst, "lhs_contracting_dims"))


def dot_dims(inst: Instruction) -> tuple[int, int, int] | None:
    """A dot's (rows, columns, contracted) per matrix of its batch: the lhs's and the rhs's dimensions
    neither batch nor contracting, and the contracting ones. Eigen's rate depends on all three (on this
    machine's core, 5 to 90 GFLOP/s over 32 to 1,024 of each, xla.machine)."""
    lhs, rhs = _operand_dims(inst, 0), _operand_dims(inst, 1)
    if lhs is None or rhs is None:
        return None
    own = {side: [d for d in range(len(dims)) if d not in _dot_attr(inst, f"{side}_contracting_dims")
                  + _dot_attr(inst, f"{side}_batch_dims")] for side, dims in (("lhs", lhs), ("rhs", rhs))}
    return _product(lhs, own["lhs"]), _product(rhs, own["rhs"]), _contracted(inst)


def _dot_attr(inst: Instruction, name: str) -> list[int]:
    return [int(d) for d in inst.attrs.get(name, "{}").strip("{}").split(",") if d.strip()]


def _product(dims: tuple[int, ...] | None, which: list[int]) -> int:
    return math.prod(dims[d] for d in which) if dims is not None else 1


def _gemm_flops(inst: Instruction) -> int:
    config = inst.backend_config().get("gemm_backend_config")
    lhs = _operand_dims(inst, 0)
    if not config or lhs is None:
        return 0
    dims = config.get("dot_dimension_numbers", {}).get("lhs_contracting_dimensions", [])
    return 2 * inst.shape.leaves[0].elements * _product(lhs, [int(d) for d in dims])


def _conv_window(inst: Instruction) -> int:
    """Multiply-adds per output element: kernel window times input features per group."""
    rhs = _operand_dims(inst, 1)
    labels = inst.attrs.get("dim_labels", "")
    if rhs is None or "_" not in labels:
        return 1
    kernel_labels = labels.split("_")[1].split("->")[0]
    n = 1
    for label, size in zip(kernel_labels, rhs):
        if label != "o":  # everything but the output feature dimension is summed over
            n *= size
    return n
