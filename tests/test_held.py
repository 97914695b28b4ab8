"""``python -m rematopt.studies.held``: one plan's applied step beside XLA's compiled one, kernel by
kernel (which backward kernels XLA moved out of the plan's order, what each holds at XLA's peak), run
as the study runs, in a fresh process under the memory-minimizing scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from rematopt.studies.held import _in_order  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def held(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rematopt.studies.held", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_the_fewest_moved_kernels_are_the_complement_of_a_longest_ordered_run():
    assert _in_order([0, 1, 5, 2, 3, 4]) == {0, 1, 3, 4, 5}  # the 5 ran early
    assert _in_order([3, 0, 1, 2]) == {1, 2, 3}
    assert _in_order([0, 2, 2, 3]) == {0, 1, 2, 3}  # a node computed in two kernels keeps its place
    assert _in_order([]) == set()


def test_a_plan_on_mlp_set_beside_xla():
    run = held("mlp", "greedy", "0.6", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["xla_peak"] > 0 and abs(out["predicted"] / out["xla_peak"] - 1) <= 0.05, out  # the first round's
    assert out["peak_position"] is not None and 0 < out["applied_there"] <= out["predicted"]
    assert all(r["xla"] != r["applied"] for r in out["nodes"]) and out["nodes"]
    positions = [r["plan_position"] for r in out["out_of_order"]]
    assert all(isinstance(k, int) and k >= 0 for k in positions)
    assert all(set(r) == {"kernel", "computes", "op_name"} for r in out["ties_inside"])


def test_bad_input_is_one_line_and_status_2():
    for args in (["nosuch", "greedy", "0.6"], ["mlp"], ["mlp", "greedy", "half"]):
        run = held(*args)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr


# a tie as apply_plan writes it: p1 + 0 * (one element of READ)
TIE_ON = """  %s = f32[1,1]{1,0} slice(READ), slice={[0:1], [0:1]}
  %z = f32[1,1]{1,0} constant({ {0} })
  %m = f32[1,1]{1,0} multiply(%s, %z), metadata={op_name="jit(f)/transpose(jvp(tie))/mul"}
  %b = f32[] bitcast(%m)
  %bb = f32[8,4]{1,0} broadcast(%b), dimensions={}
  %p1 = f32[8,4]{1,0} parameter(1)
  ROOT %a = f32[8,4]{1,0} add(%p1, %bb), metadata={op_name="jit(f)/transpose(jvp(tie))/add"}
"""

TIES = """HloModule m, is_scheduled=true

%writes_it (p0: f32[4,8]) -> f32[8,4] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %t = f32[8,4]{0,1} transpose(%p0), dimensions={1,0}, metadata={op_name="jit(f)/transpose(jvp(rmq1))/transpose"}
  ROOT %c = f32[8,4]{1,0} copy(%t), metadata={op_name="jit(f)/transpose(jvp(rmq1))/transpose"}
}

%ties_inside (p0: f32[4,8], p1: f32[8,4]) -> f32[8,4] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %t = f32[8,4]{0,1} transpose(%p0), dimensions={1,0}, metadata={op_name="jit(f)/transpose(jvp(rmq1))/transpose"}
  %c = f32[8,4]{1,0} copy(%t), metadata={op_name="jit(f)/transpose(jvp(rmq1))/transpose"}
""" + TIE_ON.replace("READ", "%c") + """}

%ties_its_buffer (p0: f32[8,4], p1: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
""" + TIE_ON.replace("READ", "%p0") + """}

ENTRY %main (x: f32[4,8], y: f32[8,4]) -> (f32[8,4], f32[8,4], f32[8,4]) {
  %x = f32[4,8]{1,0} parameter(0)
  %y = f32[8,4]{1,0} parameter(1)
  %k1 = f32[8,4]{1,0} fusion(%x), kind=kLoop, calls=%writes_it, metadata={op_name="jit(f)/transpose(jvp(rmq1))/transpose"}
  %k2 = f32[8,4]{1,0} fusion(%x, %y), kind=kLoop, calls=%ties_inside, metadata={op_name="jit(f)/transpose(jvp(tie))/add"}
  %k3 = f32[8,4]{1,0} fusion(%k1, %y), kind=kLoop, calls=%ties_its_buffer, metadata={op_name="jit(f)/transpose(jvp(tie))/add"}
  ROOT %r = (f32[8,4]{1,0}, f32[8,4]{1,0}, f32[8,4]{1,0}) tuple(%k1, %k2, %k3)
}
"""


def test_a_tie_that_computes_the_kernel_before_inside_is_told_from_one_reading_its_buffer():
    """k2's tie reads one element of rmq1's transpose, which k1 writes, computed from x inside k2: k1 is
    held to no place by it; k3's tie reads k1's buffer."""
    from rematopt.studies.held import ties_computed_inside
    from rematopt.xla.hlo import parse_hlo

    got = ties_computed_inside(parse_hlo(TIES))
    assert got == [{"kernel": "k2", "computes": "copy", "op_name": "jit(f)/transpose(jvp(rmq1))/transpose"}]
