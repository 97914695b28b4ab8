"""The roofline cost model both program front ends (JAX, MLIR) share.

An op's cost in seconds is ``max(flops / peak FLOP/s, bytes moved / memory
bandwidth)`` on a device profile: an op is bound by whichever of the two it
exhausts first. FLOPs come from the op's shapes: ``2 x output elements x
contracted size`` for matmul-like ops, one per element for elementwise ops and
reductions, :data:`TRANSCENDENTAL_FLOPS` per element for transcendental ones.
Bytes moved are the op's operand bytes plus its result bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    flops_per_s: float  # matrix units (tensor cores, MXU): dots and convolutions
    bytes_per_s: float
    source: str
    # Vector units (elementwise work, reductions) where they are slower than the matrix
    # units; None: the same rate. Only the compiled-kernel pricing (rematopt.xla.cost) uses it.
    vector_flops_per_s: float | None = None
    # Lone dot and convolution kernels where they run slower than the fused GEMMs; None: the matrix
    # rate. XLA's CPU runs a dot it leaves out of its YNNPACK fusions (the weight gradients' transposed
    # operands) through Eigen, at 15 to 44 GFLOP/s on this machine's core where YNNPACK's GEMMs run 65 to
    # 107 (widths 32 to 128, rematopt.xla.machine), and a lone convolution too (the bench's unet: 26.8
    # GFLOP/s, its YNNPACK convolution fusions 104). Measured, never a data sheet's figure.
    dot_flops_per_s: float | None = None
    # Lone dots' rates by shape, where measured: (rows, columns, contracted, FLOP/s) over a grid, a dot
    # priced between its points (rematopt.xla.cost.grid_value). Eigen's rate on this machine's core
    # spans 5 to 90 GFLOP/s over that grid (rematopt.xla.machine), and the models' weight gradients
    # (256 x 1,024 contracting 1,024 tokens) run at 60 where the one figure above priced them at 26.
    dot_rates: tuple[tuple[int, int, int, float], ...] = ()
    # What a transposing kernel of XLA's CPU loop emitter pays beyond its roofline for each element it
    # reads one cache line each (rematopt.xla.kernels.strided_reads), by the stride of its reads and the
    # lines a sweep reads so: (stride bytes, lines, seconds) over a grid, a kernel priced between its
    # strides and at the grid's lines at or below its own (rematopt.xla.cost.kernel_cost). Measured on the
    # core (rematopt.xla.machine); empty elsewhere.
    strided_rates: tuple[tuple[int, int, float], ...] = ()
    # What a transposing kernel of XLA's CPU loop emitter pays beyond its roofline for each transcendental
    # function it evaluates one element at a time (rematopt.xla.kernels.scalar_transcendentals): the
    # vectorized functions a streaming kernel uses run 4 times faster. Measured on the core; 0 elsewhere.
    transcendental_s: float = 0.0
    # What a YNNPACK fusion pays beyond its roofline for each element of a product it sums one at a time
    # (rematopt.xla.kernels.serial_products). Measured on the core; 0 elsewhere.
    serial_product_s: float = 0.0


# Peak dense FLOP/s at the training precision (bf16 tensor cores on GPUs; h200:
# TF32, the float32 step measured in ../shared/gpu) and memory bandwidth, from
# the vendors' data sheets.
DEVICES: dict[str, Device] = {
    "a100": Device("a100", 312e12, 2.039e12,
                   "NVIDIA A100 80GB SXM data sheet: 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e"),
    "h100": Device("h100", 989e12, 3.35e12,
                   "NVIDIA H100 SXM data sheet: 989 TFLOPS bf16 dense, 3.35 TB/s HBM3"),
    "h200": Device("h200", 494e12, 4.8e12,
                   "NVIDIA H200 SXM data sheet: 4.8 TB/s HBM3e; 989 TFLOPS TF32 tensor core with sparsity, so "
                   "494 dense (JAX's default precision runs float32 dots as TF32 there); 67 TFLOPS FP32 for "
                   "the vector units", vector_flops_per_s=67e12),
    "h100-tf32": Device("h100-tf32", 494e12, 3.35e12,
                        "NVIDIA H100 SXM data sheet: 3.35 TB/s HBM3; 989 TFLOPS TF32 tensor core with sparsity, so "
                        "494 dense (float32 dots run as TF32 by JAX's default precision); 67 TFLOPS FP32 for the "
                        "vector units", vector_flops_per_s=67e12),
    "tpu-v4": Device("tpu-v4", 275e12, 1.2e12,
                     "Google Cloud TPU v4 documentation: 275 TFLOPS bf16, 1,200 GB/s HBM2"),
    "cpu": Device("cpu", 1e12, 1e11,
                  "nominal server CPU (order of magnitude only): 1 TFLOP/s fp32 FMA, 100 GB/s DRAM"),
}
DEFAULT_DEVICE = "a100"
# The profile of a device XLA names (``device_kind``): float32 steps, which JAX runs as TF32 on these
# GPUs; any other device takes its backend's.
KINDS = (("h200", "h200"), ("h100", "h100-tf32"))
BACKENDS = {"cpu": "cpu", "gpu": "h200", "tpu": "tpu-v4"}


def profile_for(backend: str, kind: str = "") -> str:
    """The cost profile for a device of ``kind`` (``jax.devices()[0].device_kind``) on ``backend``: the
    named device's where one is known, else the backend's (calibration on a plain step fixes the
    absolute speed either way)."""
    return next((p for name, p in KINDS if name in kind.lower()), BACKENDS.get(backend, "cpu"))

# A transcendental costs several FLOPs per element on every vector unit; 10 is
# the weight XLA's cost analysis uses for them on GPUs (order of magnitude).
TRANSCENDENTAL_FLOPS = 10
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "erf", "erf_inv", "erfc", "sin", "cos",
    "tan", "atan", "atan2", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "rsqrt", "sqrt",
    "cbrt", "pow", "lgamma", "digamma", "igamma", "exponential", "exponential_minus_one", "log_plus_one",
    "sine", "cosine", "power", "gelu", "silu", "softmax", "sigmoid",
})


def device(name: str) -> Device:
    """The profile called ``name``; KeyError lists the known ones."""
    try:
        return DEVICES[name]
    except KeyError:
        raise KeyError(f"unknown device {name!r}; known: {', '.join(sorted(DEVICES))}") from None


def roofline_seconds(flops: float, bytes_moved: float, dev: Device) -> float:
    return max(flops / dev.flops_per_s, bytes_moved / dev.bytes_per_s)


def matmul_flops(out_elements: int, contracted: int) -> float:
    """dot_general / matmul: a multiply and an add per output element per contracted index."""
    return 2.0 * out_elements * contracted


def conv_flops(out_elements: int, kernel_elements: int, out_features: int) -> float:
    """Convolution: each output element reads ``kernel_elements / out_features``
    weights (spatial window x input features per group)."""
    return 2.0 * out_elements * kernel_elements / max(out_features, 1)


def elementwise_flops(op: str, elements: int) -> float:
    """Per-element ops and reductions (``elements``: the larger of input and output).
    ``op`` is the bare op name (``exp``, ``stablehlo.exponential`` -> ``exponential``)."""
    base = op.rsplit(".", 1)[-1]
    return float(elements) * (TRANSCENDENTAL_FLOPS if base in TRANSCENDENTAL else 1)


def elements(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)
