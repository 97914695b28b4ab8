"""The fuzz (issues 20 and 37): random graphs through every planner in the
registry and every setting, and mutated files through the command line.

The default suite runs a bounded number of examples from a fixed seed
(``fuzzing.default_seed``, printed in pytest's header), the same on every
run. ``pytest -m slow`` runs the campaign: at least ``REMATOPT_FUZZ_RUNS``
(default 10,000) graph x planner x budget runs from a new seed (or
``REMATOPT_FUZZ_SEED``'s), counted, with its figures and seed written to
``REMATOPT_FUZZ_REPORT`` (a JSON path) when that is set.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import Phase, example, given, seed, settings
from hypothesis import strategies as st

import fuzzing
from fuzzing import FUZZ, KNOWN, Tally, fuzz_graph, graphs
from rematopt import planners
from rematopt.cli import main

SLOW_RUNS = int(os.environ.get("REMATOPT_FUZZ_RUNS", "10000"))
PROFILE, SEED = fuzzing.default_seed()


def rematopt(*args) -> tuple[int, str, str]:
    """The console entry point in this process (click's CliRunner): exit
    status, stdout, stderr. An exception other than the exit escapes, so a
    traceback fails the test."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _), \
            mock.patch.object(sys, "argv", ["rematopt", *map(str, args)]), \
            mock.patch.object(warnings, "showwarning", warnings.showwarning):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        return code, out.getvalue().decode(), err.getvalue().decode()


def no_new_violations(violations, seed_=SEED) -> None:
    assert not violations, "\n".join([f"fuzz seed {seed_} (REMATOPT_FUZZ_SEED={seed_} draws these examples again)",
                                      *map(str, violations)])


# -- planners on random graphs ------------------------------------------------------


def test_every_planner_in_the_registry_is_fuzzed():
    fuzzed = {p for p, _, _ in fuzzing.fast_settings() + fuzzing.cpsat_settings(None)}
    assert fuzzed == set(planners.available())


@seed(SEED)
@settings(FUZZ, max_examples=150)
@given(g=graphs(), fractions=st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_fast_planners_keep_every_invariant(g, fractions):
    no_new_violations(fuzz_graph(g, fractions, cpsat=False, tally=Tally()))


@seed(SEED)
@settings(FUZZ, max_examples=12)
@given(g=graphs(max_nodes=12), fractions=st.lists(st.floats(0, 1), max_size=1))
def test_cpsat_keeps_every_invariant(g, fractions):
    no_new_violations(fuzz_graph(g, fractions, cpsat=True, tally=Tally()))


@pytest.mark.slow
@pytest.mark.timeout(0)  # hours for a long campaign; the suite's per-test limit is for hangs
def test_campaign():
    """At least SLOW_RUNS runs, each graph's runs at once; violations are
    tallied (the report file is rewritten after every graph, so a long run
    can be watched) and every one of a check not in KNOWN fails at the end."""
    tally, new = Tally(), []
    report = os.environ.get("REMATOPT_FUZZ_REPORT")
    first = fuzzing.campaign_seed()
    print(f"rematopt fuzz campaign: seed {first}")

    # A graph makes at least 14 runs (9 fast settings and 5 of cpsat at one budget or more).
    @seed(first)
    @settings(FUZZ, max_examples=SLOW_RUNS // 10 + 1, phases=[Phase.generate])
    @given(g=graphs(), fractions=st.lists(st.floats(0, 1), min_size=1, max_size=2))
    def campaign(g, fractions):
        if tally.runs < SLOW_RUNS:
            new.extend(fuzz_graph(g, fractions, cpsat=True, tally=tally))
            if report:
                Path(report).write_text(json.dumps({"seed": first, **tally.summary(), "known": KNOWN}, indent=1)
                                        + "\n")

    campaign()
    assert tally.runs >= SLOW_RUNS
    no_new_violations(new, first)


# -- mutated files through the command line -----------------------------------------

BIG, DEEP = "__5000_digits__", "__nested_100000__"
NASTY = [None, True, False, -1, 0, 1.5, "abc", "1e3", [], {}, [1], {"a": 1}, 2**63, 2**64 + 55, 1e30, 1e308,
         -1e308, float("nan"), float("inf"), BIG, DEEP]
GRAPH = {
    "format": "rematopt.graph/1", "name": "m",
    "nodes": [
        {"id": 0, "name": "x", "op": "input", "kind": "input", "bytes": 8, "cost": 0},
        {"id": 1, "name": "w", "op": "param", "kind": "input", "bytes": 4, "cost": 0, "persistent": True},
        {"id": 2, "name": "a", "op": "dot", "bytes": 16, "cost": 1.5e-9, "phase": "forward", "recompute": True},
        {"id": 3, "name": "b", "op": "rng", "bytes": 8, "cost": 2e-6, "recomputable": False, "phase": "forward"},
        {"id": 4, "name": "c", "op": "add", "bytes": 4, "cost": 3e-12, "offloadable": False, "phase": "backward"},
        {"id": 5, "name": "d", "op": "add", "bytes": 4, "cost": 0.5, "output": True, "phase": "backward"},
    ],
    "edges": [[0, 2], [1, 2], [2, 3], [3, 4], [2, 4], [4, 5], [1, 5]],
    "order": [0, 1, 2, 3, 4, 5],
    "meta": {"cost_unit": "s", "budget_bytes": 40},
}
CHECKMATE = {"directed": True, "multigraph": False, "graph": {"name": "cm"},
             "nodes": [{"id": i, "name": f"n{i}", "cost_ram": 8 * (i + 1), "cost_cpu": i + 1, "backward": i > 2}
                       for i in range(5)],
             "links": [{"source": i, "target": i + 1} for i in range(4)] + [{"source": 0, "target": 4}]}
MOCCASIN = {"directed": True, "graph": {"order": ["a", "b", "c", "d"]},
            "nodes": [{"name": k, "out_cost": 10 + i, "duration": 2 + i, "param_cost": 3 * (i % 2)}
                      for i, k in enumerate("abcd")],
            "links": [{"0": "a", "1": "b"}, {"0": "b", "1": "c"}, {"0": "c", "1": "d"}, {"0": "a", "1": "d"}]}
MLIR_DIR = Path(__file__).parent / "data" / "mlir"
MLIR_FILES = ["chain.mlir", "chain_marked.mlir", "budget_measured.mlir", "remat.mlir", "call.mlir"]


def paths_of(doc, prefix=()):
    """Every path to a value inside a JSON document, the root included."""
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield from paths_of(v, prefix + (k,))


@st.composite
def json_mutations(draw, doc):
    """``doc`` with 1-3 values replaced by nasty ones, deleted, or given a
    nasty sibling; as text (the huge literal and the deep nesting are spliced
    in as text), maybe truncated."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in paths_of(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        how = draw(st.sampled_from(["replace", "delete", "add"]))
        value = copy.deepcopy(draw(st.sampled_from(NASTY)))  # a later "add" may grow it
        if how == "replace":
            parent[path[-1]] = value
        elif how == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["bytes", "cost", "order", "edges", "meta", "links", "graph", "id",
                                         "recompute", "recomputable", "budget_bytes", "events", "node"]))] = value
        else:
            parent.append(value)
    text = json.dumps(doc).replace(json.dumps(BIG), "7" * 5000).replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)
    if draw(st.integers(0, 9)) == 0:
        text = text[:draw(st.integers(0, len(text)))]
    return text


def one_line_or_success(code: int, err: str, path: Path, allowed=(0, 3)) -> None:
    """Exit 0 or 3 (or 1 from simulate), else 2 with one line naming ``path``."""
    if code in allowed:
        return
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    lines = [ln for ln in lines if not ln.startswith("rematopt: warning:")]
    assert len(lines) == 1 and lines[0].startswith("rematopt: ") and str(path) in lines[0], err


GRAPH_COMMANDS = [
    ["inspect", "{f}", "--json"],
    ["solve", "{f}", "-p", "greedy", "--json"],
    ["solve", "{f}", "-p", "no-remat", "--budget-ratio", "0.9", "--json", "-o", "{out}"],
    ["solve", "{f}", "-p", "cpsat", "--time-limit", "1", "--workers", "1", "--json", "-o", "{out}"],
]


def _graph_with(edit):
    d = copy.deepcopy(GRAPH)
    edit(d)
    return json.dumps(d)


# Issue 20, section 7: each ended in a traceback; each is one line and exit 2.
ISSUE_CASES = {
    "order float": _graph_with(lambda d: d.update(order=[0, 1, 2.0, 3, 4, 5])),
    "order null": _graph_with(lambda d: d.update(order=[0, 1, None, 3, 4, 5])),
    "order list": _graph_with(lambda d: d.update(order=[0, 1, [2], 3, 4, 5])),
    **{f"budget_bytes {v!r}": _graph_with(lambda d, v=v: d["meta"].update(budget_bytes=v))
       for v in ("abc", "1e3", float("nan"), [1], {"a": 1}, -1)},
    "links a number": json.dumps({**CHECKMATE, "links": 5}),
    "graph a list": json.dumps({**CHECKMATE, "graph": [1, 2]}),
    **{f"bytes {v!r}": _graph_with(lambda d, v=v: d["nodes"][2].update(bytes=v)) for v in (2**63, 2**64 + 55, 1e30)},
    "bytes of 5000 digits": _graph_with(lambda d: d["nodes"][2].update(bytes=BIG)).replace(json.dumps(BIG), "9" * 5000),
    "cost 1e308": _graph_with(lambda d: d["nodes"][2].update(cost=1e308)),
    # issue 28: an OverflowError (int too large to convert to float) with a traceback
    "cost of 400 digits": _graph_with(lambda d: d["nodes"][2].update(cost=BIG)).replace(json.dumps(BIG), "9" * 400),
    "costs summing to infinity": _graph_with(lambda d: [d["nodes"][k].update(cost=1e308) for k in (2, 4, 5)]),
    "nested 100,000 deep": '{"format": "rematopt.graph/1", "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "no bytes": _graph_with(lambda d: d["nodes"][2].pop("bytes")),
    "no cost": _graph_with(lambda d: d["nodes"][2].pop("cost")),
    "no edges": _graph_with(lambda d: d.pop("edges")),
    "REMAT_EFFECTFUL": _graph_with(lambda d: d["nodes"][3].update(recompute=True)),
}


@pytest.mark.parametrize("case", ISSUE_CASES)
@pytest.mark.parametrize("command", GRAPH_COMMANDS[:3], ids=["inspect", "greedy", "no-remat"])
def test_issue_inputs_are_one_line_and_exit_2(tmp_path, case, command):
    f = tmp_path / "g.json"
    f.write_text(ISSUE_CASES[case])
    code, _, err = rematopt(*[a.format(f=f, out=tmp_path / "p.json") for a in command])
    one_line_or_success(code, err, f, allowed=())
    assert not (tmp_path / "p.json").exists()


@seed(SEED)
@settings(FUZZ, max_examples=250)
@given(data=st.data(), base=st.sampled_from([GRAPH, CHECKMATE, MOCCASIN]), command=st.sampled_from(GRAPH_COMMANDS))
def test_mutated_graph_files_are_one_line_and_exit_2(tmp_path_factory, data, base, command):
    d = tmp_path_factory.mktemp("m")
    f = d / "g.json"
    f.write_text(data.draw(json_mutations(base)))
    code, _, err = rematopt(*[a.format(f=f, out=d / "p.json") for a in command])
    one_line_or_success(code, err, f)
    if code != 0:
        assert not (d / "p.json").exists()


@seed(SEED)
@settings(FUZZ, max_examples=100)
@given(data=st.data(), cpsat=st.booleans())
def test_mutated_plan_files_are_one_line_and_exit_2(tmp_path_factory, data, cpsat):
    from rematopt import Graph
    from rematopt.reference import no_remat_plan

    d = tmp_path_factory.mktemp("m")
    g, f, p = Graph.from_dict(GRAPH), d / "g.json", d / "plan.json"
    g.save(f)
    p.write_text(data.draw(json_mutations(no_remat_plan(g).to_dict())))
    if cpsat:
        code, _, err = rematopt("solve", f, "--hint", p, "--budget", "40", "--time-limit", "1", "--workers", "1")
        one_line_or_success(code, err, p)
    else:
        code, _, err = rematopt("simulate", f, p, "--json")
        one_line_or_success(code, err, p, allowed=(0, 1))


@st.composite
def mlir_mutations(draw):
    """A test MLIR file with 1-3 text mutations: a dimension made huge (1e22
    elements), an element type changed, an attribute given a nasty value or
    added, a line dropped or repeated, or the text truncated."""
    lines = (MLIR_DIR / draw(st.sampled_from(MLIR_FILES))).read_text().splitlines()
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["dim", "dtype", "attr", "drop", "repeat"]))
        line = lines[k]
        if how == "dim":  # every value of the shape, so the types still agree
            lines = [ln.replace("16x16", "100000000000x100000000000").replace("256x256", "100000000000x100000000000")
                     for ln in lines]
            continue
        elif how == "dtype":
            line = line.replace("f32", draw(st.sampled_from(["i1", "f64", "complex<f32>", "index", "f8E4M3FN"])))
        elif how == "attr" and " : tensor" in line and "=" in line:
            attr = draw(st.sampled_from(["tessera.recompute", "tessera.residual.retained_bytes = 1.0e300 : f64",
                                         "tessera.residual.retained_bytes = -5 : i64",
                                         "tessera.residual.retained_bytes = 0x7FF0000000000000 : f64",
                                         "tessera.remat_cost_ns = 1.0e308 : f64",
                                         'tessera.autodiff.phase = "sideways"']))
            head, _, tail = line.partition(" : tensor")
            line = head.split(" {")[0] + " {" + attr + "} : tensor" + tail
        elif how == "drop":
            line = ""
        elif how == "repeat":
            line = line + "\n" + line
        lines[k] = line
    text = "\n".join(lines)
    if draw(st.integers(0, 9)) == 0:
        text = text[:draw(st.integers(0, len(text)))]
    return text


HUGE_MLIR = """func.func @main(%x: tensor<100000000000x100000000000xf32>) -> tensor<100000000000x100000000000xf32> {
  %a = math.exp %x : tensor<100000000000x100000000000xf32>
  return %a : tensor<100000000000x100000000000xf32>
}
"""


@seed(SEED)
@settings(FUZZ, max_examples=80)
@given(text=mlir_mutations(), command=st.sampled_from(GRAPH_COMMANDS[:3]))
@example(text=HUGE_MLIR, command=GRAPH_COMMANDS[1])  # 1e22 elements: a traceback in solve (issue 20)
def test_mutated_mlir_files_are_one_line_and_exit_2(tmp_path_factory, text, command):
    pytest.importorskip("jax")
    d = tmp_path_factory.mktemp("m")
    f = d / "g.mlir"
    f.write_text(text)
    code, _, err = rematopt(*[a.format(f=f, out=d / "p.json") for a in command])
    one_line_or_success(code, err, f)


# -- exit statuses ------------------------------------------------------------------


@seed(SEED)
@settings(FUZZ, max_examples=25)
@given(g=graphs(max_nodes=12), fraction=st.floats(0, 1), planner=st.sampled_from(["greedy", "chen-greedy", "dtr",
                                                                                "no-remat", "cpsat"]))
def test_exit_status_says_whether_there_is_a_plan(tmp_path_factory, g, fraction, planner):
    """0 and a plan file exactly when there is a plan (a heuristic's that
    misses the budget included: OVER_BUDGET); else 3 and no file. A budget
    below the lower bound is bad input (2) to cpsat, which would prove it
    impossible, and an OVER_BUDGET plan from a heuristic, which takes any."""
    from rematopt.reference import no_remat_peak, peak_lower_bound

    d = tmp_path_factory.mktemp("s")
    f, out = d / "g.json", d / "p.json"
    g.save(f)
    lo, hi = peak_lower_bound(g), no_remat_peak(g)
    budget = lo + int(fraction * (hi - lo))
    extra = ["--time-limit", "1", "--workers", "1"] if planner == "cpsat" else []
    code, stdout, err = rematopt("solve", f, "-p", planner, "--budget", budget, "-o", out, "--json", *extra)
    info = json.loads(stdout)
    planned = info["peak_bytes"] is not None
    assert info["has_plan"] is planned and code == (0 if planned else 3), (code, err)
    assert out.exists() is planned and info["plan"] == (str(out) if planned else None)
    if planned:
        code, stdout, _ = rematopt("simulate", f, out, "--json")
        assert code == 0 and json.loads(stdout)["peak_bytes"] == info["peak_bytes"]
        assert (info["peak_bytes"] <= budget) is (info["status"] != "OVER_BUDGET")
    else:
        assert f"{f}: no plan ({info['status']}" in err and "not written" in err
    if lo > 0:
        code, stdout, err = rematopt("solve", f, "-p", planner, "--budget", lo - 1, "-o", out, "--json", *extra)
        if planner == "cpsat":
            assert code == 2 and "below the lower bound" in err and len(err.strip().splitlines()) == 1
        else:
            assert code == 0 and json.loads(stdout)["status"] == "OVER_BUDGET"


def test_infeasible_is_exit_3_without_a_plan_file(tmp_path):
    """cpsat proves that no plan meets a budget above the working-set bound:
    exit 3, one line, no file (issue 20: it exited 0 and wrote an empty plan)."""
    from rematopt import Graph, Node

    # a cannot be recomputed and d reads it, so a, b and c are resident
    # together (16 B), though no working set exceeds 12 B.
    g = Graph("inf", [Node(0, "x", kind="input", bytes=0), Node(1, "a", bytes=4, cost=1, recomputable=False),
                      Node(2, "b", bytes=8, cost=1), Node(3, "c", bytes=4, cost=1),
                      Node(4, "d", bytes=4, cost=1, output=True)],
              [(0, 1), (1, 2), (2, 3), (3, 4), (1, 4)])
    f, out = tmp_path / "g.json", tmp_path / "p.json"
    g.save(f)
    code, stdout, err = rematopt("solve", f, "--budget", 12, "--time-limit", "5", "--workers", "1", "-o", out,
                                 "--json")
    assert json.loads(stdout)["status"] == "INFEASIBLE" and code == 3 and not out.exists()
    assert len(err.strip().splitlines()) == 1 and "no plan (INFEASIBLE" in err


# -- the known cpsat faults ---------------------------------------------------------

FUZZ_DATA = Path(__file__).parent / "data" / "fuzz"
PROOF_S = 10.0  # cpsat proves these tiny cases at once; the margin is for a loaded machine


def _runs(name, budget_list, labels, limit=PROOF_S):
    """The fuzz's runs on a minimal graph it found."""
    from rematopt import load

    g = load(FUZZ_DATA / name)
    with mock.patch.dict(fuzzing.CPSAT, time_limit=limit):
        return fuzzing.violations_of(g, fuzzing.run_graph(g, budget_list, labels))


def _tie_broken_both_ways():
    """Two OPTIMAL runs whose plans tie in model units, each hinted with the
    other budget's plan: the looser budget's OPTIMAL costs more."""
    from rematopt import load, solve

    g = load(FUZZ_DATA / "real_cost_optimal_beaten.json")
    opts = dict(fuzzing.CPSAT, offload=True, time_limit=PROOF_S)
    cheap = solve(g, "cpsat", budget=131210, **opts).plan
    dear = solve(g, "cpsat", budget=114688, **opts).plan
    runs = [fuzzing.run_one(g, "cpsat", "cpsat offload", 114688, dict(opts, hint=cheap)),
            fuzzing.run_one(g, "cpsat", "cpsat offload", 131210, dict(opts, hint=dear))]
    return fuzzing.violations_of(g, runs)


def _beaten_by_cleaned():
    """Issue 37: hinted with a plan of chen-greedy's, cpsat answers OPTIMAL;
    its own plan cleaned of dead computations costs less (as does dtr's)."""
    from rematopt import load
    from rematopt.plan import Plan

    g, budget = load(FUZZ_DATA / "optimal_beaten_by_cleaned_plan.json"), 1049966
    hint = Plan.load(FUZZ_DATA / "optimal_beaten_by_cleaned_plan.hint.json")
    runs = fuzzing.run_graph(g, [budget], False)
    runs.append(fuzzing.run_one(g, "cpsat", "cpsat hint", budget, dict(fuzzing.CPSAT, time_limit=PROOF_S, hint=hint)))
    return fuzzing.violations_of(g, runs)


def _infeasible_under_a_cap():
    """Issue 37: in peak mode under a 0.1% overhead cap, cpsat proves a budget
    infeasible (on a model whose memory is rounded down) that its own plan at
    a looser budget meets exactly."""
    from rematopt import load

    g = load(FUZZ_DATA / "infeasible_peak_cap.json")
    opts = dict(fuzzing.CPSAT, time_limit=PROOF_S, objective="peak", max_overhead=0.001)
    runs = [fuzzing.run_one(g, "cpsat", "cpsat peak overhead<=0.001", b, opts) for b in (1514575742491, 1514919904930)]
    return fuzzing.violations_of(g, runs)


# check -> the minimal case the fuzz found (commands in /work/briefs/fuzz_findings.md)
CASES = {
    # Hinted with the best fast plan (jax-offload-dots'), cpsat returns it; unhinted,
    # it does so too when its search stops first, which depends on the machine's speed.
    "settings[offload]": lambda: _runs("offload_without_offload.json", [162], ["cpsat hint"], limit=1.0),
    "optimal beaten[peak]": lambda: _runs("peak_optimal_beaten_by_greedy.json", [88046829568, 116460594108],
                                          ["cpsat peak"]),
    "optimal beaten[overhead, real costs]": lambda: _runs("real_cost_optimal_beaten.json", [114688, 131210],
                                                          ["cpsat offload"]),
    "monotone[real costs]": _tie_broken_both_ways,
    "settings[overhead cap, real costs]": lambda: _runs("overhead_cap_rounded_away.json", [75497472],
                                                        [f"cpsat peak overhead<={fuzzing.MAX_OVERHEAD:g}"]),
    "optimal beaten[cleaned plan]": _beaten_by_cleaned,
    "crash[nothing to compute]": lambda: _runs("nothing_to_compute.json", [12, 20], True),
    "infeasible[peak]": _infeasible_under_a_cap,
}


@pytest.mark.parametrize("check", [pytest.param(c, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                                                     reason=KNOWN[c]))
                                   if c in KNOWN else c for c in CASES])
def test_each_fault_the_fuzz_found_stays_fixed(check):
    """Each fault a campaign found, on its minimal graph. A known one (in
    KNOWN) is a strict xfail: once cpsat keeps the check, this passes, the
    suite fails, and the entry leaves KNOWN (and the fuzz holds cpsat to it)."""
    found = [v for v in CASES[check]() if v.check == check]
    assert not found, "\n".join(map(str, found))


def test_every_known_fault_has_a_case():
    assert set(KNOWN) <= set(CASES)


# Faults of the fast planners that campaigns found (issue 37), each fixed, on
# its minimal graph: file -> the fuzz setting that failed on it.
FAST_CASES = {
    "rotor_already_resident.json": "rotor",  # recomputed an output where it was resident
    "jax_names_unoffloadable.json": "jax-names offload",  # offloaded a value that may not be offloaded
}


@pytest.mark.parametrize("name", FAST_CASES)
def test_each_fast_planner_fault_stays_fixed(name):
    """The setting that failed, at budgets from the working-set bound to the
    no-remat peak: every invariant kept, a plan at the peak."""
    from rematopt import load

    g = load(FUZZ_DATA / name)
    ((planner, label, options),) = [s for s in fuzzing.fast_settings() if s[1] == FAST_CASES[name]]
    runs = [fuzzing.run_one(g, planner, label, b, options) for b in fuzzing.budgets(g, [k / 8 for k in range(9)])]
    assert all(r is not None for r in runs) and runs[-1].sol.has_plan
    no_new_violations(fuzzing.violations_of(g, runs))


# Graphs on which issue 37's first campaign found cpsat claims that other
# plans contradicted (kept since claims' fix): file -> budgets, cpsat setting.
CLAIM_CASES = {
    # OPTIMAL costs rising with the budget: the tight budget's plan, cleaned, recomputes nothing
    "optimal_rising_beside_cleaned.json": ([127121523879483, 127122472048372], "cpsat"),
    # a peak-mode OPTIMAL above xla-remat's plan at a tighter budget (its moves are outside the staged space)
    "peak_optimal_beaten_by_moves.json": ([235044958, 368435644], "cpsat peak"),
}


@pytest.mark.parametrize("name", CLAIM_CASES)
def test_claims_the_campaign_contradicted_now_hold(name):
    budget_list, label = CLAIM_CASES[name]
    no_new_violations(_runs(name, budget_list, [label], limit=fuzzing.CPSAT["time_limit"]))
