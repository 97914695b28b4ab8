"""Sizes as people type and read them: ``2M``, ``1E9``, ``1.5GiB`` in, and
``12,345 (12.1 KiB)`` out.

A single letter (``K``, ``M``, ``G``, ``T``, as ``dd`` and ``sort -S`` read
them) and the ``KiB`` family are powers of 1024; ``KB``, ``MB``, ``GB``,
``TB`` are powers of 1000 (SI). Case is ignored.
"""

from __future__ import annotations

import math
import re

from .errors import BudgetError

_UNITS = {"": 1, "b": 1}
for _k, _letter in enumerate("kmgt", start=1):
    _UNITS[_letter] = _UNITS[_letter + "i"] = _UNITS[_letter + "ib"] = 2 ** (10 * _k)
    _UNITS[_letter + "b"] = 10 ** (3 * _k)
_SIZE = re.compile(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def parse_bytes(text: str) -> int:
    """``"1048576"``, ``"2M"``, ``"1E9"``, ``"1.5GiB"``, ``"512MB"`` -> bytes
    (floored). Raises BudgetError for anything else."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if unit not in _UNITS:
        raise BudgetError(f"cannot read {text!r} as a size in bytes (e.g. 1048576, 2M, 1E9, 1.5GiB, 512MB)")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise BudgetError(f"size {text!r} is too large")
    return math.floor(value)


def human_bytes(n: int) -> str:
    """Three significant digits in the largest binary unit that keeps the
    number >= 1: ``12,345`` -> ``"12.1 KiB"``, ``512`` -> ``"512 B"``."""
    k = 0
    value = float(abs(n))
    while value >= 1024 and k < len(_BINARY) - 1:
        value /= 1024
        k += 1
    sign = "-" if n < 0 else ""
    if k == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.3g} {_BINARY[k]}" if value < 1000 else f"{sign}{value:.0f} {_BINARY[k]}"


def with_human(n: int) -> str:
    """The exact count and its human reading: ``"12,345 (12.1 KiB)"``."""
    return f"{n:,}" if abs(n) < 1024 else f"{n:,} ({human_bytes(n)})"
