"""How long each kernel of a compiled step took, as XLA's runtime recorded it.

``jax.profiler`` records every kernel (thunk) the CPU runtime runs as an event named after its HLO
instruction, so a compiled step's kernels (:func:`rematopt.xla.kernels.kernels`) can be timed one by
one inside the real program: the measurement that says which kernels the roofline misprices (on quick
gpt's plain step, transposing loop fusions took 16 times their price until their strided reads were
priced, 1.3 times after; lone dots 0.9 times, docs/device.md). Wall time: pin the process to one core and keep the machine otherwise quiet, or
take the fastest of several steps, as :func:`kernel_seconds` does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .hlo import parse_hlo
from .kernels import kernels


def kernel_seconds(compiled, args, steps: int = 5) -> dict[str, float]:
    """Per kernel of ``compiled`` (a ``jax.stages.Compiled``) run on ``args``: the fastest of ``steps``
    runs, in seconds, times its trip count (a kernel inside a while loop runs that many times a step).
    Kernels the profile did not record (none on CPU with jax 0.10.2) are left out."""
    import jax

    jax.block_until_ready(compiled(*args))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(steps):
                jax.block_until_ready(compiled(*args))
        trace = next(Path(folder).rglob("*.xplane.pb"))
        durations: dict[str, list[int]] = {}
        for plane in jax.profiler.ProfileData.from_file(str(trace)).planes:
            for line in plane.lines:
                for event in line.events:
                    durations.setdefault(event.name, []).append(event.duration_ns)
    out = {}
    for k in kernels(parse_hlo(compiled.as_text())):
        if k.name in durations:  # a while loop's body kernel runs trip_count times a step
            runs = sorted(durations[k.name])
            out[k.name] = runs[0] * k.trip_count / 1e9
    return out
