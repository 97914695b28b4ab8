"""What JAX saves for the backward pass, read through its public report
(``jax.ad_checkpoint.print_saved_residuals``)."""

from __future__ import annotations

import contextlib
import io
import math
import re
from dataclasses import dataclass

from jax.ad_checkpoint import print_saved_residuals

_LINE = re.compile(r"^(?P<dtype>[a-z]+)(?P<bits>\d*)(?P<host><host>)?\[(?P<shape>[\d,]*)\] (?P<source>.*)$")


@dataclass(frozen=True)
class Residual:
    bytes: int
    host: bool
    source: str  # "from the argument x", "named 'mlpwi' from ...", "output of tanh from ..."

    @property
    def name(self) -> str | None:
        return self.source.split("'")[1] if self.source.startswith("named '") else None


def saved_residuals(fn, *args) -> list[Residual]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    found = []
    for line in out.getvalue().splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            raise ValueError(f"unreadable residual line: {line!r}")
        itemsize = 1 if m["dtype"] == "bool" else int(m["bits"]) // 8
        elements = math.prod(int(d) for d in m["shape"].split(",") if d)
        found.append(Residual(elements * itemsize, m["host"] is not None, m["source"]))
    return found
