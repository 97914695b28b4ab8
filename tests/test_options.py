"""Planner options as frozen dataclasses: every planner's parse, bad values in
one line, and the command line derived from them (exactly their union, each
option's help naming its planners)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields

import pytest
from click.testing import CliRunner

from rematopt import planners
from rematopt.cli import cli
from rematopt.errors import PlannerError
from rematopt.importers import synthetic
from rematopt.plan import Plan
from rematopt.planners.options import NoOptions, command_line, flag, kinds, names, option, parse, spec
from rematopt.solve import solve

CLASSES = planners.options_classes()
FIELDS = [(name, f) for name in sorted(CLASSES) for f in fields(CLASSES[name])]
# The solve command's own options, not any planner's.
SOLVE_OWN = {"graph", "planner", "budget", "budget_ratio", "output", "as_json", "drop_unsafe_marks",
             "verify", "factory_settings", "argnums"}  # the last three: solve MODULE:FACTORY --verify xla


def good_value(cls, f):
    """A value of the field's type that it takes and that is not its default."""
    kind, s = kinds(cls)[f.name], spec(f)
    if s.choices is not None:
        return next(c for c in s.choices if c != f.default)
    t = kind[0]
    if t is bool:
        return not f.default
    if t is Plan:
        return Plan("g", "test", [], [])
    value = (s.minimum or 0) + 3
    return t(value if s.maximum is None else (s.minimum + s.maximum) / 2)


def bad_values(cls, f):
    """Values the field must refuse: the wrong type, and (where it has them)
    a string not among its choices and a number below its minimum."""
    kind, s = kinds(cls)[f.name], spec(f)
    out = [object()] if kind != (bool,) else ["yes"]
    if s.choices is not None:
        out.append("no-such-choice")
    if s.minimum is not None:
        out.append(s.minimum - 1)
    if s.maximum is not None:
        out.append(s.maximum + 1)
    if s.finite:
        out.append(float("inf"))
    return out


def test_every_registered_planner_has_an_options_class():
    assert set(CLASSES) == set(planners.names())
    for name, cls in CLASSES.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
        assert planners.options(name) == names(cls)
    assert names(CLASSES["greedy"]) == {"peak_model", "trim", "max_clone_expansion"}
    assert names(CLASSES["dtr"]) == {"dtr_heuristic", "dtr_thrash_limit", "time_limit"}
    for name in ("chen-sqrt", "chen-greedy", "no-remat", "jax-dots-saveable", "jax-nothing-saveable",
                 "jax-offload-dots"):
        assert CLASSES[name] is NoOptions


def test_cpsat_options_mirror_what_the_planner_reads():
    from rematopt.planners import cpsat

    assert cpsat.OPTIONS <= names(CLASSES["cpsat"])  # until cpsat reads them through its Options


@pytest.mark.parametrize("planner, f", FIELDS, ids=[f"{p}.{f.name}" for p, f in FIELDS])
def test_each_option_parses_and_bad_values_are_refused_in_one_line(planner, f):
    cls = CLASSES[planner]
    assert getattr(parse(cls, {}, planner), f.name) == f.default  # not given: the planner's default
    assert getattr(parse(cls, {f.name: None}, planner), f.name) == f.default  # None: not given
    value = good_value(cls, f)
    assert getattr(parse(cls, {f.name: value}, planner), f.name) == value
    for bad in bad_values(cls, f):
        with pytest.raises(PlannerError) as e:
            parse(cls, {f.name: bad}, planner)
        message = str(e.value)
        assert message.startswith(f"{planner}: {flag(f)[2:]} must be ") and "\n" not in message, message


def test_unknown_options_are_ignored_and_numbers_are_read_as_their_field():
    got = parse(CLASSES["greedy"], {"max_clone_expansion": 3, "objective": "peak", "dtr_heuristic": "lru"},
                "greedy")
    assert got.max_clone_expansion == 3.0 and isinstance(got.max_clone_expansion, float)
    with pytest.raises(PlannerError, match="max-clone-expansion must be a finite number >= 0, got True"):
        parse(CLASSES["greedy"], {"max_clone_expansion": True}, "greedy")


def test_options_that_exclude_each_other_are_refused_in_one_line():
    with pytest.raises(PlannerError, match="^cpsat: give --host-bandwidth or --transfer-cost-per-byte, not both$"):
        parse(CLASSES["cpsat"], {"host_bandwidth": 1e9, "transfer_cost_per_byte": 0.5}, "cpsat")
    with pytest.raises(PlannerError, match="^cpsat: host bandwidth must be > 0, got 0.0$"):
        parse(CLASSES["cpsat"], {"host_bandwidth": 0}, "cpsat")


def test_planners_refuse_a_bad_option_through_solve():
    with pytest.raises(PlannerError, match="^greedy: trim must be one of midpoint, max-clone, got 'random'$"):
        solve(synthetic.chain(4), "greedy", trim="random")
    with pytest.raises(PlannerError, match="^dtr: dtr-thrash-limit must be a number >= 0, got -1$"):
        solve(synthetic.chain(4), "dtr", dtr_thrash_limit=-1)


def test_a_planner_reads_only_the_options_it_declares():
    """What ``rematopt solve`` refuses must be exactly what a planner ignores."""

    class Recording(dict):
        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

    g = synthetic.chain(4, sinks=True)
    for name in planners.names():
        o = Recording()
        o.read = set()
        if name in ("cpsat", "jax-names"):  # a solve, or a traced step with checkpoint names: their parse
            parse(planners.options_class(name), o, name)
        else:
            planners.get(name)(g, None, o)
        assert o.read == set(planners.options(name)), name


def test_the_command_line_is_exactly_the_union_of_the_planners_options():
    union = {f.name for _, f in FIELDS if spec(f).cli is not False}
    params = {p.name: p for p in cli.commands["solve"].params}
    assert set(params) - SOLVE_OWN == union
    given = cli.commands["solve"].make_context("solve", []).params
    for name, f in FIELDS:
        if f.name in union:
            assert params[f.name].opts[0] == flag(f)
            assert given[f.name] is None  # not given: each planner applies its own default
    # progress and lp_bound are the caller's business, not the command line's
    assert {"progress", "lp_bound"} <= {f.name for _, f in FIELDS} - union
    batch = {p.name for p in cli.commands["batch"].params}
    assert union - {"hint", "log_path"} <= batch


def test_help_lists_every_option_with_the_planners_that_take_it():
    out = CliRunner().invoke(cli, ["solve", "--help"], terminal_width=200)
    assert out.exit_code == 0
    text = " ".join(out.output.split())
    options = command_line(CLASSES)
    assert {o.name for o in options} == {f.name for _, f in FIELDS if spec(f).cli is not False}
    for o in options:
        takers = sorted(p for p, cls in CLASSES.items() if o.name in names(cls))
        assert o.planners == tuple(takers)
        assert re.search(re.escape(o.flag) + r"\b.*?" + re.escape(f"{', '.join(takers)}: {' '.join(o.spec.help.split())}"),
                         text), o.flag
    assert "cpsat, greedy: compute events <= X x compute nodes" in text  # declared by both


def test_a_field_two_planners_declare_differently_is_refused():
    @dataclass(frozen=True)
    class A:
        depth: int = option(1, "as an integer.")

    @dataclass(frozen=True)
    class B:
        depth: str = option("x", "as a string.", choices=("x", "y"))

    @dataclass(frozen=True)
    class C:
        depth: int | None = option(None, "also an integer.")

    with pytest.raises(TypeError, match="option 'depth': planner 'b' declares it as one of x, y"):
        command_line({"a": A, "b": B})
    (merged,) = command_line({"a": A, "c": C})
    assert merged.planners == ("a", "c") and merged.help == "a, c: as an integer."


def test_values_read_from_text_on_the_command_line(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["solve", "--planner", "greedy", "--recompute-depth", "deep"])
    assert out.exit_code == 2 and "expected auto, full or an integer >= 0, got 'deep'" in out.output
    from rematopt.planners.cpsat.settings import recompute_depth

    assert recompute_depth("3") == 3 and recompute_depth("full") == "full"


def test_a_batch_refuses_a_bad_option_before_any_job_runs(tmp_path):
    from rematopt.studies import batch

    path = tmp_path / "chain.json"
    synthetic.chain(4).save(path)
    inputs, _ = batch.load_inputs([path])
    with pytest.raises(PlannerError, match="^dtr: dtr-heuristic must be one of h_dtr, local, got 'lru'$"):
        batch.plan_batch(inputs, ["greedy", "dtr"], [0.9], tmp_path / "out", {"dtr_heuristic": "lru"})
    # an option only some planners take is fine for the others
    ok = batch.plan_batch(inputs, ["greedy", "dtr"], [1.0], tmp_path / "out", {"dtr_heuristic": "local"})
    assert [s["planner"] for s in ok.specs] == ["greedy", "dtr"]
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
