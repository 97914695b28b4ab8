"""What a compiled step costs on a device: each kernel XLA launches priced as a roofline.

A kernel's time is ``max(flops / FLOP rate, (bytes read + bytes written) / bandwidth)``, times the
number of times it runs (a kernel inside a while loop: the loop's trip count). A fused group of
equations is one kernel, so it moves its inputs and outputs once; that is what the per-equation
graph model got wrong (on the H200 fixture its elementwise work priced at about 52 ms where XLA's
fused kernels take about 12 ms). Dots, convolutions and library calls run on the matrix units
(``Device.flops_per_s``); everything else on the vector units (``Device.vector_flops_per_s``).

A recomputation is priced by compiling the planned step and pricing its kernels: what XLA fused
into existing kernels grows them, what it could not fuse adds kernels.

:func:`calibrate` scales a profile so a measured step's predicted time matches the measurement;
the same scale then prices every other variant of that step on that machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..importers.costmodel import Device
from .hlo import HloModule, parse_hlo
from .kernels import Kernel, kernels

# Kernels that run on the matrix units: library GEMM / convolution calls, lone dots and
# convolutions, and the fusions XLA builds around them (GPU: kOutput, kCustom for Triton GEMMs).
MATRIX_KINDS = ("custom-call:", "dot", "convolution", "fusion:kOutput", "fusion:kCustom")


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


def kernel_cost(kernel: Kernel, device: Device) -> KernelCost:
    rate = device.flops_per_s if on_matrix_units(kernel) else (device.vector_flops_per_s or device.flops_per_s)
    compute = kernel.flops / rate
    memory = (kernel.bytes_read + kernel.bytes_written) / device.bytes_per_s
    return KernelCost(kernel, max(compute, memory) * kernel.trip_count, "compute" if compute > memory else "memory")


def step_cost(module: HloModule | str, device: Device) -> StepCost:
    """Price every kernel of ``module`` (a parsed module, or ``compiled.as_text()``) on ``device``."""
    if isinstance(module, str):
        module = parse_hlo(module)
    return StepCost(device, tuple(kernel_cost(k, device) for k in kernels(module)))


def calibrate(device: Device, predicted: StepCost, measured_s: float, where: str) -> Device:
    """``device`` with every rate scaled by one factor so ``predicted`` takes ``measured_s``: the
    balance of FLOPs to bytes stays the data sheet's, the absolute speed becomes the machine's.
    ``where`` says what was measured (it goes into the profile's source)."""
    if predicted.seconds <= 0 or measured_s <= 0:
        raise ValueError(f"cannot calibrate on a step of {predicted.seconds} s predicted, {measured_s} s measured")
    scale = predicted.seconds / measured_s
    vector = None if device.vector_flops_per_s is None else device.vector_flops_per_s * scale
    return replace(device, name=f"{device.name}@calibrated", flops_per_s=device.flops_per_s * scale,
                   bytes_per_s=device.bytes_per_s * scale, vector_flops_per_s=vector,
                   source=f"{device.source}; every rate x{scale:.4g} so that {where} takes {measured_s:.4g} s")
