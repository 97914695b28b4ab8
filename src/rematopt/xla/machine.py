"""What this machine's core does, measured: the rates the ``cpu`` profile prices kernels at, and what a
page fault costs.

The ``cpu`` profile's data-sheet figures are nominal (order of magnitude only), and fitting three
rates to a model's three to five baseline steps is under-determined (the fit priced quick gpt's bytes
at 1,760 times the data sheet and keras_llama's kernels at 0 us each). Here each figure is measured
by a micro-benchmark on the core the steps run on, with the step's own clock (process CPU time):
jitted GEMMs for the matrix rate (XLA's CPU runs them as YNNPACK fusions), the same GEMMs with both
operands transposed for the lone dots it leaves to Eigen (weight gradients), as one figure (for its
lone convolutions) and on a grid of shapes (for its dots: the rate moves 16-fold with the shape), a
long elementwise chain in cache (independent streams of it) for the vector rate, a large elementwise
op for the bandwidth, a chain of tiny kernels for what starting a kernel costs, a transposing kernel
with and without sines and cosines for a transcendental function evaluated one element at a time
(:func:`rematopt.xla.kernels.scalar_transcendentals`), sums of arrays written transposed and in order
for an element read one cache line each (:func:`rematopt.xla.kernels.strided_reads`), a sum of products
with and without a size-1 dimension for an element of a product YNNPACK sums one at a time
(:func:`rematopt.xla.kernels.serial_products`), and fresh anonymous pages, written and given back,
for a page fault (XLA's CPU runtime takes its temp buffer from malloc each step; above glibc's mmap
threshold the kernel zero-fills every page of it on first touch and unmaps it when it is freed,
:func:`rematopt.xla.cost.step_faults`).
"""

from __future__ import annotations

import ctypes
import mmap
import resource
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..importers.costmodel import Device, device
from .cost import PAGE, Calibration

# GEMMs as the bench models run them: 1,024 rows (tokens) by widths 32 to 128; each rate is the median
# over the grid. Eigen's lone dots ranged 15.4 .. 44.0 GFLOP/s over it (median 28), and 17 .. 42 at
# 4,096 rows, so the rows add nothing. The in-cache chain, the streamed array and the fault region are
# sized to run in milliseconds.
GEMM_ROWS, GEMM_WIDTHS = 1024, (32, 64, 128)
# Lone dots as weight gradients make them (both operands contracted over their rows), on a grid of rows,
# columns and contracted size: Eigen's rate is no one figure. On the core it ran 5 to 90 GFLOP/s over
# this grid, and quick gpt's and the bench's weight gradients (256 x 1,024 and 256 x 256 from 1,024
# tokens) 58 to 64 in the step, where the median over GEMM_WIDTHS (26) priced them: the lone dots came
# to 2.2 times their profiled time, and the one scale calibrated over them took it from every other
# kernel (docs/device.md). 108 dots, about a second.
DOT_SIZES, DOT_CONTRACTED = (32, 64, 128, 256, 512, 1024), (64, 256, 1024)
CHAIN_ELEMENTS, CHAIN_OPS = 1 << 14, 64
# The chain runs as independent streams, as XLA's fused kernels compute several values per element: one
# dependent chain measured the latency of an operation, 30.1 GFLOP/s, where 4 / 8 / 16 / 32 streams ran
# 49.8 / 67.6 / 60.0 / 65.3 and quick flax_linen's threefry fusions 112 to 118 and its largest
# multiply-add fusion 79 (profiled in the step); priced at one chain's rate, its per-layer policies'
# recomputed elementwise kernels looked 2 to 4 times their profiled time.
CHAIN_STREAMS = 8
# The stream reads 8 MB and writes them into a donated buffer of its own (16 MB in all, as a step's
# kernels read and write its temp buffer in the 32 MiB L3): 59 to 65 GB/s over three processes. Writing
# a fresh output instead faulted its 2,048 pages on every call while glibc served it from mmap (4 to
# 29 GB/s on a fresh process) and on none once glibc's threshold had risen (44.5 and 67 GB/s in two
# bench runs): the rate moved with the process's malloc history.
STREAM_BYTES = 8 << 20
TINY_KERNELS = 64
# Rotary embeddings as keras-hub's Llama fuses them into the transposition of q and k: [batch, tokens,
# heads, width] times the sin and cos of a [tokens, width] table, heads swapped with tokens. With a
# batch of 8 (quick keras_llama's), 32 and 128, a sin or cos cost 0.93 to 0.99 ns an element so, 0.24
# to 0.26 in the same fusion without the transposition; 32 runs in about 0.3 ms.
ROTARY = (32, 128, 4, 8)
# Strided reads (xla.kernels.strided_reads) as the bench models' transposing kernels make them: k
# [1024, c] arrays (tokens by width, slices of one buffer, as a step's lie in its temp buffer) times a
# [c] vector and summed, written transposed to [c, 1024] (stride 4c bytes, sweep 1,024 elements),
# against the same sum written in order; over widths 64, 128, 256 and k from one array to as many as the
# bench's gpt's largest residual-gradient transpose reads (46). One price for the lines a cache keeps
# and one for those it does not (as many arrays as the prefetcher follows, 16) missed both ends: gpt's
# 1 KiB strides over 8 to 46 arrays took 2.4 to 4.2 ns an element in its step, priced at 1.4.
STRIDED_ROWS, STRIDED_WIDTHS, STRIDED_ARRAYS = 1024, (64, 128, 256), (1, 8, 16, 48)
# A sum of products as keras-hub's attention gradient makes it (xla.kernels.serial_products): [1, 2048, 128]
# against [2048, 128], summed over the last dimension; on the core 0.70 and 0.08 ms, 2.3 ns more an element
# (2.6 at [1, 8, 4, 128, 128], 2.1 at [1, 65536]).
SERIAL_SHAPE = (1, 2048, 128)
# 64 MiB faulted and given back: about 35 ms. Nine of them, as three read 1.90 to 2.26 us on the idle core.
FAULT_BYTES, FAULT_SAMPLES = 64 << 20, 9


@dataclass(frozen=True)
class Machine:
    """One core's measured rates (per second) and per-event costs (seconds)."""

    flops_per_s: float  # jitted float32 GEMMs (YNNPACK fusions)
    dot_flops_per_s: float  # the same GEMMs with transposed operands (lone dots, Eigen)
    vector_flops_per_s: float  # elementwise arithmetic on data in cache
    bytes_per_s: float  # an elementwise op streaming its input and output
    launch_s: float  # one more kernel in a step
    fault_s: float  # one minor page fault (a fresh page, zero-filled), and the page given back
    transcendental_s: float = 0.0  # a transcendental function evaluated one element at a time
    serial_product_s: float = 0.0  # beyond the roofline, an element of a product YNNPACK sums one at a time
    dot_rates: tuple[tuple[int, int, int, float], ...] = ()  # lone dots by (rows, columns, contracted)
    # beyond the roofline, an element read one cache line each, by (stride bytes, lines a sweep reads)
    strided_rates: tuple[tuple[int, int, float], ...] = ()
    # of fault_s, the fault alone: what the kernel whose write faults the page takes (the page is given back
    # outside the kernels); 0 where not measured (then all of fault_s)
    fault_in_s: float = 0.0

    def __post_init__(self):  # read back from JSON, the tables' rows are lists
        for table in ("dot_rates", "strided_rates"):
            object.__setattr__(self, table, tuple(tuple(r) for r in getattr(self, table)))

    def device(self) -> Device:
        """The ``cpu`` profile with this machine's rates."""
        return Device("cpu@measured", self.flops_per_s, self.bytes_per_s,
                      f"measured on this machine: {self.describe()}", vector_flops_per_s=self.vector_flops_per_s,
                      dot_flops_per_s=self.dot_flops_per_s, strided_rates=self.strided_rates,
                      serial_product_s=self.serial_product_s, transcendental_s=self.transcendental_s,
                      dot_rates=self.dot_rates)

    def price(self) -> Calibration:
        """Its rates as a price of a compiled step (:meth:`rematopt.xla.cost.Calibration.seconds`),
        unscaled: kernels on :meth:`device`, plus what a kernel launch, a transcendental element and a
        page fault cost. ``--verify xla``'s loop chooses among fitting candidates by it."""
        return Calibration(self.device(), 1.0, self.launch_s, self.fault_s, "unscaled")

    def describe(self) -> str:
        by_shape = f" (convolutions; dots by shape {_span(self.dot_rates, 1e-9)})" if self.dot_rates else ""
        return (f"GEMM {self.flops_per_s / 1e9:.3g} GFLOP/s, lone dot {self.dot_flops_per_s / 1e9:.3g} GFLOP/s{by_shape}, "
                f"vector {self.vector_flops_per_s / 1e9:.3g} GFLOP/s, {self.bytes_per_s / 1e9:.3g} GB/s, "
                f"{self.launch_s * 1e6:.3g} us a kernel, {self.transcendental_s * 1e9:.3g} ns a transcendental "
                f"element by element, {_span(self.strided_rates, 1e9)} ns more an element read across a line"
                f"{_axes(self.strided_rates)}, {self.serial_product_s * 1e9:.3g} ns more an element "
                f"of a product summed one at a time, {self.fault_s * 1e6:.3g} us a page faulted and given back "
                f"({self.fault_in_s * 1e6:.3g} of them the fault's)")


def _span(table: tuple[tuple[float, ...], ...], unit: float) -> str:
    values = [row[-1] * unit for row in table] or [0.0]
    return f"{min(values):.3g} to {max(values):.3g}"


def _axes(strided: tuple[tuple[int, int, float], ...]) -> str:
    """The strided grid's extent, as measured."""
    if not strided:
        return ""
    strides, lines = [row[0] for row in strided], [row[1] for row in strided]
    return f" (strides {min(strides)} to {max(strides)} B, sweeps of {min(lines):,} to {max(lines):,} lines)"


# Lone dots' GFLOP/s on the core (:func:`steady`, 2026-12-06): per contracted size, a row per
# DOT_SIZES of rows, a column per DOT_SIZES of columns.
_REFERENCE_DOTS = {
    64: ((5.4, 9.9, 17.4, 24.3, 32.5, 39.3), (9.9, 17.6, 29.5, 39.1, 48.9, 57.0),
         (17.3, 30.1, 44.5, 55.0, 67.1, 74.0), (22.8, 33.0, 51.4, 65.1, 80.1, 86.4),
         (18.8, 30.9, 49.7, 65.2, 80.9, 89.5), (16.6, 28.0, 44.7, 63.6, 79.6, 87.9)),
    256: ((16.2, 19.8, 27.6, 29.9, 35.8, 38.5), (21.0, 31.3, 40.0, 46.2, 54.9, 52.5),
          (31.6, 42.8, 54.1, 63.6, 72.6, 66.4), (31.7, 46.2, 61.7, 73.3, 83.8, 82.3),
          (21.3, 34.2, 53.0, 68.2, 83.1, 81.0), (18.3, 30.4, 48.3, 65.5, 81.9, 85.0)),
    1024: ((17.0, 15.3, 17.0, 17.7, 18.3, 16.7), (26.1, 24.6, 27.9, 30.1, 30.7, 26.3),
           (29.5, 36.8, 43.5, 46.2, 47.9, 44.8), (35.1, 41.9, 54.6, 60.6, 64.3, 60.8),
           (21.7, 33.1, 48.9, 61.1, 72.0, 70.6), (18.0, 29.8, 46.2, 62.0, 74.7, 78.5)),
}
# Strided reads' ns an element beyond the roofline, as :func:`steady` read them on 2026-12-06: per
# stride (STRIDED_WIDTHS' rows), one per STRIDED_ARRAYS.
_REFERENCE_STRIDED = {256: (0.54, 0.78, 1.40, 2.20), 512: (0.56, 1.02, 1.76, 2.79), 1024: (1.06, 2.42, 3.18, 3.80)}
# The core's figures as the full CPU bench of 9538fcc measured them (docs/device.md), the serial
# product's as :func:`measure` read it later on the same core, the lone dots' and strided reads' above
# and a page's fault with its unmapping (:func:`fault_seconds`) as :func:`steady` read them on
# 2026-12-06 (the fault alone: less the 0.29 to 0.32 us its unmapping took, fault_seconds' docstring): the price
# ``--verify xla`` uses on CPU where it is given no machine, the bench's plannings included. A fixed
# profile, so the loop's choice is the same on any load.
REFERENCE = Machine(flops_per_s=77.9e9, dot_flops_per_s=25.8e9, vector_flops_per_s=65.8e9, bytes_per_s=51.3e9,
                    launch_s=0.58e-6, fault_s=1.89e-6, fault_in_s=1.58e-6, transcendental_s=0.992e-9,
                    serial_product_s=2.38e-9,
                    dot_rates=tuple((m, n, k, gflops * 1e9) for k, rows in _REFERENCE_DOTS.items()
                                    for m, row in zip(DOT_SIZES, rows) for n, gflops in zip(DOT_SIZES, row)),
                    strided_rates=tuple((stride, k * STRIDED_ROWS, ns * 1e-9) for stride, row in _REFERENCE_STRIDED.items()
                                        for k, ns in zip(STRIDED_ARRAYS, row)))


# glibc gives a thread an arena of its own until there are more than eight, then (with the bench's one
# core) at most eight, and a thread past them shares one, the main thread's first: quick gpt's per-layer
# step then gave back less scratch (36,725 faults a step against 44,897, beside six other threads that
# had allocated). mallopt's M_ARENA_MAX raises the limit while the process has few threads yet.
M_ARENA_MAX, ARENAS = -8, 256


def isolate_steps() -> None:
    """Have JAX's CPU client run each step on the thread that calls it rather than on its dispatch
    thread, and each thread allocate from an arena of its own (:data:`ARENAS`): a step's page faults
    are then those :func:`rematopt.xla.cost.step_faults` predicts for the thread :func:`off_main_thread`
    gives it. The client reads the dispatch setting once, when JAX starts a backend, so this runs
    before: set later it changed nothing, and quick gpt's per-layer nothing_saveable step ran on the
    dispatch thread (44,897 faults a step) or, in one CI run under load, on a shared arena (36,738)."""
    import jax

    from .flags import backend_started

    if jax.config.values["jax_cpu_enable_async_dispatch"] and backend_started():
        raise RuntimeError("isolate_steps: JAX has started a backend with asynchronous CPU dispatch; "
                           "call it before anything runs on JAX")
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, ARENAS)
    except AttributeError:  # not glibc
        pass


# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def keep_pages() -> None:
    """Have glibc keep all the memory a step frees: no buffer mapped anew (``M_MMAP_MAX`` 0), none given back
    (``M_TRIM_THRESHOLD`` at its most). A step run on the main thread (whose arena grows the heap) then
    faults no page after its warm-up: the same program without the faults
    :func:`rematopt.xla.cost.step_faults` predicts, which prices them as the step pays them (``rematopt
    bench device``'s plain step with its pages kept)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    except AttributeError:  # not glibc
        pass


def off_main_thread(run: Callable[[], object]) -> object:
    """``run()`` on one fresh thread, where each step it runs executes (:func:`isolate_steps`, which
    must have run): the page faults of :func:`rematopt.xla.cost.step_faults` are those of a thread with
    an allocation arena of its own, as the bench runs steps."""
    import jax

    if jax.config.values["jax_cpu_enable_async_dispatch"]:
        raise RuntimeError("off_main_thread: JAX's CPU dispatch is asynchronous; call isolate_steps() first")
    out: list[object] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out.append(run())
        except BaseException as e:  # raised again on the calling thread
            failed.append(e)

    thread = threading.Thread(target=target, name="rematopt-step")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def fastest(*runs: Callable[[], object], repeats: int = 7,
            clock: Callable[[], float] = time.process_time) -> list[float]:
    """The fastest of ``repeats`` runs of each of ``runs`` (after one warm-up each), on ``clock``. The
    runs take turns, so a pair whose difference is a price sees the same load: timed one after the
    other, a load that came and went between them priced strided reads and transcendentals at 0 in 3
    of 12 measurements (one core busy beside the process)."""
    for run in runs:
        run()
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            start = clock()
            run()
            best[i] = min(best[i], clock() - start)
    return best


def fault_seconds(size: int = FAULT_BYTES,
                  clock: Callable[[], float] = time.process_time) -> tuple[float, float, int]:
    """(seconds a minor page fault costs, of them the fault's alone, faults counted): one write to each
    page of fresh anonymous memory, less the same writes once the pages are mapped (the fault), and the
    pages given back to the kernel, over the faults ``getrusage`` counted. Every page a step faults it
    also gives back (:func:`rematopt.xla.cost.step_faults`: a buffer glibc unmaps when freed, scratch it trims):
    unmapping took 0.29 to 0.32 us a page beside 1.7 to 1.9 for the fault, and flax_linen's plain step,
    a third of its time faulting, priced its plans 4 to 6 points slow without it (docs/device.md)."""
    import numpy as np

    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages = np.frombuffer(region, dtype=np.uint8)
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, clock()
    pages[::PAGE] = 1
    first, faults = clock() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    start = clock()
    pages[::PAGE] = 2
    again = clock() - start
    del pages
    start = clock()
    region.close()
    given_back = clock() - start
    return max(first - again + given_back, 0.0) / max(faults, 1), max(first - again, 0.0) / max(faults, 1), faults


def steady(samples: int = 3, repeats: int = 7) -> Machine:
    """Each figure the median of ``samples`` measurements (:func:`measure`): one full bench's start
    measured the vector rate at 36.5 GFLOP/s and a transcendental at 1.51 ns on the idle machine, where
    three measurements a minute later read 64.4 to 65.3 and 0.99 to 1.00 (two processes busy beside them)."""
    import dataclasses

    taken = [measure(repeats) for _ in range(samples)]
    tables = ("dot_rates", "strided_rates")
    figures = {f.name: statistics.median(getattr(m, f.name) for m in taken)
               for f in dataclasses.fields(Machine) if f.name not in tables}
    for table in tables:  # each point of a grid the median of its measurements
        figures[table] = tuple((*row[:-1], statistics.median(getattr(m, table)[i][-1] for m in taken))
                               for i, row in enumerate(getattr(taken[0], table)))
    return Machine(**figures)


# The grids' micro-benchmarks compiled, by name and operand shapes: :func:`steady` measures three times in
# one process, and compiling the 132 programs of the two grids each time took most of its 25 s.
_COMPILED: dict[tuple, object] = {}
# Each point of a grid the fastest of this many runs (after a warm-up), then the median over steady's
# samples: 120 points, which with seven runs each and a compile each sample took 25 s of steady's time.
GRID_REPEATS = 3


def measure(repeats: int = 7) -> Machine:
    """Run the micro-benchmarks on this process's core(s) with JAX's default backend (CPU)."""
    import jax
    import jax.numpy as jnp

    from .cost import step_cost
    from .hlo import parse_hlo
    from .kernels import kernels

    def step(fn, *args, key: str = "", **jit) -> tuple[Callable[[], object], object]:
        """``fn`` compiled for ``args``; with a ``key``, once a process (:data:`_COMPILED`)."""
        at = (key, *(a.shape for a in args))
        compiled = _COMPILED.get(at) if key else None
        if compiled is None:
            compiled = jax.jit(fn, **jit).lower(*args).compile()
            if key:
                _COMPILED[at] = compiled
        return (lambda: jax.block_until_ready(compiled(*args))), compiled

    def timed(fn, *args, key: str = "", runs: int = repeats) -> tuple[float, object]:
        run, compiled = step(fn, *args, key=key)
        return fastest(run, repeats=runs)[0], compiled

    def gemm_rate(transposed: bool) -> float:
        rates = []
        for k in GEMM_WIDTHS:
            for n in GEMM_WIDTHS:
                if transposed:  # contracting the rows of both: how a weight gradient reads its operands
                    a, b = jnp.ones((GEMM_ROWS, k), jnp.float32), jnp.ones((n, GEMM_ROWS), jnp.float32)
                    seconds, _ = timed(lambda a, b: jax.lax.dot_general(a, b, (((0,), (1,)), ((), ()))), a, b)
                else:
                    a, b = jnp.ones((GEMM_ROWS, k), jnp.float32), jnp.ones((k, n), jnp.float32)
                    seconds, _ = timed(lambda a, b: a @ b, a, b)
                rates.append(2 * GEMM_ROWS * k * n / seconds)
        return statistics.median(rates)

    def dot_rates() -> tuple[tuple[int, int, int, float], ...]:
        out = []
        for k in DOT_CONTRACTED:
            for m in DOT_SIZES:
                for n in DOT_SIZES:  # contracting the rows of both, as a weight gradient does
                    a, b = jnp.ones((k, m), jnp.float32), jnp.ones((n, k), jnp.float32)
                    seconds, _ = timed(lambda a, b: jax.lax.dot_general(a, b, (((0,), (1,)), ((), ()))), a, b,
                                       key="weight gradient", runs=GRID_REPEATS)
                    out.append((m, n, k, 2 * m * n * k / seconds))
        return tuple(out)

    def chain(x):
        streams = [x + i for i in range(CHAIN_STREAMS)]
        for i in range(CHAIN_OPS // CHAIN_STREAMS):
            streams = [y * 1.0001 + 0.5 if i % 2 else y * 0.9999 - 0.25 for y in streams]
        return sum(streams[1:], streams[0])

    v = jnp.ones((CHAIN_ELEMENTS,), jnp.float32)
    vector, chained = timed(chain, v)
    s = jnp.ones((STREAM_BYTES // 4,), jnp.float32)
    streamed = jax.jit(lambda x, out: x * 2.0 + 1.0, donate_argnums=1, keep_unused=True).lower(s, s).compile()
    written = [jnp.zeros_like(s)]

    def stream_once() -> None:  # into the buffer it wrote last time: no allocation, no page to fault
        written[0] = jax.block_until_ready(streamed(s, written[0]))

    stream = fastest(stream_once, repeats=repeats)[0]

    def tiny(x):  # cumulative sums do not fuse with one another: one kernel each
        for _ in range(TINY_KERNELS):
            x = jnp.cumsum(x)
        return x

    t = jnp.ones((8,), jnp.float32)
    launches, compiled = timed(tiny, t)
    n = len(step_cost(compiled.as_text(), device("cpu")).kernels)
    def rotary(trig):
        def embed(x, table):
            swap = (0, 2, 1, 3)
            if trig:
                return jnp.transpose(x * jnp.cos(table)[None, :, None] + x * jnp.sin(table)[None, :, None], swap)
            return jnp.transpose(x * table[None, :, None] + x * (0.5 * table)[None, :, None], swap)
        return embed

    x, table = jnp.ones(ROTARY, jnp.float32), jnp.full((ROTARY[1], ROTARY[3]), 0.3, jnp.float32)
    (with_trig, compiled), (without, _) = step(rotary(True), x, table), step(rotary(False), x, table)
    trig, arithmetic = fastest(with_trig, without, repeats=repeats)
    evaluated = sum(k.scalar_transcendentals for k in kernels(parse_hlo(compiled.as_text())))

    def strided(arrays: int, width: int) -> tuple[int, int, float]:
        """(stride, lines a sweep reads, seconds an element read one cache line each takes more than read
        in order)."""
        x = jnp.ones((arrays, STRIDED_ROWS, width), jnp.float32)
        w = jnp.arange(width, dtype=jnp.float32)

        def total(x, w):
            return sum((x[i] * w for i in range(1, arrays)), x[0] * w)

        (transposed, compiled), (straight, _) = (step(lambda x, w: total(x, w).T, x, w, key="strided across"),
                                                 step(total, x, w, key="strided in order"))
        across, in_order = fastest(transposed, straight, repeats=GRID_REPEATS)
        [(elements, stride, lines)] = [r for k in kernels(parse_hlo(compiled.as_text())) for r in k.strided]
        return stride, lines, max(across - in_order, 0.0) / elements

    a = jnp.ones(SERIAL_SHAPE, jnp.float32)

    def summed(a, c):
        return jnp.sum(a * c, axis=-1)

    (serial, compiled), (vectorized, _) = step(summed, a, 2 * a), step(summed, a[0], 2 * a[0])
    one_at_a_time, fast = fastest(serial, vectorized, repeats=repeats)
    products = sum(k.serial_products for k in kernels(parse_hlo(compiled.as_text())))
    samples = [fault_seconds() for _ in range(FAULT_SAMPLES)]
    faults, fault_in = (statistics.median(s[i] for s in samples) for i in (0, 1))
    return Machine(flops_per_s=gemm_rate(False), dot_flops_per_s=gemm_rate(True),
                   vector_flops_per_s=step_cost(chained.as_text(), device("cpu")).flops / vector,
                   bytes_per_s=2 * STREAM_BYTES / stream, launch_s=launches / max(n, 1), fault_s=faults,
                   fault_in_s=fault_in,
                   transcendental_s=max(trig - arithmetic, 0.0) / max(evaluated, 1),
                   serial_product_s=max(one_at_a_time - fast, 0.0) / max(products, 1), dot_rates=dot_rates(),
                   strided_rates=tuple(strided(k, c) for c in STRIDED_WIDTHS for k in STRIDED_ARRAYS))
