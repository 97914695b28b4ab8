"""What a compiled step costs on a device: each kernel XLA launches priced as a roofline.

A kernel's time is ``max(flops / FLOP rate, (bytes read + bytes written) / bandwidth)``, times the
number of times it runs (a kernel inside a while loop: the loop's trip count). A fused group of
equations is one kernel, so it moves its inputs and outputs once; that is what the per-equation
graph model got wrong (on the H200 fixture its elementwise work priced at about 52 ms where XLA's
fused kernels take about 12 ms). Dots, convolutions and library calls run on the matrix units
(``Device.flops_per_s``), lone dots and convolutions at their own rate where the profile has one
(``Device.dot_flops_per_s``: Eigen's, on XLA's CPU); everything else on the vector units
(``Device.vector_flops_per_s``). A
transposing kernel's transcendental functions, evaluated one element at a time
(:func:`rematopt.xla.kernels.scalar_transcendentals`), the elements it reads one cache line each
(:func:`rematopt.xla.kernels.strided_reads`), and the elements of a product a YNNPACK fusion sums one
at a time (:func:`rematopt.xla.kernels.serial_products`) cost a measured price each on top.

A recomputation is priced by compiling the planned step and pricing its kernels: what XLA fused
into existing kernels grows them, what it could not fuse adds kernels.

:func:`calibrate` scales a profile so that one measured step (the plain step) is priced at its
measured time; the scaled profile then predicts every other variant of that step on that machine
(``rematopt bench device`` calibrates on the plain step, on the rates :mod:`rematopt.xla.machine`
measured on the CPU, and predicts the policies and rematopt's plans); given the plain step's per-kernel
profile, one scale per kernel class (:func:`kernel_class`), or each of its kernels at its profiled
time (``per_kernel``: the kernels of another step alike to one of them take its time, any other the
profile's scale; what the measured step took beyond them priced per byte of its compiled peak), the
bench's prediction, with the other two beside it (docs/device.md). On CPU a step also pays for
the page faults of the buffers it allocates anew (:func:`step_faults`), at a measured price per
fault. :func:`fit` instead fits the FLOP and byte factors and a launch cost to several measured
steps by least squares; with the three to five baselines of a bench model it is under-determined
(it priced quick gpt's bytes at 1,760 times the data sheet), so the bench does not use it.
"""

from __future__ import annotations

import functools
import itertools
import math
import mmap
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..importers.costmodel import Device
from .hlo import HloModule, Instruction, Leaf, parse_hlo
from .kernels import Kernel, kernels, ynn_fusion

# Kernels that run on the matrix units: library GEMM / convolution calls, lone dots and
# convolutions, and the fusions XLA builds around them (GPU: kOutput, kCustom for Triton GEMMs).
MATRIX_KINDS = ("custom-call:", "dot", "convolution", "fusion:kOutput", "fusion:kCustom")
# Dots and convolutions no fusion holds (XLA's CPU leaves them to Eigen): Device.dot_flops_per_s, class "lone dot".
LONE_KINDS = ("dot", "convolution")


@dataclass(frozen=True)
class KernelCost:
    kernel: Kernel
    seconds: float  # all its runs in one step
    bound: str  # "memory" or "compute": which side of the roofline it is on


@dataclass(frozen=True)
class StepCost:
    """A compiled step priced on ``device``."""

    device: Device
    kernels: tuple[KernelCost, ...]

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    @property
    def bytes_moved(self) -> int:
        return sum((k.kernel.bytes_read + k.kernel.bytes_written) * k.kernel.trip_count for k in self.kernels)

    @property
    def flops(self) -> int:
        return sum(k.kernel.flops * k.kernel.trip_count for k in self.kernels)

    def by_kind(self) -> dict[str, float]:
        """Seconds per kernel kind (``fusion:kLoop``, ``custom-call:__cublas$gemm``, ...)."""
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k.kernel.kind] = out.get(k.kernel.kind, 0.0) + k.seconds
        return out


def on_matrix_units(kernel: Kernel) -> bool:
    return kernel.kind.startswith(MATRIX_KINDS)


# An element read one cache line each costs about the same whatever the lines a sweep reads, until
# the cache's sets its stride falls in are full, then several times as much: summing k [1024, c] arrays
# written transposed (xla.machine's grid) cost 0.81, 0.84, 0.85, 0.86, 1.14, 2.48 and 5.92 ns more an
# element at 256 B for k = 1, 2, 3, 4, 6, 8 and 16 (the step at 2 MiB / stride lines, the L2's sets at
# that stride; 0.80, 0.83, 1.10, 2.39 at 512 B; 0.92, 2.66 at 1 KiB, on 2026-12-07). A kernel is
# priced at the grid's point at or below its lines: interpolated between the grid's 1,024 and 8,192
# lines, keras_llama's plans' gradient transposes (1,536 and 2,048 lines at 1 KiB) priced at 2.0 to 2.7
# ns an element ran at 0.8 to 1.1 in the step (their arrays do not all fall in the same sets, as the
# micro-benchmark's slices of one buffer do); over the 60 plans of five full runs, repriced from their
# programs and profiles, 32 -> 36 predicted within 3 points of their measured overhead, the mean error
# 4.0 -> 3.7 points (docs/device.md).
def kernel_cost(kernel: Kernel, device: Device, launch_s: float = 0.0) -> KernelCost:
    """Its roofline on ``device``, plus ``launch_s`` (what starting a kernel costs), the device's price of
    each transcendental function it evaluates one element at a time
    (:func:`rematopt.xla.kernels.scalar_transcendentals`: the roofline's vector rate is 4 times too fast for
    those, :mod:`rematopt.xla.machine`) and the device's price of each element it reads one cache line each
    (:func:`rematopt.xla.kernels.strided_reads`: the roofline's bandwidth is 3 to 12 times too fast for
    those) and the device's price of each element of a product it sums one at a time
    (:func:`rematopt.xla.kernels.serial_products`: 9 times as long as the same sum without its size-1
    dimension), per run."""
    compute, memory = _sides(kernel, device)
    scalar = kernel.scalar_transcendentals * device.transcendental_s
    strided = sum(elements * grid_value(device.strided_rates, (stride, lines), floor=(False, True))
                  for elements, stride, lines in kernel.strided) if device.strided_rates else 0.0
    serial = kernel.serial_products * device.serial_product_s
    return KernelCost(kernel, (max(compute, memory) + launch_s + scalar + strided + serial) * kernel.trip_count,
                      "compute" if compute + scalar + serial > memory + strided else "memory")


def _sides(kernel: Kernel, device: Device) -> tuple[float, float]:
    """(compute seconds, memory seconds) of one run of ``kernel`` on ``device``."""
    if kernel.gemm and device.dot_rates:
        rate = grid_value(device.dot_rates, kernel.gemm)
    elif kernel.kind in LONE_KINDS and device.dot_flops_per_s:
        rate = device.dot_flops_per_s
    elif on_matrix_units(kernel):
        rate = device.flops_per_s
    else:
        rate = device.vector_flops_per_s or device.flops_per_s
    return kernel.flops / rate, (kernel.bytes_read + kernel.bytes_written) / device.bytes_per_s


def grid_value(rows: tuple[tuple[float, ...], ...], point: tuple[int, ...], floor: tuple[bool, ...] = ()) -> float:
    """The value at ``point`` of a figure measured on a grid (``rows``: the grid's point, then the value
    there; :attr:`Device.dot_rates`, :attr:`Device.strided_rates`): interpolated linearly in the
    logarithms of the coordinates between the grid's points around it, the nearest edge beyond the grid;
    along an axis ``floor`` marks, at the grid's coordinate at or below the point's instead (a figure
    that steps between the grid's points rather than ramps: the strided reads of :func:`kernel_cost`)."""
    table, axes = _grid(rows)
    corners = []  # per axis: (grid coordinate, weight) of the points around
    for i, (axis, size) in enumerate(zip(axes, point)):
        x = min(max(math.log2(max(size, 1)), math.log2(axis[0])), math.log2(axis[-1]))
        hi = next(k for k, g in enumerate(axis) if math.log2(g) >= x)
        lo = max(hi - 1, 0)
        span = math.log2(axis[hi]) - math.log2(axis[lo])
        w = (x - math.log2(axis[lo])) / span if span else 1.0
        if i < len(floor) and floor[i]:
            w = 1.0 if w == 1.0 else 0.0
        corners.append(((axis[lo], 1.0 - w), (axis[hi], w)))
    return sum(math.prod(w for _, w in pick) * table[tuple(g for g, _ in pick)] for pick in itertools.product(*corners))


@functools.lru_cache(maxsize=8)
def _grid(rows: tuple[tuple[float, ...], ...]) -> tuple[dict[tuple, float], list[list[float]]]:
    """A grid's values by point and its sorted coordinates per axis: built once a table, where
    :func:`grid_value` runs for each lone dot and strided kernel of every step priced."""
    table = {tuple(row[:-1]): row[-1] for row in rows}
    return table, [sorted({key[i] for key in table}) for i in range(len(rows[0]) - 1)]


def step_cost(module: HloModule | str, device: Device, launch_s: float = 0.0) -> StepCost:
    """Price every kernel of ``module`` (a parsed module, or ``compiled.as_text()``) on ``device``."""
    if isinstance(module, str):
        module = parse_hlo(module)
    return StepCost(device, tuple(kernel_cost(k, device, launch_s) for k in kernels(module)))


@dataclass(frozen=True)
class Fit:
    """A profile fitted to measured steps: every kernel run takes ``max(flops / (FLOP rate / compute),
    bytes / (bandwidth / memory)) + launch_s``, ``compute`` and ``memory`` being how many times slower
    than the data sheet the machine ran them."""

    device: Device  # the data sheet's rates divided by the fitted factors; its source says what it was fitted on
    compute: float
    memory: float
    launch_s: float
    fitted_on: tuple[str, ...]
    errors: tuple[float, ...]  # each fitted step's predicted / measured - 1

    def price(self, step: StepCost) -> StepCost:
        """``step``'s kernels priced on the fitted profile."""
        return StepCost(self.device, tuple(kernel_cost(k.kernel, self.device, self.launch_s) for k in step.kernels))


# glibc's malloc serves a request above its mmap threshold with fresh pages, which the kernel zero-fills
# on first touch, one minor fault a page; the threshold rises to the largest chunk freed but never above
# this ceiling (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit). Measured with jax 0.10.2 on a jitted
# step, per step after the warm-up: temp buffer 30.3 MB, 0 faults; 34.3 MB, 8,365 (its pages + 1);
# 128.3 MB, 31,315; quick gpt's plain step (132.8 MB temp), 32,431 (docs/device.md).
MMAP_CEILING = 32 << 20
PAGE = mmap.PAGESIZE  # one minor fault each, on the machine the step runs on


def step_faults(module: HloModule | str, temp_bytes: int) -> int:
    """Minor page faults per run of a compiled CPU step (run by one thread, as the bench pins it),
    predicted from the program: the pages of the buffers it allocates anew above glibc's mmap ceiling
    (:func:`fresh_buffers`), and, where the installed XLA hands it back to the kernel
    (:func:`scratch_given_back`), the scratch of its YNNPACK fusions (:func:`scratch_faults`). Checked
    against ``getrusage`` on a jitted step and quick gpt's steps (tests/test_xla_cost.py)."""
    if isinstance(module, str):
        module = parse_hlo(module)
    fresh = fresh_buffers(module, temp_bytes)
    scratch = scratch_faults(module, fresh) if scratch_given_back() else 0
    return sum(b // PAGE + 1 for b in fresh if b > MMAP_CEILING) + scratch


@functools.cache
def scratch_given_back() -> bool:
    """Whether the installed XLA's CPU runtime runs a step's YNNPACK fusions on the calling thread, whose
    scratch glibc gives back to the kernel each call (:func:`scratch_faults`): jaxlib before 0.11. jaxlib
    0.11 runs a step's kernels on its own thread pool and the scratch faults no more (quick gpt under
    per-layer nothing_saveable, one core: with 0.10.2 44,897 faults a step, all on the calling thread,
    against 45,025 predicted, its temp buffer's 20,449 pages and the scratch's 24,576; with 0.11.2
    20,895, 20,124 of them on a ``tf_XLAEigen`` thread: its temp buffer's 20,895 pages, no scratch).
    Without jaxlib, as before 0.11."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = tuple(int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return True
    return release < (0, 11)


def fresh_buffers(module: HloModule, temp_bytes: int) -> list[int]:
    """The buffers one run of a compiled CPU step allocates: its temp buffer (``temp_bytes``, XLA's
    ``temp_size_in_bytes``) and each output not aliased to a parameter. Each one above
    :data:`MMAP_CEILING` is mapped fresh and every page of it faults, one more for malloc's header."""
    return [temp_bytes] + [leaf.bytes for _, leaf in _fresh_outputs(module)]


def _fresh_outputs(module: HloModule) -> list[tuple[tuple[int, ...], Leaf]]:
    """The step's outputs that are not aliased to a parameter: (shape index, leaf), each allocated anew."""
    shape, aliased = module.entry.root.shape, set(module.input_output_alias)
    return [(index, leaf) for index, leaf in zip(shape.index, shape.leaves) if index not in aliased]


def priced_step(module: HloModule | str, temp_bytes: int, price: Calibration, faults: bool) -> tuple[float, int]:
    """(seconds, page faults per step) of a compiled step on ``price`` (its kernels, and where ``faults``,
    on CPU, :func:`step_faults` at ``price.fault_s``): the time ``--verify xla``'s loop chooses by."""
    if isinstance(module, str):
        module = parse_hlo(module)
    n = step_faults(module, temp_bytes) if faults else 0
    return price.seconds(step_cost(module, price.device), n), n


# Inside a fusion, YNNPACK allocates with malloc, per call, each value it cannot stream: a packed copy of
# each dot's right operand, a dot operand the fusion computes, and a value two instructions read (quick
# gpt's per-layer nothing_saveable step: 16 allocations of 8.4 MB a step, 3 of them at once in each of
# its 4 softmax-backward fusions, by an LD_PRELOAD malloc log; a dot's left operand and a dot output
# that one reduction reads are streamed, tests/test_xla_cost.py). glibc's trim threshold is twice the
# largest chunk it mapped and freed under the mmap ceiling (there an 8.4 MB scratch buffer: its temp
# buffer is above the ceiling): a fusion whose scratch exceeds it gives the pages back on free
# (strace: 4 x madvise(MADV_DONTNEED) of 25.0 MB a step) and faults them all again next call.
SCRATCH_EXEMPT = frozenset({"parameter", "constant", "broadcast", "bitcast", "iota"})


def fusion_scratch(module: HloModule, fusion: Instruction) -> list[int]:
    """The buffers (bytes) a YNNPACK fusion allocates per call, by the rule above."""
    comp = module.computations[fusion.called[0]]
    users: dict[str, int] = {}
    for inst in comp.instructions:
        for o in dict.fromkeys(inst.operands):
            users[o] = users.get(o, 0) + 1
    dots = [inst for inst in comp.instructions if inst.opcode == "dot"]
    dot_operands = {o for inst in dots for o in inst.operands[:2]}
    out = [comp.by_name[inst.operands[1]].bytes for inst in dots]
    for inst in comp.instructions:
        if inst.opcode not in SCRATCH_EXEMPT and not inst.is_root and (
                inst.name in dot_operands or users.get(inst.name, 0) > 1):
            out.append(inst.bytes)
    return out


def scratch_faults(module: HloModule, fresh: Sequence[int] = ()) -> int:
    """Page faults per step of the YNNPACK fusions' scratch (:func:`fusion_scratch`): every run of a
    fusion whose scratch exceeds glibc's trim threshold (twice the step's largest buffer under the mmap
    ceiling, of its scratch and its ``fresh`` buffers, :func:`fresh_buffers`) faults each of its pages."""
    return sum(trips * pages for pages, trips in _scratch_runs(module, fresh).values())


def _scratch_runs(module: HloModule, fresh: Sequence[int]) -> dict[str, tuple[int, int]]:
    """Per YNNPACK fusion whose scratch glibc gives back (:func:`scratch_faults`): (its scratch's pages,
    its runs a step)."""
    by_name = module.by_name
    runs = {k.name: (fusion_scratch(module, by_name[k.name]), k.trip_count) for k in kernels(module)
            if ynn_fusion(by_name[k.name])}
    largest = max((b for scratch, _ in runs.values() for b in [*fresh, *scratch] if b <= MMAP_CEILING), default=0)
    return {name: (sum(scratch) // PAGE, trips) for name, (scratch, trips) in runs.items()
            if sum(scratch) > 2 * largest}


# glibc's header before a mapped chunk's memory: the temp buffer's byte b lies in page (b + MALLOC_HEADER) // PAGE.
MALLOC_HEADER = 16


def profiled_faults(module: HloModule | str, temp_bytes: int) -> dict[str, int]:
    """Per kernel (by name), the page faults of :func:`step_faults` its profiled time holds
    (:func:`rematopt.xla.profile.kernel_seconds`: its fastest run, times its runs a step): a page of a
    buffer allocated anew faults in the first kernel that writes it (the temp buffer's, by the offsets of
    :func:`rematopt.xla.assignment.assign`; an output's, in the kernel that computes it), once a step, so
    in a kernel run once a step (a loop's kernel takes them in its first run, not its fastest); the
    scratch of a YNNPACK fusion glibc gives back faults in every run. The profile times a step's kernels
    with their faults; a kernel alike to one of them in a step that does not fault takes less
    (:func:`calibrate`)."""
    from .assignment import assign

    if isinstance(module, str):
        module = parse_hlo(module)
    steps = kernels(module)
    trips = {k.name: k.trip_count for k in steps}
    out = dict.fromkeys(trips, 0)
    fresh = fresh_buffers(module, temp_bytes)
    if scratch_given_back():
        for name, (pages, runs) in _scratch_runs(module, fresh).items():
            out[name] += pages * runs
    if temp_bytes > MMAP_CEILING:
        done = assign(module)
        touched = np.zeros((temp_bytes + MALLOC_HEADER) // PAGE + 1, bool)
        for v in sorted(done.offsets, key=lambda v: (done.ranges[v][0], v)):
            value = done.values[v]
            if v in done.in_outputs or value.is_tuple:
                continue
            lo = (done.offsets[v] + MALLOC_HEADER) // PAGE
            hi = min((done.offsets[v] + value.bytes - 1 + MALLOC_HEADER) // PAGE + 1, len(touched))
            new = int(np.count_nonzero(~touched[lo:hi]))
            touched[lo:hi] = True
            kernel = _writer(done.schedule, done.ranges[v][0], trips)
            if new and kernel is not None and trips[kernel] == 1:
                out[kernel] += new
    root = module.entry.root
    for index, leaf in _fresh_outputs(module):
        if leaf.bytes > MMAP_CEILING:
            computed = root.operands[index[0]] if root.opcode == "tuple" and index else root.name
            kernel = _computes(module, computed, trips)
            if kernel is not None and trips[kernel] == 1:
                out[kernel] += leaf.bytes // PAGE + 1
    return {name: n for name, n in out.items() if n}


def _writer(schedule: list[Instruction], position: int, trips: dict[str, int]) -> str | None:
    """The kernel that writes what the instruction at ``position`` of the flattened schedule defines:
    itself, or the first kernel from there on (an instruction of a computation a kernel calls, which the
    flattened schedule places before its caller)."""
    for inst in schedule[position:]:
        if inst.name in trips:
            return inst.name
    return None


def _computes(module: HloModule, name: str, trips: dict[str, int]) -> str | None:
    """The kernel that computes instruction ``name``'s array: itself, or through the bitcasts and tuple
    elements that pass it on, its operand's."""
    by_name = module.by_name
    while name not in trips:
        inst = by_name.get(name)
        if inst is None or not inst.operands:
            return None
        name = inst.operands[0]
    return name


# What the per-class calibration scales apart, read from the compiled program alone. On quick gpt's plain
# step, profiled kernel by kernel against their price on the measured rates (docs/device.md): lone dots
# (Eigen) 37.5 / 41.5 ms, matrix fusions (YNNPACK) 98.9 / 42.1, loop fusions 28.4 / 9.2, transposing
# kernels 53.7 / 3.3; a class is the first of these that holds.
KERNEL_CLASSES = ("lone dot", "matrix fusion", "transposing", "loop fusion", "other")
# A class under this share of the plain step's profiled or priced time takes the global scale: its own
# would be the ratio of two small figures (every class of quick gpt's and keras_llama's plain steps is
# 4% or more of both).
MIN_CLASS_SHARE = 0.02


def kernel_class(kernel: Kernel) -> str:
    """Its class in :data:`KERNEL_CLASSES`: a lone dot or convolution (XLA's CPU leaves them to Eigen),
    a fusion or library call on the matrix units, a kernel that moves data across dimensions
    (``Kernel.transposes``), another fusion, anything else (copies, lone elementwise ops)."""
    if kernel.kind in LONE_KINDS:
        return "lone dot"
    if on_matrix_units(kernel):
        return "matrix fusion"
    if kernel.transposes:
        return "transposing"
    return "loop fusion" if kernel.kind.startswith("fusion") else "other"


@dataclass(frozen=True)
class Calibration:
    """A profile scaled to one measured step: a step takes ``scale x`` its kernels' time on ``device``
    (``launch_s`` more per kernel run) plus ``fault_s`` per page fault; with ``class_scales``, each
    kernel class (:func:`kernel_class`) its own scale, ``scale`` for a class without one. The scales
    absorb what the micro-benchmarks miss (the kernels' sizes, caches, strided reads); the fault price
    is the kernel's (the operating system's) work, measured, not scaled, but lowered where the calibrated
    step took less than its kernels and its faults at that price (:func:`calibrate`)."""

    device: Device
    scale: float
    launch_s: float
    fault_s: float
    calibrated_on: str
    class_scales: tuple[tuple[str, float], ...] = ()
    # (signature, seconds): each kernel of the calibrated step at its profiled time (:func:`calibrate`'s
    # ``per_kernel``), scaled down where the step took less than its kernels did, profiled
    measured_kernels: tuple[tuple[Kernel, float], ...] = ()
    # seconds per byte of a step's footprint (its compiled peak): what a step measured among other
    # programs' steps takes beyond its kernels as profiled step after step (:func:`calibrate`'s ``footprint``)
    footprint_s: float = 0.0

    def class_seconds(self, step: StepCost) -> dict[str, float]:
        """``step``'s kernels on the profile, unscaled, per class."""
        return _by_class(step, lambda k: kernel_cost(k, self.device, self.launch_s).seconds)

    def kernel_seconds(self, step: StepCost) -> float:
        """``step``'s kernels on the profile, unscaled."""
        return sum(self.class_seconds(step).values())

    def scaled(self, step: StepCost) -> dict[str, float]:
        """``step``'s predicted kernel seconds per class: a kernel alike in :func:`signature` to one of the
        calibrated step's at that one's measured time, any other priced at its class's scale (the one
        scale where the calibration has no class scales)."""
        scales, measured = dict(self.class_scales), dict(self.measured_kernels)

        def seconds(k: Kernel) -> float:
            t = measured.get(signature(k)) if measured else None  # the verify loop prices without a table
            if t is not None:
                return t
            return scales.get(kernel_class(k), self.scale) * kernel_cost(k, self.device, self.launch_s).seconds
        return _by_class(step, seconds)

    def seconds(self, step: StepCost, faults: int = 0, footprint: int = 0) -> float:
        """The predicted time of ``step``, whose runs fault ``faults`` pages (:func:`step_faults`) and whose
        compiled peak is ``footprint`` bytes."""
        return sum(self.scaled(step).values()) + faults * self.fault_s + footprint * self.footprint_s


def profiled_by_class(step: StepCost, profiled: dict[str, float]) -> dict[str, float]:
    """``profiled`` (seconds per kernel name, :func:`rematopt.xla.profile.kernel_seconds`) summed over
    ``step``'s kernels per class (:func:`kernel_class`); a kernel the profile lacks counts 0."""
    return _by_class(step, lambda k: profiled.get(k.name, 0.0))


def _by_class(step: StepCost, seconds: Callable[[Kernel], float]) -> dict[str, float]:
    """``seconds`` of each of ``step``'s kernels, summed per class (:func:`kernel_class`)."""
    out: dict[str, float] = {}
    for k in step.kernels:
        c = kernel_class(k.kernel)
        out[c] = out.get(c, 0.0) + seconds(k.kernel)
    return out


def signature(kernel: Kernel) -> Kernel:
    """What prices ``kernel`` (its kind, bytes, transposition, strided and serial work, trip count, and
    on the matrix units its FLOPs), its names left out: kernels alike in it are one kernel to the price.
    A vector kernel's FLOPs are left out too: its bytes bound it, and a plan's tie adds an element's
    arithmetic to a kernel the plain step runs (keras_llama's SiLU gradient, then alike to the plain
    step's, which the profile timed at a fifth of its price on the strided grid, docs/device.md)."""
    return replace(kernel, name="", op_names=(), computation="",
                   flops=kernel.flops if on_matrix_units(kernel) or kernel.kind in LONE_KINDS else 0)


def calibrate(step: StepCost, measured_s: float, device: Device, faults: int = 0, launch_s: float = 0.0,
              fault_s: float = 0.0, name: str = "plain", profiled: dict[str, float] | None = None,
              per_kernel: bool = False, footprint: int = 0, profiled_faults: dict[str, int] | None = None,
              fault_in_s: float = 0.0) -> Calibration:
    """Scale ``device`` so that ``step`` (which faults ``faults`` pages a run) is priced at ``measured_s``:
    the one figure taken from a measured step. Calibrate on one step and predict the others.

    With ``profiled`` (seconds per kernel name, :func:`rematopt.xla.profile.kernel_seconds` on the same
    step), one scale per kernel class: the kernels' measured time (``measured_s`` less the faults) is
    shared among the classes as the profile shares it, and each class is scaled to its share. A class
    under :data:`MIN_CLASS_SHARE` of the profile or of the price takes the global scale (and its share at
    that scale is taken out first), so the step is still priced at ``measured_s``; with one class this is
    the one-scale calibration.

    With ``profiled`` and ``per_kernel``, the step's own kernels are a table instead: each kernel of
    ``step`` the profile timed is priced at its profiled time (the mean over the kernels alike in
    :func:`signature`), one it did not at the profile's own scale on the device; a kernel of another step
    alike to one of them takes its time, any other that scale. A plan's prediction is then the plain
    step's measured time with the kernels the plan removes taken out at what they took and the ones it
    adds priced (keras_llama's plain step's softmax-backward fusions run 1.6 times their price, its
    rotary transposes 2.2 times; the one scale spread that over all the plans add). Not the class
    scales: fitted on one profile, they were the worst of four calibrations over the 48 plans of four
    full runs (docs/device.md, "The full run"). The profile runs the step again and again, with its
    memory in the caches; the bench times it among other programs' steps, which push that memory out.
    What the measured step takes beyond its kernels goes with the memory it touches: given the step's
    ``footprint`` (its compiled peak, bytes), it is priced per byte of that (:attr:`Calibration.footprint_s`;
    keras_llama's steps measured after a 1 GiB sweep took 0.09 to 0.13 ms a MB of their peak longer than
    back to back, docs/device.md). Where the step took less than its kernels profiled and its faults at
    ``fault_s`` (a price measured on another step, or the micro-benchmark's), its faults are priced at
    what it left them (:attr:`Calibration.fault_s`): the fourteenth full run's flax_linen `apply_plan, no
    remat` took 48.7 ms beside its faults at the plain step's 1.8 us where its kernels profiled 51.2, and
    its plans, which fault none and ran at their own profiles' times, were predicted 3.3 to 4.1 points
    fast with its kernels scaled down instead, 0.1 to 1.1 so (over five runs, repriced, never worse).
    Only a step under its kernels alone scales every kernel down to it (without a footprint, every kernel
    is scaled to the step). The profile times a kernel with the page faults its
    writes take (``profiled_faults``, :func:`profiled_faults`); each is taken out of its time at
    ``fault_in_s`` (the fault alone, :attr:`rematopt.xla.machine.Machine.fault_in_s`; ``fault_s`` where 0), so
    that a kernel alike to it in a step that does not fault is priced without them, and a step that faults
    pays its own at ``fault_s`` (flax_linen's plain step at the bench's size, 13,147 faults a step: with
    them its kernels profiled 60.4 ms, 47.5 without, and the per-layer policy's step was predicted 15% fast,
    5% with them taken out, docs/device.md)."""
    unscaled = Calibration(device, 1.0, launch_s, fault_s, name)
    priced, rest = unscaled.class_seconds(step), measured_s - faults * fault_s
    kernels = sum(priced.values())
    if kernels <= 0 or rest <= 0:
        raise ValueError(f"cannot calibrate on {name}: {measured_s * 1e3:.3g} ms measured, of which "
                         f"{faults * fault_s * 1e3:.3g} ms page faults, {kernels * 1e3:.3g} ms of kernels priced")
    scale = rest / kernels
    if profiled is None:
        return replace(unscaled, scale=scale)
    if per_kernel:
        taken = fault_in_s or fault_s
        faulted = profiled_faults or {}
        profiled = {k: max(t - faulted.get(k, 0) * taken, FAULTED_FLOOR * t) for k, t in profiled.items()}
        return _per_kernel(unscaled, step, kernels, rest, profiled, footprint, faults)
    measured = profiled_by_class(step, profiled)
    total = sum(measured.values())
    if total <= 0:
        raise ValueError(f"cannot calibrate {name} per class: its profile has no kernel time")
    own = [c for c in priced if measured.get(c, 0.0) >= MIN_CLASS_SHARE * total
           and priced[c] >= MIN_CLASS_SHARE * kernels]
    left = rest - scale * sum(s for c, s in priced.items() if c not in own)
    profiled_own = sum(measured[c] for c in own)
    scales = tuple((c, left * measured[c] / profiled_own / priced[c]) for c in own)
    return replace(unscaled, scale=scale, class_scales=scales)


# What a faulting kernel keeps of its profiled time at least once its faults are taken out: flax_linen's
# plain step's copy.233 profiled 0.414 ms with 1,024 faults, 0.054 without (13%): less than one fault's
# price in the micro-benchmark each.
FAULTED_FLOOR = 0.1


def _per_kernel(unscaled: Calibration, step: StepCost, priced: float, rest: float, profiled: dict[str, float],
                footprint: int, faults: int) -> Calibration:
    """``unscaled`` with ``step``'s profiled kernels as its table (:func:`calibrate`'s ``per_kernel``): the
    kernels the profile lacks at its scale on the device (``priced``: all of ``step``'s kernels on it);
    ``rest``, the step's measured time less its ``faults`` at their price, beyond those kernels' time priced
    per byte of ``footprint``; short of it, the faults priced at what the kernels leave them, and below the
    kernels alone, every kernel scaled down to the step."""
    timed = [k.kernel for k in step.kernels if k.kernel.name in profiled]
    total = sum(profiled[k.name] for k in timed)
    if total <= 0:
        raise ValueError(f"cannot calibrate {unscaled.calibrated_on} per kernel: its profile has no kernel time")
    timed_price = sum(kernel_cost(k, unscaled.device, unscaled.launch_s).seconds for k in timed)
    warm = total / timed_price
    kernels = total + warm * (priced - timed_price)
    fault_s, measured = unscaled.fault_s, rest + faults * unscaled.fault_s
    if rest < kernels and faults and fault_s:  # under its kernels and its faults: the faults cost it less
        fault_s, rest = max(measured - kernels, 0.0) / faults, min(measured, kernels)
    factor, footprint_s = (1.0, (rest - kernels) / footprint) if footprint and rest > kernels else (rest / kernels, 0.0)
    alike: dict[Kernel, list[float]] = {}
    for k in timed:
        alike.setdefault(signature(k), []).append(profiled[k.name])
    return replace(unscaled, scale=factor * warm, footprint_s=footprint_s, fault_s=fault_s,
                   measured_kernels=tuple((sig, factor * sum(t) / len(t)) for sig, t in alike.items()))


def beside(first: Calibration, then: Calibration) -> Calibration:
    """``first`` (a per-kernel calibration) with ``then``'s profiled kernels where none of its own is alike
    (:func:`signature`), at ``then``'s times; any other kernel at ``first``'s scale. rematopt's plans are
    priced on ``apply_plan``'s program of the plan that recomputes nothing first, whose kernels (its ties,
    its sums written once) they share, and on the plain step's for the rest (docs/device.md, "Calibrated
    on apply_plan's own program")."""
    own = {sig for sig, _ in first.measured_kernels}
    return replace(first, measured_kernels=first.measured_kernels
                   + tuple((sig, t) for sig, t in then.measured_kernels if sig not in own))


# The balance of the machine's FLOP rate to its bandwidth, against the data sheet's, is searched
# over this grid (10^-4 .. 10^4, 40 points a decade); for each, the rest of the fit is linear.
BALANCES = np.logspace(-4, 4, 321)


def fit(steps: Sequence[StepCost], measured_s: Sequence[float], names: Sequence[str]) -> Fit:
    """Fit ``compute``, ``memory`` and ``launch_s`` (:class:`Fit`) to ``steps`` (all priced on the same
    data-sheet profile), which took ``measured_s``: least squares on the relative error of each step's
    predicted time, every parameter non-negative. As many parameters as the steps tell apart: three
    distinct programs or more fit all three; two fit the two factors (no launch cost); one scales every
    rate by one factor.

    A step's time, ``sum_k max(compute * c_k, memory * m_k) + launch_s * n`` (``c_k``, ``m_k``: kernel
    k's compute and memory seconds on the data sheet, ``n``: kernels run), is linear in ``memory`` and
    ``launch_s`` once the balance ``compute / memory`` is fixed: each balance of :data:`BALANCES` is
    solved exactly (non-negative least squares), and the best refined between its neighbours."""
    if not steps or len(steps) != len(measured_s) or len(steps) != len(names):
        raise ValueError(f"fit needs one measured time per step, got {len(steps)} steps, {len(measured_s)} times")
    if any(t <= 0 for t in measured_s) or any(s.seconds <= 0 for s in steps):
        raise ValueError(f"cannot fit on steps of {[s.seconds for s in steps]} s predicted, {list(measured_s)} s measured")
    device = steps[0].device
    if any(s.device != device for s in steps):
        raise ValueError("fit: the steps are priced on different profiles")
    sides = [np.array([_sides(k.kernel, device) for k in s.kernels]).reshape(-1, 2) for s in steps]
    trips = [np.array([k.kernel.trip_count for k in s.kernels], dtype=float) for s in steps]
    launches = np.array([t.sum() for t in trips])
    measured = np.asarray(measured_s, dtype=float)
    distinct = len({(len(s.kernels), s.bytes_moved, s.flops) for s in steps})

    def roofline(balance: float) -> np.ndarray:
        """Each step's seconds with ``memory`` = 1 and ``compute`` = ``balance``, no launch cost."""
        return np.array([np.maximum(balance * sd[:, 0], sd[:, 1]) @ tr for sd, tr in zip(sides, trips)])

    def solve(balance: float) -> tuple[float, np.ndarray]:
        columns = [roofline(balance)] + ([launches] if distinct >= 3 else [])
        x, norm = _nnls(np.stack(columns, axis=1) / measured[:, None], np.ones(len(steps)))
        return (norm if x.any() else np.inf), x

    grid = BALANCES if distinct > 1 else np.array([1.0])
    norms = [solve(b)[0] for b in grid]
    i = int(np.argmin(norms))
    if not np.isfinite(norms[i]):
        raise ValueError("fit: no positive rates price these steps at their measured times")
    balance = float(grid[i])
    if distinct > 1:  # between the grid's neighbours of the best point
        u = _golden(lambda u: solve(float(np.exp(u)))[0], np.log(grid[max(i - 1, 0)]),
                    np.log(grid[min(i + 1, len(grid) - 1)]))
        if solve(float(np.exp(u)))[0] <= norms[i]:
            balance = float(np.exp(u))
    x = solve(balance)[1]
    memory, launch = float(x[0]), float(x[1]) if len(x) > 1 else 0.0
    compute = balance * memory

    def rate(sheet: float, factor: float) -> float:  # a factor of 0: the kernels' work did not show in the times
        return sheet / factor if factor > 0 else math.inf

    vector = None if device.vector_flops_per_s is None else rate(device.vector_flops_per_s, compute)
    fitted = replace(device, name=f"{device.name}@fitted", flops_per_s=rate(device.flops_per_s, compute),
                     bytes_per_s=rate(device.bytes_per_s, memory), vector_flops_per_s=vector,
                     source=f"{device.source}; fitted to {', '.join(names)}: FLOPs x{rate(1, compute):.4g}, "
                            f"bytes x{rate(1, memory):.4g} of the data sheet, {launch * 1e6:.3g} us per kernel")
    errors = tuple(float(e) for e in (memory * roofline(balance) + launch * launches) / measured - 1)
    return Fit(fitted, compute, memory, launch, tuple(names), errors)


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares for a few columns: the optimum is the unconstrained fit on its own
    support, so the best non-negative one over every subset of columns is it."""
    best = (np.zeros(a.shape[1]), float(np.linalg.norm(b)))
    for mask in range(1, 2 ** a.shape[1]):
        cols = [j for j in range(a.shape[1]) if mask >> j & 1]
        sub = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (sub >= 0).all():
            x = np.zeros(a.shape[1])
            x[cols] = sub
            norm = float(np.linalg.norm(a @ x - b))
            if norm < best[1]:
                best = (x, norm)
    return best


def _golden(f, lo: float, hi: float, steps: int = 80) -> float:
    """Golden-section search for the minimum of ``f`` on [lo, hi] (f unimodal there)."""
    g = (np.sqrt(5) - 1) / 2
    a, b = lo + (1 - g) * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - g) * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2
