"""Planner options: each planner declares what it reads as one frozen
dataclass, ``Options``, whose fields are made by :func:`option`. Everything
else is derived from those classes: which options a planner takes
(:func:`names`, so ``rematopt solve`` can refuse the others), the checked
values it runs with (:func:`parse`, one line of error for a bad one), and the
command-line options of ``rematopt solve`` and ``rematopt batch``
(:func:`command_line`: the union over the planners, each with its help and
the planners that take it).

A value of None means "not given", so a planner applies its own default;
``rematopt solve`` passes None for every option not on its command line.
"""

from __future__ import annotations

import math
import numbers
import types
import typing
from dataclasses import dataclass, fields
from functools import lru_cache
from dataclasses import field as _field
from typing import Any, Callable, Iterable, Mapping

from ..errors import PlannerError

_SPEC = "rematopt.option"


@dataclass(frozen=True)
class Spec:
    """What :func:`option` records about a field, besides its default."""

    help: str
    choices: tuple[str, ...] | None = None  # allowed strings
    cli: str | bool | None = None  # flag spelling ("--log"); None: "--" + dashed name; False: no flag
    minimum: float | None = None  # numbers: at least this
    maximum: float | None = None  # numbers: at most this
    finite: bool = False  # numbers: not infinite
    from_text: Callable[[str], Any] | None = None  # reads the value from the command line's text


def option(default: Any, help: str, *, choices: Iterable[str] | None = None, cli: str | bool | None = None,
           minimum: float | None = None, maximum: float | None = None, finite: bool = False,
           from_text: Callable[[str], Any] | None = None) -> Any:
    """A field of an options class: its default, a one-line ``help``, the
    strings it takes (``choices``), the flag that sets it (``cli``; False
    keeps it off the command line), the least and greatest numbers it takes
    (``minimum``, ``maximum``; ``finite`` to refuse infinity), and for values
    not read as a plain number or string, ``from_text`` (ValueError for bad text)."""
    spec = Spec(help, tuple(choices) if choices is not None else None, cli, minimum, maximum, finite, from_text)
    return _field(default=default, metadata={_SPEC: spec})


def spec(f: Any) -> Spec:
    return f.metadata[_SPEC]


def names(cls: type) -> frozenset[str]:
    """The options ``cls`` declares: what its planner reads."""
    return frozenset(f.name for f in fields(cls))


def flag(f: Any) -> str:
    """The command-line spelling of field ``f``, e.g. ``--max-clone-expansion``."""
    cli = spec(f).cli
    return cli if isinstance(cli, str) else "--" + f.name.replace("_", "-")


@lru_cache(maxsize=None)
def kinds(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field's accepted types, None left out (None always means "not given")."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        tp = hints[f.name]
        args = typing.get_args(tp) if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union \
            else (tp,)
        out[f.name] = tuple(a for a in args if a is not type(None))
    return out


def describe(kind: tuple[type, ...], s: Spec) -> str:
    """What a field takes, as an error message says it: "one of auto, full or
    an integer >= 0", "a finite number >= 0"..."""
    parts = []
    if s.choices is not None:
        parts.append("one of " + ", ".join(s.choices))
    for t in kind:
        if t is str and s.choices is not None:
            continue
        what = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(t, f"a {t.__name__}")
        if t is float and s.finite:
            what = "a finite number"
        if t in (int, float) and s.minimum is not None and s.maximum is not None:
            what += f" from {s.minimum:g} to {s.maximum:g}"
        elif t in (int, float) and s.minimum is not None:
            what += f" >= {s.minimum:g}"
        elif t in (int, float) and s.maximum is not None:
            what += f" <= {s.maximum:g}"
        parts.append(what)
    return " or ".join(parts)


def _accepts(t: type, value: Any, s: Spec) -> Any:
    """``value`` as type ``t`` (an int for a float field becomes a float), or
    ``_REFUSED``."""
    if t is bool:
        return value if isinstance(value, bool) else _REFUSED
    if t in (int, float):
        ok = isinstance(value, numbers.Integral if t is int else numbers.Real) and not isinstance(value, bool)
        if not ok or (s.finite and not math.isfinite(value)) or (s.minimum is not None and not value >= s.minimum) \
                or (s.maximum is not None and not value <= s.maximum):
            return _REFUSED
        return t(value)
    if t is str:
        return value if isinstance(value, str) and (s.choices is None or value in s.choices) else _REFUSED
    return value if isinstance(value, t) else _REFUSED


_REFUSED = object()


def parse(cls: type, options: Mapping[str, Any], planner: str) -> Any:
    """An instance of ``cls`` from ``options``: the fields it declares, each
    checked (type, choices, range) and None taken as not given; keys it does
    not declare are ignored (a batch gives every planner the same options).
    Raises PlannerError with one line naming the planner and the option. The
    class's own ``__post_init__`` checks (options that exclude each other...)
    raise ValueError, reported the same way."""
    values = {}
    for f in fields(cls):
        value = options.get(f.name)
        if value is None:
            continue
        kind, s = kinds(cls)[f.name], spec(f)
        for t in kind:
            got = _accepts(t, value, s)
            if got is not _REFUSED:
                values[f.name] = got
                break
        else:
            raise PlannerError(f"{planner}: {flag(f)[2:]} must be {describe(kind, s)}, got {value!r}")
    try:
        return cls(**values)
    except ValueError as e:
        raise PlannerError(f"{planner}: {e}") from None


@dataclass(frozen=True)
class CliOption:
    """One command-line option of ``rematopt solve``, merged over the planners
    that declare the field."""

    name: str  # the field, and the keyword the command passes on
    flag: str
    kind: tuple[type, ...]
    spec: Spec
    planners: tuple[str, ...]

    @property
    def help(self) -> str:
        return f"{', '.join(self.planners)}: {self.spec.help}"


def command_line(classes: Mapping[str, type], exclude: Iterable[str] = ()) -> list[CliOption]:
    """The union of the option fields of ``classes`` (planner name -> options
    class), one entry per field, in the order first declared (planners by
    name), leaving out fields declared ``cli=False`` and those in ``exclude``.
    A field several planners declare must have the same type, choices and
    flag in each (TypeError otherwise: one option cannot mean two things)."""
    out: dict[str, CliOption] = {}
    for planner in sorted(classes):
        cls = classes[planner]
        for f in fields(cls):
            s = spec(f)
            if s.cli is False or f.name in exclude:
                continue
            kind = kinds(cls)[f.name]
            seen = out.get(f.name)
            if seen is None:
                out[f.name] = CliOption(f.name, flag(f), kind, s, (planner,))
                continue
            if (seen.kind, seen.spec.choices, seen.flag) != (kind, s.choices, flag(f)):
                raise TypeError(f"option {f.name!r}: planner {planner!r} declares it as {describe(kind, s)} "
                                f"({flag(f)}), planner {seen.planners[0]!r} as {describe(seen.kind, seen.spec)} "
                                f"({seen.flag})")
            out[f.name] = CliOption(seen.name, seen.flag, seen.kind, seen.spec, seen.planners + (planner,))
    return list(out.values())


@dataclass(frozen=True)
class NoOptions:
    """The options of a planner that takes none."""
