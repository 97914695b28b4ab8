"""Nodes as XLA materializes them: a traced step grouped by the kernels of its compiled plain step.

The step's equations are compiled once, each under a ``jax.named_scope`` naming it (``rmq<k>`` for
equation ``k``), so every instruction of XLA's optimized HLO says in its ``op_name`` which equation
it came from, fused internals included. An equation whose result some kernel writes to memory (a
fusion's root, a library call, a copy) is *materialized*: it heads a node. Every other equation
costs no memory of its own: XLA fused it into the kernels that read it (or made it a layout-only
view), so it joins each consumer's node, recomputed there for free, and cannot be kept alone.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp

from ...errors import ImportFailure
from .flatten import Const, bind
from .step import Step

TAG = "rmq"
_TAG = re.compile(rf"(?:^|/){TAG}(\d+)(?:/|$)")


def compile_named(step: Step):
    """XLA's compiled plain step (``jax.jit(...).lower(...).compile()``) of ``step``'s equations, each
    traced under a scope naming it. Loss cotangent 1, as ``jax.value_and_grad`` seeds it."""
    flat = step.flat

    def run(*leaves):
        env: dict[Any, Any] = dict(zip(step.arg_ids, leaves))
        if step.ct_id is not None:
            aval = flat.avals[step.ct_id]
            env[step.ct_id] = jnp.ones(aval.shape, aval.dtype)

        def read(r):
            return r.value if isinstance(r, Const) else env[r]

        for k, e in enumerate(flat.eqns):
            with jax.named_scope(f"{TAG}{k}"):
                env.update(zip(e.outs, bind(e, [read(r) for r in e.ins])))
        return [read(r) for r in step.out_refs]

    structs = [jax.ShapeDtypeStruct(flat.avals[v].shape, flat.avals[v].dtype) for v in step.arg_ids]
    try:
        return jax.jit(run).lower(*structs).compile()
    except Exception as e:  # XLA refused the program: one line, as for a tracing failure
        raise ImportFailure(f"compiling the step failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}") \
            from None


def equation_of(op_name: str) -> int | None:
    """The equation an HLO instruction came from (its innermost ``rmq<k>`` scope)."""
    found = _TAG.findall(op_name)
    return int(found[-1]) if found else None


def materialized(step: Step, module, producer: dict[int, int]) -> tuple[dict[int, int], set[int]]:
    """The equations whose results XLA's kernels write to memory, each with the position in the
    entry schedule of the first kernel writing it (a kernel inside a loop body: the loop's
    position), and the values written: the root of each fusion (each root operand of a
    multi-output fusion) and every other instruction that writes a buffer. Of an equation with
    several results, the ones of the kernel's shape (all where none matches). A view XLA copied
    counts as the value it views."""
    from ...xla.kernels import NOT_KERNELS

    eqns = step.flat.eqns
    where = {}
    for pos, inst in enumerate(module.schedule):
        where[inst.name] = pos
        for called in inst.called:
            if inst.opcode in ("while", "conditional", "call"):
                where.update((i.name, pos) for i in module.computations[called].instructions)
    first: dict[int, int] = {}
    values: set[int] = set()
    for comp in module.computations.values():
        if not (comp.is_entry or _is_body(module, comp.name)):
            continue
        for inst in comp.instructions:
            if inst.opcode in NOT_KERNELS or inst.opcode in ("while", "conditional", "call"):
                continue
            for source in _written(module, inst):
                k = equation_of(source.metadata.op_name)
                if k is None:
                    continue
                k = _root_eqn(step, k, producer)
                at = where.get(inst.name, 0)
                first[k] = min(first.get(k, at), at)
                outs = eqns[k].outs
                leaf = source.shape.leaves[0] if len(source.shape.leaves) == 1 else None
                same = [v for v in outs if leaf is not None
                        and tuple(getattr(step.flat.avals[v], "shape", ())) == leaf.dims]
                values.update(same if len(outs) > 1 and same else outs)
    return first, values


def _is_body(module, name: str) -> bool:
    return any(name in i.called and i.opcode in ("while", "conditional", "call")
               for c in module.computations.values() for i in c.instructions)


def _written(module, inst):
    """The instructions whose values ``inst`` writes: a fusion's root (or its root tuple's operands,
    looked through bitcasts); the instruction itself otherwise."""
    if inst.opcode != "fusion" or not inst.called or inst.called[0] not in module.computations:
        return [inst]
    fused = module.computations[inst.called[0]]
    roots = [fused.by_name[o] for o in fused.root.operands] if fused.root.opcode == "tuple" else [fused.root]
    out = []
    for r in roots:
        while equation_of(r.metadata.op_name) is None and r.operands and r.operands[0] in fused.by_name:
            r = fused.by_name[r.operands[0]]  # XLA's own root (a bitcast, a concatenate): its source
        out.append(r)
    return out


def kernels_by_equation(step: Step, module, producer: dict[int, int]) -> dict[int, list[tuple[Any, float]]]:
    """Each materialized equation's kernels (:func:`rematopt.xla.kernels.kernels`, loops included),
    with the share of each it takes: a kernel writing several equations' values splits evenly.
    Kernels no equation tag reaches (XLA's own copies) are left out."""
    from ...xla.kernels import kernels

    out: dict[int, list[tuple[Any, float]]] = {}
    for kernel in kernels(module):
        inst = module.computations[kernel.computation].by_name[kernel.name]
        eqns = {_root_eqn(step, k, producer) for k in (equation_of(src.metadata.op_name) for src in
                                                        _written(module, inst)) if k is not None}
        for k in eqns:
            out.setdefault(k, []).append((kernel, 1.0 / len(eqns)))
    return out


def _root_eqn(step: Step, k: int, producer: dict[int, int]) -> int:
    """``k``, or for a view equation the equation making the buffer it views."""
    eqns = step.flat.eqns
    while k in step.view_eqns:
        src = step.root_of(eqns[k].ins[0])
        if src not in producer:
            break
        k = producer[src]
    return k


def compiled_groups(step: Step) -> tuple[list[list[int]], dict]:
    """One group per materialized equation: it, plus every equation it reads that XLA did not
    materialize, transitively (an equation fused into several kernels joins each of their groups).
    Program results are always materialized (XLA writes them). Groups come in XLA's schedule
    order (the order of the kernels writing them), so the graph's node order is the order XLA
    runs the step in. Second: what XLA said about the compiled step (for the graph's meta)."""
    import os

    from ...xla.hlo import parse_hlo
    from ...xla.memory import backend_of, compiled_memory, xla_reference

    compiled = compile_named(step)
    module = parse_hlo(compiled.as_text())
    backend = backend_of(module)
    reference = xla_reference(compiled.memory_analysis(), backend)
    info = {"backend": backend, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "kernels_peak_bytes":
            compiled_memory(module, backend).peak_bytes, "xla_bytes": reference.bytes, "xla_bytes_are": reference.what}

    eqns = step.flat.eqns
    producer = {v: k for k, e in enumerate(eqns) for v in e.outs}
    position, stored = materialized(step, module, producer)
    step.kernels_of = kernels_by_equation(step, module, producer)
    for r in step.out_refs:
        if not isinstance(r, Const) and step.root_of(r) in producer:
            stored.add(step.root_of(r))
    stored |= {v for e in eqns if e.effectful for v in e.outs}
    heads = {producer[v] for v in stored if v in producer} - set(step.view_eqns)
    groups = []
    for h in sorted(heads):
        members, todo = {h}, [h]
        while todo:
            for r in eqns[todo.pop()].ins:
                if isinstance(r, Const):
                    continue
                v = step.root_of(r)
                p = producer.get(v)
                # a value no kernel stores is computed again inside each kernel reading it
                if p is not None and v not in stored and p not in members and p not in step.view_eqns:
                    members.add(p)
                    todo.append(p)
        groups.append(sorted(members))
    # what no kernel reads (a residual jax.vjp saves but the backward never reads) stays a node of
    # its own, as in the unfused graph
    grouped = {k for g in groups for k in g} | set(step.view_eqns)
    groups.extend([k] for k in range(len(eqns)) if k not in grouped)
    return _schedule_order(step, groups, position, producer, stored), info


def _schedule_order(step: Step, groups: list[list[int]], position: dict[int, int],
                    producer: dict[int, int], stored: set[int]) -> list[list[int]]:
    """``groups`` topologically sorted, earliest XLA kernel first (a group XLA writes no kernel for
    goes as soon as what it reads is there)."""
    import heapq

    eqns = step.flat.eqns
    group_of = {g[-1]: i for i, g in enumerate(groups)}
    deps: list[set[int]] = []
    for i, g in enumerate(groups):
        inside = set(g)
        d = set()
        for k in g:
            for r in eqns[k].ins:
                if isinstance(r, Const):
                    continue
                v = step.root_of(r)
                p = producer.get(v)
                if p is not None and p not in inside and p in group_of:
                    d.add(group_of[p])
        d.discard(i)
        deps.append(d)
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    key = [position.get(g[-1]) for g in groups]
    ready = [((key[i] if key[i] is not None else -1), groups[i][-1], i) for i, d in enumerate(deps) if not d]
    heapq.heapify(ready)
    out, done_key = [], {}
    while ready:
        k, _, i = heapq.heappop(ready)
        out.append(groups[i])
        done_key[i] = k
        for u in users.get(i, []):
            waiting[u] -= 1
            if not waiting[u]:
                ku = key[u] if key[u] is not None else max(done_key[j] for j in deps[u])
                heapq.heappush(ready, (ku, groups[u][-1], u))
    if len(out) != len(groups):  # cannot happen: groups follow the program's own dependencies
        raise ImportFailure("grouping by XLA's kernels made a cycle")
    return out
