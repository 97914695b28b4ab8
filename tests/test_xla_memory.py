"""The liveness walk over XLA's scheduled HLO (rematopt.xla.memory) against XLA's own figures:
``peak_memory_in_bytes`` of the four H200 modules in ../shared/gpu, and on this machine's CPU
(memory-minimizing scheduler; XLA computes no peak there) temp + arguments + outputs - aliases of
the plain and planned steps of every model in models/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import rematopt
from rematopt.xla import parse_hlo, read_hlo
from rematopt.xla.assignment import assign
from rematopt.xla.hlo import HloError
from rematopt.sizes import human_bytes
from rematopt.xla.memory import Call, backend_of, compiled_memory, xla_reference

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT.parent / "shared" / "gpu" / "h200_gpt8"
GPU_MODULES = {"plain": "plain", "dots_saveable": "dots_saveable", "cpsat@0.8": "cpsat_at_0.8",
               "cpsat@0.5": "cpsat_at_0.5"}
sys.path.insert(0, str(Path(__file__).parent))
from xla_steps import MODELS, SCHEDULER_FLAG  # noqa: E402

# On CPU XLA's figure is its allocations: parameters + outputs + its temp allocation, the heap its
# buffer assignment packs the temporaries into and the tuple tables after it
# (rematopt.xla.assignment). Measured with jax 0.10.2: the heap is XLA's to the byte on all 22 steps
# (checked against the assignments XLA dumps with --xla_dump_to), so it is held to the byte.
TOLERANCE = 0.01
# The models built on flax / equinox / keras take a minute each to import and compile here: they run
# with ``pytest -m slow``; the models written in JAX alone run by default.
LIBRARY = {"flax_linen", "flax_nnx", "equinox_lm", "keras_llama", "keras_gemma", "keras_gpt2"}
EACH_MODEL = [pytest.param(m, marks=pytest.mark.slow) if m in LIBRARY else m for m in MODELS]


@pytest.fixture(scope="module")
def cpu_steps(tmp_path_factory):
    """``compile(model) -> (dir, stats)``: the model's plain and greedy-planned steps compiled in a
    fresh process under the memory-minimizing scheduler (a flag XLA reads once, when the backend
    starts), once per model for the whole module."""
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("xla_steps")
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {SCHEDULER_FLAG}".strip(),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done: dict[str, dict] = {}

    def compile_model(model: str):
        if model not in done:
            run = subprocess.run([sys.executable, str(Path(__file__).parent / "xla_steps.py"), str(out / model), model],
                                 env=env, capture_output=True, text=True, timeout=280, cwd=ROOT)
            assert run.returncode == 0, run.stderr[-2000:]
            done[model] = json.loads((out / model / "stats.json").read_text())
        return out / model, done[model]

    return compile_model


@pytest.fixture(scope="module")
def measured():
    path = GPU_DIR / "measured.json"
    if not path.is_file():
        pytest.skip(f"H200 measurements not found at {path} (../shared is absent)")
    return {r["variant"]: r for r in json.loads(path.read_text())["rows"]}


@pytest.mark.parametrize("variant", list(GPU_MODULES))
def test_gpu_fixture_within_one_percent(measured, variant):
    module = read_hlo(GPU_DIR / f"hlo_{GPU_MODULES[variant]}.txt")
    assert backend_of(module) == "gpu"
    walk = compiled_memory(module)
    ref = xla_reference(measured[variant], "gpu")
    assert ref.what == "peak_memory_in_bytes"
    assert abs(walk.peak_bytes / ref.bytes - 1) < TOLERANCE, (walk.peak_bytes, ref.bytes)
    # outputs and parameters as XLA sized them
    assert walk.parameter_bytes == measured[variant]["argument_size_in_bytes"]
    assert walk.output_bytes == measured[variant]["output_size_in_bytes"]
    # what is live at the peak is the peak, to the byte, by kind
    kinds = {k: sum(b.bytes for b in walk.live if b.kind == k) for k in ("parameter", "output", "temp")}
    assert sum(b.bytes for b in walk.live) == walk.peak_bytes == walk.live_peak_bytes
    assert (kinds["parameter"], kinds["output"], kinds["temp"]) == (
        walk.parameter_bytes, walk.output_bytes, walk.temp_peak_bytes)


def test_gpu_peak_attributed_to_program_lines(measured):
    walk = compiled_memory(read_hlo(GPU_DIR / "hlo_plain.txt"))
    temps = [b for b in walk.live if b.kind == "temp"]
    assert sum(b.bytes for b in temps) == walk.temp_peak_bytes
    # ../shared/gpu/README.md: XLA peaks at layer 7's softmax backward; the attention scores
    # [8,16,1024,1024] f32 = 512 MiB dominate, each from models/gpt.py
    assert temps[0].bytes == 8 * 16 * 1024 * 1024 * 4
    assert temps[0].source.startswith("models/gpt.py:")
    assert all(b.op_name for b in temps[:20])


@pytest.mark.parametrize("model", EACH_MODEL)
@pytest.mark.parametrize("variant", ["plain", "greedy"])
def test_cpu_steps(cpu_steps, model, variant):
    out, stats = cpu_steps(model)
    step = f"{model}_{variant}"
    module = read_hlo(out / f"{step}.hlo")
    assert backend_of(module) == "cpu"
    walk = compiled_memory(module)
    ref = xla_reference(stats[step], "cpu")
    assert ref.what == "temp + arguments + outputs - aliases"
    assert walk.parameter_bytes == stats[step]["argument_size_in_bytes"]
    assert walk.output_bytes == stats[step]["output_size_in_bytes"]
    assert abs(walk.peak_bytes / ref.bytes - 1) < TOLERANCE, (walk.peak_bytes, ref.bytes)
    assert walk.heap_bytes == stats[step]["temp_size_in_bytes"]
    # the live peak is what the heap holds at once: never more than the heap, never less than the
    # parameters and outputs
    fixed = walk.parameter_bytes + walk.output_bytes
    assert fixed < walk.live_peak_bytes <= walk.peak_bytes


@pytest.mark.parametrize("model", EACH_MODEL)
@pytest.mark.parametrize("variant", ["plain", "greedy"])
def test_cpu_live_set_at_the_peak(cpu_steps, model, variant):
    """On CPU the peak's place and what is live there are read from XLA's buffer assignment: the
    buffers live there sum to the live peak to the byte, by kind to XLA's arguments, its outputs
    and the temporaries at their peak; the heap's temporaries among them are live together, so
    the packing gives them disjoint bytes of XLA's temp; the place is an instruction of the named
    computation, run from the entry through the context."""
    out, stats = cpu_steps(model)
    step = f"{model}_{variant}"
    module = read_hlo(out / f"{step}.hlo")
    mem = compiled_memory(module)
    kinds = {k: sum(b.bytes for b in mem.live if b.kind == k) for k in ("parameter", "output", "temp")}
    assert sum(b.bytes for b in mem.live) == mem.live_peak_bytes == sum(kinds.values())
    assert kinds["parameter"] == mem.parameter_bytes == stats[step]["argument_size_in_bytes"]
    assert kinds["output"] == mem.output_bytes == stats[step]["output_size_in_bytes"]
    assert kinds["temp"] == mem.temp_peak_bytes <= mem.heap_bytes == stats[step]["temp_size_in_bytes"]
    assert mem.timeline[mem.peak_step] == max(mem.timeline) == mem.live_peak_bytes
    done = assign(module)
    placed = sorted((done.offsets[b.id], done.offsets[b.id] + b.bytes) for b in mem.live if b.kind == "temp")
    assert all(end <= start for (_, end), (start, _) in zip(placed, placed[1:]))
    assert placed[-1][1] <= mem.heap_bytes
    comp = mem.peak_computation
    for call in reversed(mem.peak_context):
        assert comp in module.computations[call.computation].by_name[call.instruction].called
        comp = call.computation
    assert comp == module.entry_name
    assert module.computations[mem.peak_computation].instructions[mem.peak_index].name == mem.peak_instruction
    # each buffer named by the program's value that made it
    largest = next(b for b in mem.live if b.kind == "temp")
    assert largest.op_name.startswith("jit(") and largest.source
    # an output's allocation holding a temporary at the peak: one XLA houses there, live then
    for b in mem.live:
        if b.holds:
            assert b.kind == "output" and b.holds.bytes <= b.bytes
            out = done.values[done.in_outputs[b.holds.id]]
            assert (out.instruction, out.index) == (b.instruction, b.index)
            first, last = done.ranges[b.holds.id]
            assert first <= mem.peak_step <= last


def test_cpu_heap_has_gaps(cpu_steps):
    """gpt's temporaries do not pack into their live peak: XLA's heap leaves gaps, and the figure
    compared with XLA's is the heap, not the live peak."""
    out, stats = cpu_steps("gpt")
    walk = compiled_memory(read_hlo(out / "gpt_plain.hlo"))
    temp = stats["gpt_plain"]["temp_size_in_bytes"]
    live_temp = walk.live_peak_bytes - walk.parameter_bytes - walk.output_bytes
    assert live_temp < temp * 0.98  # more than 2% of XLA's heap is gaps
    assert walk.heap_bytes == temp
    # at the peak, in the backward pass, outputs' allocations still hold forward activations
    # XLA houses there until the gradients are written
    assert any(b.holds and "/jvp(" in b.holds.op_name and "transpose(" not in b.holds.op_name for b in walk.live)


@pytest.mark.parametrize("model", EACH_MODEL)
def test_planned_steps_differ(cpu_steps, model):
    """The planned step is another program (the comparison above is not of one module twice)."""
    out, _ = cpu_steps(model)
    assert (out / f"{model}_plain.hlo").read_text() != (out / f"{model}_greedy.hlo").read_text()


def test_in_place_and_loop_rules():
    """Hand-written modules: an elementwise fusion writes into its dying operand; a
    dynamic-update-slice writes in place; a while body's own peak is added at the loop; on CPU,
    temporaries live in outputs' allocations before the outputs are written."""
    text = """HloModule m, is_scheduled=true

%f (p0: f32[256]) -> f32[256] {
  %p0 = f32[256]{0} parameter(0)
  ROOT %e = f32[256]{0} exponential(%p0)
}

%body (t: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %t = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[1024]{0} get-tuple-element(%t), index=1
  %tmp = f32[4096]{0} broadcast(%i), dimensions={}
  %sl = f32[1024]{0} slice(%tmp), slice={[0:1024]}
  %y = f32[1024]{0} add(%x, %sl)
  ROOT %r = (s32[], f32[1024]{0}) tuple(%i, %y)
}

%cond (u: (s32[], f32[1024])) -> pred[] {
  %u = (s32[], f32[1024]{0}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[256], z: f32[1024]) -> (f32[256], f32[1024]) {
  %a = f32[256]{0} parameter(0)
  %z = f32[1024]{0} parameter(1)
  %b = f32[256]{0} fusion(%a), kind=kLoop, calls=%f
  %c = f32[256]{0} fusion(%b), kind=kLoop, calls=%f
  %d = f32[256]{0} fusion(%c), kind=kLoop, calls=%f
  %k = s32[] constant(0)
  %w0 = f32[1024]{0} copy(%z)
  %init = (s32[], f32[1024]{0}) tuple(%k, %w0)
  %w = (s32[], f32[1024]{0}) while(%init), condition=%cond, body=%body
  %out = f32[1024]{0} get-tuple-element(%w), index=1
  ROOT %res = (f32[256]{0}, f32[1024]{0}) tuple(%d, %out)
}
"""
    walk = compiled_memory(parse_hlo(text), "gpu")
    assert walk.parameter_bytes == 1024 + 4096
    assert walk.output_bytes == 1024 + 4096 + 16  # d and the loop's buffer, plus the tuple's table
    fixed = walk.parameter_bytes + walk.output_bytes
    # c writes into b as b dies, d (an output) into its own buffer: 1 KiB of temporaries, not 2
    assert walk.timeline[3] - fixed == 1024
    # the body's own peak, its 16 KiB broadcast and 4 KiB slice, at the loop; the loop's buffer is
    # the copy it was given (an output), and y is written into it
    assert walk.temp_peak_bytes == 16384 + 4096
    # the peak falls inside the loop's body, as it slices the broadcast, on every iteration; what
    # is live there is the body's two temporaries beside the parameters and outputs
    assert (walk.peak_instruction, walk.peak_index, walk.peak_computation) == ("sl", 4, "body")
    assert walk.peak_context == [Call("w", "main", "body")] and walk.where == "#4 sl in the body of w"
    assert sorted((b.instruction, b.kind) for b in walk.live if b.kind == "temp") == [("sl", "temp"), ("tmp", "temp")]
    assert sum(b.bytes for b in walk.live) == walk.peak_bytes
    # on CPU: b and c live in d's allocation (an output, written after they die), the loop's state
    # in the output it becomes, so the heap holds the body's broadcast and slice, live together;
    # the loop's tuple table (two pointers) has an allocation of its own, laid after the heap
    module = parse_hlo(text)
    cpu = compiled_memory(module, "cpu")
    assert cpu.heap_bytes == 16384 + 4096 + 16
    assert cpu.peak_bytes == cpu.parameter_bytes + cpu.output_bytes + cpu.heap_bytes
    assert cpu.live_peak_bytes == cpu.peak_bytes  # nothing else is live beside them: no gaps
    # the heap is fullest in the body, as it slices the broadcast (the place read from XLA's
    # assignment over the schedule flattened through the loop); live there beside the parameters
    # and outputs: the two temporaries and the loop's tuple table
    assert cpu.where == "#4 sl in the body of w" and cpu.peak_computation == "body"
    assert sorted((b.instruction, b.bytes) for b in cpu.live if b.kind == "temp") == [
        ("init", 16), ("sl", 4096), ("tmp", 16384)]
    assert sum(b.bytes for b in cpu.live) == cpu.live_peak_bytes
    assert cpu.timeline[cpu.peak_step] == max(cpu.timeline) == cpu.live_peak_bytes
    done = assign(module)
    housed = {done.values[v].instruction: done.values[o].instruction for v, o in done.in_outputs.items()}
    assert housed == {"b": "d", "c": "d"}
    placed = {done.values[v].instruction: off for v, off in done.offsets.items()}
    assert {placed["tmp"], placed["sl"]} == {0, 16384}
    assert placed["init"] == placed["w"] == 16384 + 4096 and done.table_bytes == 16
    # XLA names every instruction of a module once; a module that repeats a name is refused
    with pytest.raises(HloError, match="repeats across computations"):
        compiled_memory(parse_hlo(text.replace("%u", "%t").replace("%j", "%i")), "cpu")


NESTED_LOOPS = """HloModule nested, is_scheduled=true

%inner_body (t: (s32[], f32[256])) -> (s32[], f32[256]) {
  %t = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[256]{0} get-tuple-element(%t), index=1
  %big = f32[8192]{0} broadcast(%i), dimensions={}
  %sl = f32[256]{0} slice(%big), slice={[0:256]}
  %y = f32[256]{0} add(%x, %sl)
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[256]{0}) tuple(%i2, %y)
}

%inner_cond (u: (s32[], f32[256])) -> pred[] {
  %u = (s32[], f32[256]{0}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

%outer_body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %k = s32[] get-tuple-element(%p), index=0
  %v = f32[256]{0} get-tuple-element(%p), index=1
  %zero = s32[] constant(0)
  %v2 = f32[256]{0} copy(%v)
  %init = (s32[], f32[256]{0}) tuple(%zero, %v2)
  %w = (s32[], f32[256]{0}) while(%init), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %res = f32[256]{0} get-tuple-element(%w), index=1
  %one2 = s32[] constant(1)
  %k2 = s32[] add(%k, %one2)
  ROOT %o = (s32[], f32[256]{0}) tuple(%k2, %res)
}

%outer_cond (q: (s32[], f32[256])) -> pred[] {
  %q = (s32[], f32[256]{0}) parameter(0)
  %m = s32[] get-tuple-element(%q), index=0
  %lim = s32[] constant(2)
  ROOT %lt2 = pred[] compare(%m, %lim), direction=LT
}

ENTRY %main (a: f32[256]) -> f32[256] {
  %a = f32[256]{0} parameter(0)
  %c0 = s32[] constant(0)
  %a2 = f32[256]{0} copy(%a)
  %st = (s32[], f32[256]{0}) tuple(%c0, %a2)
  %ow = (s32[], f32[256]{0}) while(%st), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"2"}}
  ROOT %out = f32[256]{0} get-tuple-element(%ow), index=1
}
"""


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_peak_inside_nested_loops(backend):
    """A loop in a loop's body, whose body broadcasts 32 KiB: on either backend the peak falls as
    the inner body slices the broadcast, named with both loops and their trip counts, and what is
    live there sums to the live peak."""
    mem = compiled_memory(parse_hlo(NESTED_LOOPS), backend)
    assert mem.where == "#4 sl in the body of w (3 iterations) in the body of ow (2 iterations)"
    assert mem.peak_context == [Call("ow", "main", "body", 2), Call("w", "outer_body", "body", 3)]
    assert mem.peak_computation == "inner_body"
    temps = {b.instruction: b.bytes for b in mem.live if b.kind == "temp"}
    assert temps["big"] == 8192 * 4 and temps["sl"] == 256 * 4
    assert sum(b.bytes for b in mem.live) == mem.live_peak_bytes == mem.timeline[mem.peak_step]


def test_cli_memory_json_and_bad_file(tmp_path, cpu_steps):
    out, stats = cpu_steps("mlp")
    done = rematopt("xla", "memory", out / "mlp_plain.hlo", "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["peak_bytes"] == compiled_memory(read_hlo(out / "mlp_plain.hlo")).peak_bytes
    # the heap is XLA's temp allocation; the live peak never exceeds what is allocated
    assert got["heap_bytes"] == stats["mlp_plain"]["temp_size_in_bytes"]
    assert got["live_peak_bytes"] <= got["peak_bytes"]
    assert got["backend"] == "cpu" and "XLA computes no peak on CPU" in got["compare_with"]
    # where the peak falls and what is live there, the same keys on every backend
    assert sum(b["bytes"] for b in got["live"]) == got["live_peak_bytes"]
    assert {b["kind"] for b in got["live"]} == {"parameter", "output", "temp"}
    assert got["peak_computation"] and got["peak_context"] == []  # mlp's step has no loop
    assert all(b["holds"] is None or b["kind"] == "output" for b in got["live"])
    text = rematopt("xla", "memory", out / "mlp_plain.hlo").stdout
    assert f"live peak {human_bytes(got['live_peak_bytes'])} ({got['live_peak_bytes']:,} B) at " \
           f"#{got['peak_index']} {got['peak_instruction']}:" in text


def test_cli_memory_bad_input(tmp_path):
    """A missing file, a directory, a file that is not HLO: one line naming it, exit status 2."""
    bad = tmp_path / "bad.hlo"
    bad.write_text("not hlo\n")
    for path in (bad, tmp_path / "missing.hlo", tmp_path):
        done = rematopt("xla", "memory", path, "--json")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and str(path) in done.stderr, done.stderr
        assert done.stdout == ""


# The graph of what XLA materializes (trace_grad(fuse="xla")): its no-remat peak against XLA's figure
# for the plain step, as measured (docs/xla.md). The scanned models compile to while loops and the
# graph is of the unrolled step: they are held to XLA's figure for the unrolled equations the graph
# is made of (meta.xla), the while loop's own figure being a different program. Issue 35 asks for
# 3%: each model is held to its measured error rounded up to half a percent, and at least 1%
# (measured, jax 0.10.2: mlp +2.9%, keras gemma -1.9%, keras gpt2 -1.6%, keras llama -1.4%,
# equinox_lm +2.1%; every other model within 1%).
LOOPED = {"gpt_scan", "flax_linen", "flax_nnx", "equinox_lm"}
GRAPH_TOLERANCE = {"mlp": 0.03, "keras_llama": 0.015, "keras_gemma": 0.02, "keras_gpt2": 0.02, "equinox_lm": 0.025}


@pytest.mark.parametrize("model", EACH_MODEL)
def test_compiled_graph_peak(cpu_steps, model):
    _, stats = cpu_steps(model)
    graphs = stats[f"{model}_graphs"]
    meta = graphs["xla"]["meta"]
    assert meta["backend"] == "cpu" and SCHEDULER_FLAG in meta["XLA_FLAGS"]
    assert graphs["xla"]["nodes"] < graphs["unfused"]["nodes"]
    plain = xla_reference(stats[f"{model}_plain"], "cpu").bytes
    if model not in LOOPED:  # the graph's own equations compile to the plain step
        assert meta["xla_bytes"] == plain
    reference = meta["xla_bytes"]
    peak = graphs["xla"]["no_remat_peak"]
    assert abs(peak / reference - 1) < GRAPH_TOLERANCE.get(model, 0.01), (peak, reference)


def test_cpu_allocations_take_the_applied_steps_named_allocations_beside_its_buffers():
    """The applied step names a buffer ``(node, output)`` and a stacked gradient's allocation
    ``("stack", leaf)``; tied on size and position the two were compared (int against str: flax_linen's
    eager-order plans at the bench's full size did not apply). A temporary that dies before both
    outputs are written is housed in one of them; one live across their writes is not."""
    from rematopt.xla.memory import cpu_allocations

    outputs = {(3, "out"): 64, ("stack", "w"): 64}
    written = {(3, "out"): 5, ("stack", "w"): 5}
    temps = {(1, "out"): (0, 2), (2, "out"): (1, 7)}
    sizes = {(1, "out"): 64, (2, "out"): 64, **outputs}
    housed = cpu_allocations(temps, {}, outputs, written, sizes, 10, {}, {(1, "out"): 0, (2, "out"): 1, **written})
    assert housed == {(1, "out")}
