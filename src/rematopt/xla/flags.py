"""What XLA is told, and a record of it for every measurement.

Three settings change what a compiled step's memory is:

- the CPU scheduler: XLA's default CPU scheduler optimizes for concurrency
  and undoes rematerialization (the 8-layer GPT step of issue 35 compiled to
  the same 400.8 MB of temp plain, with per-layer ``nothing_saveable`` and
  with ``dots_saveable``; 327 / 222 / 212 MB under the memory-minimizing one);
- XLA's own rematerialization pass (``jax_compiler_enable_remat_pass``; JAX
  turns it off by adding ``rematerialization`` to ``xla_disable_hlo_passes``);
- the GPU slop factor (``xla_gpu_memory_limit_slop_factor``), which aims
  XLA's GPU remat at a share of the device's memory.

Per-compile options (``lower(...).compile(compiler_options=...)``) are used
where they take effect. With jax 0.10.2 on CPU the scheduler option is
accepted per compile but ignored (the same temp bytes either way, measured on
``models/gpt.py`` at layers=4, width=128, seq=128: 36,757,504 B with
``dots_saveable`` per compile, 27,621,376 B with ``XLA_FLAGS``), so it goes in
``XLA_FLAGS``, which XLA reads once when the backend starts: :func:`apply`
sets it before that, and refuses (:class:`XlaSettingsError`) once the backend
runs with other flags.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import jax

from ..errors import RematoptError

SCHEDULER_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"
SLOP_FLAG = "xla_gpu_memory_limit_slop_factor"
DISABLED_PASSES = "xla_disable_hlo_passes"


class XlaSettingsError(RematoptError):
    """XLA runs with other process-wide flags than a measurement needs."""


@dataclass(frozen=True)
class XlaSettings:
    """What a compile is told. ``None`` leaves XLA's default."""

    memory_scheduler: bool | None = None  # CPU: the memory-minimizing scheduler (True) or the concurrency one
    remat_pass: bool | None = None        # XLA's own rematerialization pass
    slop_factor: int | None = None        # GPU: xla_gpu_memory_limit_slop_factor
    disabled_passes: tuple[str, ...] = ()  # other HLO passes turned off (cse, say)

    def env_flags(self) -> dict[str, str]:
        """The flags that only ``XLA_FLAGS`` sets (read once, when the backend starts)."""
        if self.memory_scheduler is None:
            return {}
        return {SCHEDULER_FLAG: "false" if self.memory_scheduler else "true"}

    def compiler_options(self) -> dict[str, Any]:
        """The per-compile DebugOptions fields (``compile(compiler_options=...)``)."""
        opts: dict[str, Any] = {}
        remat = self.remat_pass if self.remat_pass is not None else bool(jax.config.jax_compiler_enable_remat_pass)
        passes = list(self.disabled_passes) + ([] if remat else ["rematerialization"])
        # this option replaces the list JAX builds from jax_compiler_enable_remat_pass, so it is
        # given whenever it differs from JAX's own
        if passes or (self.remat_pass and not jax.config.jax_compiler_enable_remat_pass):
            opts[DISABLED_PASSES] = ",".join(dict.fromkeys(passes))
        if self.slop_factor is not None:
            opts[SLOP_FLAG] = int(self.slop_factor)
        return opts


# What ``--verify xla`` compiles with on CPU: the scheduler that keeps rematerialization.
CPU_VERIFY = XlaSettings(memory_scheduler=True)

# What a compile that is only read (its memory, its program), never run, is told on CPU: no LLVM
# optimization of its kernels. XLA's HLO passes, schedule and buffer assignment come before it: with
# jax 0.10.2 the bench's four models at their quick sizes, plain and greedy's plan at 0.7, compiled to
# the same program (as_text() less its source locations) and temp bytes in 0.5 to 0.75 of the time
# (quick gpt's plan 4.4 -> 2.4 s, its plain step 1.55 -> 1.10 s). Measured on CPU only: elsewhere none.
READ_ONLY = {"xla_backend_optimization_level": 0}


def read_only_options() -> dict[str, Any]:
    """The per-compile options of a compile that is only read (:data:`READ_ONLY`), on this backend."""
    return dict(READ_ONLY) if jax.default_backend() == "cpu" else {}


def for_backend(backend: str, settings: XlaSettings | None = None) -> XlaSettings:
    """``settings`` with the CPU scheduler set to memory-minimizing on CPU
    unless the caller chose one (``--verify xla`` on CPU sets it itself)."""
    settings = settings or XlaSettings()
    if backend == "cpu" and settings.memory_scheduler is None:
        return replace(settings, memory_scheduler=True)
    return settings


def process_flags() -> dict[str, str]:
    """``XLA_FLAGS`` as ``{name: value}`` (``--name=value``; a bare ``--name`` is "true")."""
    out = {}
    for word in shlex.split(os.environ.get("XLA_FLAGS", "")):
        name, _, val = word.lstrip("-").partition("=")
        out[name] = val if _ else "true"
    return out


def backend_started() -> bool:
    from jax._src import xla_bridge  # no public query; reading it starts nothing

    return bool(xla_bridge.backends_are_initialized())


def apply(settings: XlaSettings) -> None:
    """Put ``settings``' process-wide flags in ``XLA_FLAGS``: before the backend
    starts they take effect; after, XlaSettingsError unless they already hold."""
    want = settings.env_flags()
    have = process_flags()
    missing = {k: v for k, v in want.items() if have.get(k, "").lower() != v}
    if not missing:
        return
    if backend_started():
        flags = " ".join(f"--{k}={v}" for k, v in want.items())
        raise XlaSettingsError(f"XLA already runs without {flags}; set XLA_FLAGS='{flags}' before JAX starts "
                               "(or run the measurement in a fresh process)")
    words = [w for w in shlex.split(os.environ.get("XLA_FLAGS", ""))
             if w.lstrip("-").partition("=")[0] not in missing]
    os.environ["XLA_FLAGS"] = " ".join(words + [f"--{k}={v}" for k, v in missing.items()])


def compile_jitted(jitted: Callable, args: Sequence, settings: XlaSettings, read_only: bool = False):
    """``jitted.lower(*args).compile(...)`` under ``settings`` (whose
    process-wide flags must hold: :func:`apply`); ``read_only``: the compiled
    step is only read, never run (:data:`READ_ONLY`)."""
    apply(settings)
    options = {**settings.compiler_options(), **(read_only_options() if read_only else {})}
    return jitted.lower(*args).compile(compiler_options=options or None)


def record(settings: XlaSettings) -> dict[str, Any]:
    """What XLA was told, for a measurement's JSON: the settings as asked, the
    process's ``XLA_FLAGS``, the per-compile options, and where it ran."""
    flags = process_flags()
    scheduler = flags.get(SCHEDULER_FLAG, "").lower()
    backend = jax.default_backend()
    return {
        "backend": backend,
        "jax": jax.__version__,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "compiler_options": settings.compiler_options(),
        "cpu_scheduler": (None if backend != "cpu" else
                          "memory-minimizing" if scheduler == "false" else "concurrency-optimized (default)"),
        "remat_pass": (settings.remat_pass if settings.remat_pass is not None
                       else bool(jax.config.jax_compiler_enable_remat_pass)),
        "slop_factor": settings.slop_factor if settings.slop_factor is not None else flags.get(SLOP_FLAG),
        "disabled_passes": list(settings.disabled_passes),
    }


def describe(rec: dict[str, Any]) -> str:
    """One line for a report: what XLA was told (from :func:`record`)."""
    parts = [f"XLA ({rec['backend']}, jax {rec['jax']})"]
    if rec.get("cpu_scheduler"):
        parts.append(f"scheduler {rec['cpu_scheduler']}")
    parts.append("remat pass " + ("on" if rec["remat_pass"] else "off"))
    if rec.get("slop_factor") is not None:
        parts.append(f"slop factor {rec['slop_factor']}")
    if rec.get("disabled_passes"):
        parts.append("passes off: " + ",".join(rec["disabled_passes"]))
    return ", ".join(parts)
