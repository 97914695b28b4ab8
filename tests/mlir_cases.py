"""Helpers the MLIR tests share: a plan that recomputes given nodes, verifying
an exported module, and JAX training steps lowered to StableHLO."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import pytest

from rematopt.plan import Plan, PlanBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's models/

def remat_plan(g, targets) -> Plan:
    """Recompute each target right before its last consumer, free every value
    (every instance) right after its last reader; outputs stay."""
    pos = g.position
    last = {p: max(g.succs[p], key=pos.__getitem__) for p in targets}
    seq = []  # (node, instance id)
    for i in g.order:
        if g.nodes[i].is_input:
            continue
        seq += [p for p in targets if last[p] == i] + [i]
    latest = {v.id: ("in", v.id) for v in g.nodes if v.is_input}
    instances = [latest[v] for v in sorted(latest)]
    last_read: dict = {inst: -1 for inst in instances}
    computed = []
    for t, i in enumerate(seq):
        for p in g.preds[i]:
            last_read[latest[p]] = t
        latest[i] = (t, i)
        last_read[latest[i]] = t
        computed.append(latest[i])
    keep = {latest[v.id] for v in g.nodes if v.output or v.persistent}
    b = PlanBuilder()
    for inst in instances:
        if last_read[inst] == -1 and inst not in keep:
            b.free(inst[1])
    for t, i in enumerate(seq):
        b.compute(i)
        for inst, when in last_read.items():
            if when == t and inst not in keep:
                b.free(inst[1])
    return b.build(g.name, "hand")


def verify(path: Path, function: str = "main") -> dict:
    """Parse and verify ``path``; the ``tessera.remat_*`` attributes of ``function``."""
    from jax._src.interpreters.mlir import make_ir_context
    from jax._src.lib.mlir import ir

    ctx = make_ir_context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        module = ir.Module.parse(path.read_text())
        assert module.operation.verify()
        func = next(op for op in module.body.operations if op.attributes["sym_name"].value == function)
        return {k: func.attributes[k].value for k in func.attributes if k.startswith("tessera.remat")}


def lower(tmp_path: Path, fn, *args, name: str = "step", debug_info: bool = True) -> Path:
    path = tmp_path / f"{name}.mlir"
    path.write_text(jax.jit(fn).lower(*args).as_text(debug_info=debug_info))
    return path


def model_step(name: str, **config):
    module = pytest.importorskip(f"models.{name}")
    loss_fn, args = module.factory(**config)
    return loss_fn, args


STEPS = {"mlp": {"layers": 2, "width": 32, "in_dim": 16, "batch": 8},
         "gpt": {"layers": 1, "width": 32, "seq": 16, "vocab": 64, "heads": 2, "batch": 2}}
