"""The compiled graph's reading of a loop XLA calls rather than runs in the entry. JAX 0.12's CPU
XLA calls threefry's loop over the two halves of random bits (``xla_cpu_small_call``), a computation
that is the loop over its parameter alone, and writes the halves as two results of the call, where
0.10 ran the loop in the entry, in the buffers of the kernels before it. The HLO below is that
pattern, cut down from 0.12's compiled dropout step (tests/test_jax_random.py runs the real one)."""

from __future__ import annotations

from types import SimpleNamespace

from rematopt.importers.jaxpr.compiled import _pieces, _runs_in_operand
from rematopt.xla.hlo import parse_hlo
from rematopt.xla.memory import Buffer

HLO = """HloModule m, entry_computation_layout={(u32[32,64]{1,0}, u32[32,64]{1,0})->u32[32,64]{1,0}}

%cond (p.1: (s32[], u32[32,64], u32[32,64])) -> pred[] {
  %p.1 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n.1 = s32[] constant(5)
  ROOT %lt.1 = pred[] compare(%i.1, %n.1), direction=LT
}

%body (p.2: (s32[], u32[32,64], u32[32,64])) -> (s32[], u32[32,64], u32[32,64]) {
  %p.2 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) parameter(0)
  %i.2 = s32[] get-tuple-element(%p.2), index=0
  %one.2 = s32[] constant(1)
  %next.2 = s32[] add(%i.2, %one.2)
  %x.2 = u32[32,64]{1,0} get-tuple-element(%p.2), index=1
  %y.2 = u32[32,64]{1,0} get-tuple-element(%p.2), index=2
  %xy.2 = u32[32,64]{1,0} xor(%x.2, %y.2)
  ROOT %t.2 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) tuple(%next.2, %xy.2, %x.2)
}

%loop (t.3: (s32[], u32[32,64], u32[32,64])) -> (s32[], u32[32,64], u32[32,64]) {
  %t.3 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) parameter(0)
  ROOT %w.3 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) while(%t.3), condition=%cond, body=%body
}

%not_a_loop (t.4: (s32[], u32[32,64], u32[32,64])) -> (s32[], u32[32,64], u32[32,64]) {
  %t.4 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) parameter(0)
  %w.4 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) while(%t.4), condition=%cond, body=%body
  %i.4 = s32[] get-tuple-element(%w.4), index=0
  %x.4 = u32[32,64]{1,0} get-tuple-element(%w.4), index=1
  %y.4 = u32[32,64]{1,0} get-tuple-element(%w.4), index=2
  %xx.4 = u32[32,64]{1,0} xor(%x.4, %x.4)
  ROOT %t.5 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) tuple(%i.4, %xx.4, %y.4)
}

ENTRY %main (a: u32[32,64], b: u32[32,64]) -> u32[32,64] {
  %a = u32[32,64]{1,0} parameter(0)
  %b = u32[32,64]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %a2 = u32[32,64]{1,0} add(%a, %b)
  %b2 = u32[32,64]{1,0} subtract(%a, %b)
  %tuple = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) tuple(%zero, %a2, %b2)
  %call = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) call(%tuple), to_apply=%loop, frontend_attributes={xla_cpu_small_call="true"}
  %call.1 = (s32[], u32[32,64]{1,0}, u32[32,64]{1,0}) call(%tuple), to_apply=%not_a_loop
  %h1 = u32[32,64]{1,0} get-tuple-element(%call), index=1
  %h2 = u32[32,64]{1,0} get-tuple-element(%call), index=2
  %g1 = u32[32,64]{1,0} get-tuple-element(%call.1), index=1
  %m = u32[32,64]{1,0} xor(%h1, %h2)
  %c2 = u32[32,64]{1,0} negate(%a2)
  %r1 = u32[32,64]{1,0} xor(%m, %g1)
  ROOT %r = u32[32,64]{1,0} xor(%r1, %c2)
}
"""


def test_a_call_of_a_loop_over_its_parameter_runs_in_its_operand():
    module = parse_hlo(HLO)
    entry = module.entry
    assert _runs_in_operand(module, entry.by_name["call"])
    assert not _runs_in_operand(module, entry.by_name["call.1"])  # the callee computes after its loop
    assert not _runs_in_operand(module, entry.by_name["m"])
    assert _runs_in_operand(module, module.computations["loop"].by_name["w.3"])


def test_the_calls_other_result_is_the_second_half_of_the_bits():
    module = parse_hlo(HLO)
    step = SimpleNamespace(flat=SimpleNamespace(eqns=[SimpleNamespace(outs=[0]), SimpleNamespace(outs=[1])]))
    start = [Buffer(1, "a2", (), 8192, "temp"), Buffer(2, "b2", (), 8192, "temp")]
    half = [Buffer(2 + k, "call", (k,), 8192, "temp") for k in (1, 2)]
    # the draw: the loop's starting halves (dying at the call), then the call's two results, dying
    # together; the node stands for the last, the other is the second half though the call reads
    # buffers of the same draw
    draw = [(start[0], 2, 5), (start[1], 3, 5), (half[0], 5, 9), (half[1], 5, 9)]
    # a value and a copy of it another kernel writes from it (c2 reads a2): a copy, no piece
    copied = [(Buffer(5, "c2", (), 8192, "temp"), 6, 9), (start[0], 2, 9)]
    pieces = _pieces(step, module, {0: draw, 1: copied}, housed=set())
    assert pieces == {0: [half[0]]}
    assert _pieces(step, module, {0: draw}, housed={("call", (2,))}) == {}  # the node housed: none
