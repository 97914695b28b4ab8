"""What XLA is told (rematopt.xla.flags): the CPU memory-minimizing scheduler
takes effect through XLA_FLAGS set before the backend starts, per-compile
options reach XLA, and every measurement records what was on."""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import pytest

from conftest import last_json

from rematopt.xla import flags
from rematopt.xla.flags import XlaSettings, XlaSettingsError

ROOT = Path(__file__).resolve().parents[1]

# temp bytes of models/gpt.py's step under whole-loss dots_saveable, with the settings asked
# for through flags.apply before the backend starts; printed as JSON by a fresh process
PROBE = """
import json, sys, jax
from rematopt.xla import flags
s = flags.XlaSettings(memory_scheduler={sched})
flags.apply(s)
from models import gpt
loss, args = gpt.factory(layers=3, width=64, heads=4, seq=64, batch=2, vocab=256)
f = jax.jit(jax.value_and_grad(jax.checkpoint(loss, policy=jax.checkpoint_policies.dots_saveable)))
c = flags.compile_jitted(f, args, s)
print(json.dumps({{"temp": int(c.memory_analysis().temp_size_in_bytes), "record": flags.record(s)}}))
"""


def _probe(sched: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return last_json(PROBE.format(sched=sched), env, cwd=ROOT)


def test_memory_scheduler_takes_effect_and_is_recorded():
    memory, concurrency = _probe(True), _probe(False)
    assert memory["record"]["cpu_scheduler"] == "memory-minimizing"
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in memory["record"]["XLA_FLAGS"]
    assert concurrency["record"]["cpu_scheduler"].startswith("concurrency")
    # the concurrency scheduler undoes the policy's rematerialization; the memory one keeps it
    assert memory["temp"] < concurrency["temp"]


def test_apply_refuses_once_the_backend_runs_otherwise(monkeypatch):
    jax.numpy.zeros(1).block_until_ready()  # the backend is running
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(XlaSettingsError, match="XLA_FLAGS"):
        flags.apply(XlaSettings(memory_scheduler=True))
    flags.apply(XlaSettings())  # nothing process-wide asked: fine


def test_compiler_options_reach_xla():
    s = XlaSettings(remat_pass=False, slop_factor=10, disabled_passes=("cse",))
    opts = s.compiler_options()
    assert opts == {"xla_disable_hlo_passes": "cse,rematerialization", "xla_gpu_memory_limit_slop_factor": 10}
    f = jax.jit(lambda x: (x * 2).sum())
    assert float(flags.compile_jitted(f, (jax.numpy.ones(4),), s)(jax.numpy.ones(4))) == 8.0
    with pytest.raises(Exception, match="xla_no_such_option"):
        f.lower(jax.numpy.ones(4)).compile(compiler_options={"xla_no_such_option": 1})
    rec = flags.record(s)
    assert rec["remat_pass"] is False and rec["slop_factor"] == 10 and rec["disabled_passes"] == ["cse"]
    assert "remat pass off" in flags.describe(rec)


def test_process_flags_parse(monkeypatch):
    assert flags.for_backend("cpu").memory_scheduler is True
    assert flags.for_backend("gpu").memory_scheduler is None
    monkeypatch.setenv("XLA_FLAGS", "--a=1 --b")
    assert flags.process_flags() == {"a": "1", "b": "true"}


def _program(compiled) -> str:
    """``compiled.as_text()`` less what differs between two compiles of one step: the source-location
    tables (the caller's lines) and each instruction's metadata."""
    head, _, rest = compiled.as_text().partition("\nFileNames")
    text = head + (rest[rest.index("\n%"):] if rest else "")
    return re.sub(r", metadata=\{[^}]*\}", "", text)


def test_a_read_only_compile_is_the_same_program_and_memory():
    import sys

    sys.path.insert(0, str(ROOT))
    from models import gpt
    from rematopt.exporters.jax_policy import apply_plan
    from rematopt.importers.jaxpr import trace_grad
    from rematopt.solve import solve

    loss, args = gpt.factory(layers=2, width=32, heads=2, seq=32, batch=2, vocab=64)
    graph = trace_grad(loss, *args, fuse="xla")
    plan = solve(graph, "greedy", budget_ratio=0.7).plan
    s = XlaSettings()  # this process's scheduler, whichever it is
    for fn in (loss, apply_plan(loss, graph, plan)):
        step = jax.jit(jax.value_and_grad(fn))
        # XLA's default level, whatever XLA_FLAGS says (the suite's conftest lowers it)
        run = step.lower(*args).compile(compiler_options={"xla_backend_optimization_level": 3})
        read = flags.compile_jitted(step, args, s, read_only=True)
        assert run.memory_analysis().temp_size_in_bytes == read.memory_analysis().temp_size_in_bytes
        assert _program(run) == _program(read)
    assert flags.read_only_options() == (flags.READ_ONLY if jax.default_backend() == "cpu" else {})
