"""``rematopt max-batch`` on graphs whose memory is linear in the size k
(every activation's bytes times k, the parameter fixed), where the largest
size that fits has a closed form; every plan is replayed by the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rematopt.cli import cli
from rematopt.graph import Graph, Node
from rematopt.importers import synthetic
from rematopt.studies.maxbatch import max_batch, scaled, scaled_sizes
from rematopt.reference import no_remat_peak, working_set_bound

PARAM = 5


def forward_chain(n: int = 6) -> Graph:
    """A persistent parameter read by every node of a chain: computing node
    i needs i and i-1 resident, so the working set is the optimum, whatever
    the planner: max k = floor((M - PARAM) / max(b_i + b_(i-1)))."""
    nodes = [Node(0, "w", kind="input", persistent=True, bytes=PARAM), Node(1, "x", kind="input", bytes=3)]
    edges = []
    for i in range(2, n + 2):
        nodes.append(Node(i, f"h{i}", bytes=2 + 3 * (i % 3), cost=1.0, output=i == n + 1))
        edges += [(i - 1, i), (0, i)]
    return Graph("fwd", nodes, edges)


def test_scaled_keeps_parameters_and_multiplies_activations():
    g = forward_chain()
    g3 = scaled(g, 3)
    assert [v.bytes for v in g3.nodes] == [v.bytes if v.persistent else 3 * v.bytes for v in g.nodes]
    assert no_remat_peak(g3) - PARAM == 3 * (no_remat_peak(g) - PARAM)


def test_every_planner_reaches_the_closed_form_on_a_forward_chain():
    g = forward_chain()
    w = working_set_bound(g) - PARAM
    memory = PARAM + 7 * w + w // 2
    answers = max_batch(scaled_sizes(g, 1), memory, time_limit=5, workers=1,
                        planners=("no-remat", "greedy", "dtr", "chen-greedy"))
    assert {a.planner: a.size for a in answers} == {"no-remat": 7, "greedy": 7, "dtr": 7, "chen-greedy": 7, "cpsat": 7}
    assert answers[-1].proven
    for a in answers:
        assert a.peak_bytes == PARAM + 7 * w


def test_no_overhead_allowed_means_the_no_remat_peak_on_a_training_chain():
    """With --max-overhead 0 nothing may be recomputed, so the size is
    floor(M / no-remat peak); cpsat proves that the next size needs
    recomputation (its bound on the overhead is above 0)."""
    g = synthetic.linear_training(5)
    n1 = no_remat_peak(g)
    memory = 5 * n1 + n1 // 2
    answers = max_batch(scaled_sizes(g, 1), memory, max_overhead=0.0, time_limit=5, workers=1,
                        planners=("no-remat", "greedy"))
    sizes = {a.planner: a.size for a in answers}
    assert sizes["no-remat"] == 5 and sizes["cpsat"] == 5
    assert answers[-1].proven
    assert answers[-1].overhead == 0


def test_cpsat_beats_or_matches_every_heuristic_within_the_working_set():
    g = synthetic.linear_training(6)
    memory = 4 * no_remat_peak(g)
    answers = max_batch(scaled_sizes(g, 1), memory, time_limit=5, workers=1,
                        planners=("no-remat", "chen-sqrt", "greedy", "dtr"))
    ours = answers[-1]
    assert all(ours.size >= a.size for a in answers)
    assert ours.size > answers[0].size  # recomputation buys a larger batch than keeping everything
    assert ours.size <= memory // working_set_bound(g)
    assert ours.upper is not None and ours.size <= ours.upper
    big = scaled(g, ours.size)
    assert ours.peak_bytes <= memory and working_set_bound(big) <= memory


def test_max_batch_cli_on_a_graph_file(tmp_path):
    path = tmp_path / "fwd.json"
    forward_chain().save(path)
    w = working_set_bound(forward_chain()) - PARAM
    out = CliRunner().invoke(cli, ["max-batch", str(path), "--memory", str(PARAM + 3 * w), "--time-limit", "5",
                                   "--workers", "1", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output[out.output.index("["):])
    assert {r["planner"]: r["size"] for r in rows}["cpsat"] == 3
    assert next(r for r in rows if r["planner"] == "cpsat")["proven"]


@pytest.mark.parametrize("args", [["--memory", "lots"], ["--memory", "1000", "--scale-factor", "0"]])
def test_max_batch_bad_input_is_one_line(tmp_path, args):
    path = tmp_path / "fwd.json"
    forward_chain().save(path)
    r = subprocess.run([sys.executable, "-m", "rematopt", "max-batch", str(path), *args], capture_output=True,
                       text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
