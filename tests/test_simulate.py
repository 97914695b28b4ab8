"""Every replay rule of FORMATS.md, each invalid case with its reason, and the
plan format's round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rematopt import Graph, Node, Plan, PlanError, simulate
from rematopt.plan import PlanBuilder

MB = 1 << 20


def small() -> Graph:
    """x (input, 1MB) -> a (2MB, cost 1) -> b (4MB, cost 2) -> c (1MB output, cost 0.1); a -> c.
    p is a persistent 8MB parameter read by b; w is a non-recomputable, non-offloadable op."""
    nodes = [
        Node(0, "x", kind="input", bytes=1 * MB),
        Node(1, "a", bytes=2 * MB, cost=1.0),
        Node(2, "b", bytes=4 * MB, cost=2.0),
        Node(3, "c", bytes=1 * MB, cost=0.1, output=True),
        Node(4, "p", kind="input", bytes=8 * MB, persistent=True),
        Node(5, "w", bytes=3 * MB, cost=0.7, recomputable=False, offloadable=False),
    ]
    edges = [(0, 1), (1, 2), (2, 3), (1, 3), (4, 2), (0, 5), (5, 3)]
    return Graph("small", nodes, edges, order=[0, 4, 1, 5, 2, 3])


def run(events):
    return simulate(small(), Plan.from_events("small", "test", events))


GOOD = [("compute", 1), ("compute", 5), ("free", 0), ("compute", 2), ("compute", 3),
        ("free", 1), ("free", 2), ("free", 5)]


def test_valid_plan_figures():
    r = run(GOOD)
    assert r.valid, r.error
    assert r.initial_bytes == 9 * MB  # input x and persistent p
    # after a: 11, after w: 14, free x: 13, b checked at 13+4=17, c at 17+1=18
    assert r.peak_bytes == 18 * MB
    assert r.timeline.tolist() == [m * MB for m in (11, 14, 13, 17, 18, 16, 12, 9)]
    assert r.compute_cost == math.fsum([1.0, 0.7, 2.0, 0.1]) == r.base_cost
    assert r.recompute_cost == 0 and r.overhead == 0 and r.transfer_bytes == 0
    assert r.compute_events == 4 and r.events == 8


def test_recompute_counts_cost_and_memory():
    events = [("compute", 1), ("compute", 5), ("compute", 2), ("free", 1), ("compute", 1),
              ("compute", 3)]
    r = run(events)
    assert r.valid, r.error
    assert r.recompute_cost == 1.0
    assert r.compute_cost == math.fsum([1.0, 0.7, 2.0, 1.0, 0.1])
    assert r.overhead == pytest.approx(1.0 / 3.8)


def test_offload_and_prefetch_move_bytes_and_check_memory_after():
    events = [("compute", 1), ("offload", 1), ("free", 1), ("compute", 5), ("prefetch", 1),
              ("compute", 2), ("compute", 3)]
    r = run(events)
    assert r.valid, r.error
    assert r.offload_bytes == 2 * MB and r.prefetch_bytes == 2 * MB and r.transfer_bytes == 4 * MB
    assert r.timeline.tolist()[4] == 14 * MB  # prefetch: checked after adding
    # a host copy stays after a prefetch: free and prefetch again
    r2 = run(events[:5] + [("free", 1), ("prefetch", 1), ("compute", 2), ("compute", 3)])
    assert r2.valid and r2.transfer_bytes == 6 * MB


@pytest.mark.parametrize("events, index, reason", [
    ([("compute", 0)], 0, "is an input and is never computed"),
    ([("compute", 1), ("compute", 1)], 1, "already resident"),
    ([("compute", 2)], 0, "predecessor 1 is not resident"),
    ([("free", 1)], 0, "not resident"),
    ([("free", 4)], 0, "persistent and is never freed"),
    ([("offload", 1)], 0, "not resident"),
    ([("compute", 1), ("compute", 5), ("offload", 5)], 2, "not offloadable"),
    ([("prefetch", 1)], 0, "has no host copy"),
    ([("compute", 1), ("offload", 1), ("prefetch", 1)], 2, "already resident"),
    ([("compute", 1), ("compute", 5), ("free", 5), ("compute", 5)], 3, "not recomputable"),
    ([("compute", 99)], 0, "no such node"),
])
def test_each_invalid_event_is_reported_with_its_index(events, index, reason):
    r = run(events)
    assert not r.valid and r.error_event == index and reason in r.error
    assert len(r.timeline) == index  # figures describe the prefix before the error


def test_end_of_plan_rules():
    r = run([("compute", 1), ("compute", 5), ("compute", 2)])
    assert not r.valid and r.error_event is None and "c) was never computed" in r.error
    r = run(GOOD[:-3] + [("free", 3)])
    assert not r.valid and "output node 3 (c) is not resident" in r.error


def test_free_then_inputs_can_be_prefetched_back():
    events = [("offload", 0), ("free", 0), ("prefetch", 0), ("compute", 1), ("compute", 5),
              ("compute", 2), ("compute", 3)]
    r = run(events)
    assert r.valid and r.transfer_bytes == 2 * MB


def test_plan_round_trip_and_bad_plan_files(tmp_path):
    p = Plan.from_events("small", "test", GOOD, stats={"peak_bytes": 1, "np": np.int64(3)})
    path = tmp_path / "p.json"
    p.save(path)
    q = Plan.load(path)
    assert q.events() == GOOD and q.planner == "test" and q.stats["np"] == 3
    assert json.loads(path.read_text())["format"] == "rematopt.plan/1"
    bad = {"format": "rematopt.plan/1", "graph": "g", "planner": "x", "events": [{"op": "evict", "node": 1}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlanError, match=r"bad.json: events\[0\]: unknown op 'evict'"):
        Plan.load(tmp_path / "bad.json")
    bad["events"] = [{"op": "free"}]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlanError, match="must be an object with 'op' and 'node'"):
        Plan.load(tmp_path / "bad.json")
    bad["events"] = [{"op": "free", "node": "3"}]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(PlanError, match="node must be an integer"):
        Plan.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="malformed JSON"):
        Plan.load(tmp_path / "bad.json")


def test_builder_and_events_agree():
    b = PlanBuilder()
    b.compute(1)
    b.offload(1)
    b.free(1)
    b.prefetch(1)
    assert b.build("g", "t").events() == [("compute", 1), ("offload", 1), ("free", 1), ("prefetch", 1)]
