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
from ...xla.flags import read_only_options
from .flatten import Const, aval_bytes, bind
from .step import Step

TAG = "rmq"
_TAG = re.compile(rf"(?:^|[/(]){TAG}(\d+)(?=[/)]|$)")  # in a transform too: ``transpose(jvp(rmq7))``


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
        return jax.jit(run).lower(*structs).compile(compiler_options=read_only_options() or None)
    except Exception as e:  # XLA refused the program: one line, as for a tracing failure
        raise ImportFailure(f"compiling the step failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}") \
            from None


def equation_of(op_name: str) -> int | None:
    """The equation an HLO instruction came from (its innermost ``rmq<k>`` scope; in a step that
    ``apply_plan(..., scopes=True)`` made, the forward pass's equations read ``jvp(rmq<k>)`` and the
    backward pass's ``transpose(jvp(rmq<k>))``). Where XLA merged
    instructions (``a;b``: a transpose of a transpose) the latest equation's, whose result it is."""
    found = [int(tags[-1]) for part in op_name.split(";") if (tags := _TAG.findall(part))]
    return max(found) if found else None


def materialized(step: Step, module, producer: dict[int, int],
                 again: set[str]) -> tuple[dict[int, int], set[int], dict[int, set[int]]]:
    """The equations whose results XLA's kernels write to memory, each with the position in the
    entry schedule of the first kernel writing it (a kernel inside a loop body: the loop's
    position), and the values written: the root of each fusion (each root operand of a
    multi-output fusion) and every other instruction that writes a buffer. Of an equation with
    several results, the ones of the kernel's shape (all where none matches). A view XLA copied
    counts as the value it views. Third: per materialized equation, the equations its kernels
    compute (or view) inside without reading them from memory (:func:`_reads`), which they
    recompute there even where another kernel stores them."""
    from ...xla.kernels import NOT_KERNELS

    eqns = step.flat.eqns
    where = {}
    for pos, inst in enumerate(module.schedule):
        where[inst.name] = pos
        for called in inst.called:
            if inst.opcode in ("while", "conditional", "call"):
                where.update((i.name, pos) for i in module.computations[called].instructions)
    first: dict[int, int] = {}
    inside: dict[int, set[int]] = {}
    values: set[int] = set()
    for comp in module.computations.values():
        if not (comp.is_entry or _is_body(module, comp.name)):
            continue
        for inst in comp.instructions:
            if inst.opcode in NOT_KERNELS or inst.opcode in ("while", "conditional", "call"):
                continue
            fused = _reads(step, module, producer, comp, inst, again)
            for source in _written(module, inst):
                k = equation_of(source.metadata.op_name)
                if k is None:
                    continue
                k = _root_eqn(step, k, producer)
                at = where.get(inst.name, 0)
                first[k] = min(first.get(k, at), at)
                inside.setdefault(k, set()).update(fused)
                outs = eqns[k].outs
                leaf = source.shape.leaves[0] if len(source.shape.leaves) == 1 else None
                same = [v for v in outs if leaf is not None
                        and tuple(getattr(step.flat.avals[v], "shape", ())) == leaf.dims]
                values.update(same if len(outs) > 1 and same else outs)
    return first, values, inside


def _reads(step: Step, module, producer: dict[int, int], comp, inst, again: set[str]) -> set[int]:
    """The equations the kernel ``inst`` computes or views inside and does not read from memory.
    What it reads is found by data flow: the buffers its operands are, looked through aliases (a
    while loop, or a call of one, runs in its operand's: :func:`_runs_in_operand`), through kernels no
    scope names and through ``again`` (an equation's buffer computed again from other values: XLA's
    transposed copy of a ReLU output for a weight-gradient convolution, which reads the convolution
    before the ReLU). What it has
    inside: the tags of its fused instructions (a bitcast tagged with a transpose is that
    transpose, done as a layout; a bitcast of a parameter tagged with its producer is a read) and
    of the aliases and kernels it reads through."""
    from ...xla.kernels import NOT_KERNELS

    read: set[int] = set()
    fused: set[int] = set()

    def tag(i) -> None:
        k = equation_of(i.metadata.op_name)
        if k is not None:
            fused.add(_root_eqn(step, k, producer))

    def kernel(k_inst, seen: set[str]) -> None:
        for called in k_inst.called if k_inst.opcode == "fusion" else ():
            for i in module.computations[called].instructions:
                tag(i)
        for operand in k_inst.operands:
            operand_of(operand, (), seen)

    def operand_of(name: str, index: tuple, seen: set[str]) -> None:
        x = comp.by_name.get(name)
        if x is None or name in seen:
            return
        seen.add(name)
        if x.opcode in ("bitcast", "opt-barrier", "optimization-barrier") or _runs_in_operand(module, x):
            tag(x)
            operand_of(x.operands[0], index, seen)
            return
        if x.opcode == "get-tuple-element":
            tag(x)
            operand_of(x.operands[0], (int(x.attrs.get("index", "0")), *index), seen)
            return
        if x.opcode == "tuple":
            if index and index[0] < len(x.operands):
                operand_of(x.operands[index[0]], index[1:], seen)
            return
        if x.opcode in NOT_KERNELS or x.opcode in ("conditional", "call"):
            return
        sources = _written(module, x)
        if len(sources) > 1 and index:
            sources = sources[index[0]:index[0] + 1]
        ks = {equation_of(s.metadata.op_name) for s in sources} - {None}
        if ks and name not in again:
            read.update(_root_eqn(step, k, producer) for k in ks)
        else:  # a kernel no scope names, or a value computed again, reads for this one
            kernel(x, seen)

    kernel(inst, {inst.name})
    return fused - read


def name_unnamed(module) -> None:
    """Give each kernel no scope names the equation of a bitcast of its result that has one: XLA's
    rewrite of a backward convolution drops the metadata and keeps it on the bitcast only."""
    from ...xla.kernels import NOT_KERNELS

    for comp in module.computations.values():
        for x in comp.instructions:
            if x.opcode != "bitcast" or equation_of(x.metadata.op_name) is None or not x.operands:
                continue
            src = comp.by_name.get(x.operands[0])
            if (src is not None and src.opcode not in NOT_KERNELS
                    and all(equation_of(s.metadata.op_name) is None for s in _written(module, src))):
                src.metadata.op_name = x.metadata.op_name


def _eqn_of_buffer(step: Step, module, producer: dict[int, int], instruction: str, index: tuple) -> int | None:
    """The equation whose result the entry instruction writes at ``index`` (None: no scope names one)."""
    inst = module.entry.by_name.get(instruction)
    if inst is None:
        return None
    sources = _written(module, inst)
    if len(sources) > 1 and index:
        sources = sources[index[0]:index[0] + 1]
    for source in sources:
        k = equation_of(source.metadata.op_name)
        if k is not None:
            return _root_eqn(step, k, producer)
    return None


def _buffers(step: Step, module, producer: dict[int, int]) -> tuple[dict[int, list], list, set[str]]:
    """The entry's temporaries (:func:`rematopt.xla.memory.temporaries`) by the equation they hold,
    each list ending in the one the equation's node stands for; those of kernels no scope names;
    and the kernels that compute an equation again into a second buffer. The node stands for the
    first buffer written, or the last-dying of it, its copies (a kernel reading it: a second
    layout) and the buffers written while it lives (pieces: threefry's halves of random bits);
    a buffer computed again from other values once those are gone (XLA's transposed copy of a
    ReLU output, made from the convolution before it for a weight-gradient convolution) is a
    temporary of its reader."""
    from ...xla.memory import temporaries

    by_eqn: dict[int, list] = {}
    unnamed = []
    for buf, first, last in temporaries(module):
        if not buf.bytes:
            continue
        k = _eqn_of_buffer(step, module, producer, buf.instruction, buf.index)
        if k is None:
            unnamed.append((buf, first, last))
        else:
            by_eqn.setdefault(k, []).append((buf, first, last))
    entry = module.entry
    again: set[str] = set()
    for k, bufs in by_eqn.items():
        bufs.sort(key=lambda t: (t[1], t[2]))
        chain, held = {bufs[0][0].instruction}, bufs[0][2]
        for buf, first, last in bufs[1:]:
            if (len(step.flat.eqns[k].outs) > 1 or buf.instruction in chain or first <= held
                    or _operand_kernels(entry, entry.by_name[buf.instruction]) & chain):
                chain.add(buf.instruction)
                held = max(held, last)
            else:
                again.add(buf.instruction)
        bufs.sort(key=lambda t: (t[0].instruction in chain, t[2], -t[1]))
    return by_eqn, unnamed, again


def _operand_kernels(comp, inst) -> set[str]:
    """The instructions whose buffers ``inst`` reads, looked through aliases."""
    from ...xla.memory import ALIASES

    out, todo = set(), list(inst.operands)
    while todo:
        x = comp.by_name.get(todo.pop())
        if x is None or x.name in out:
            continue
        out.add(x.name)
        if x.opcode in ALIASES:
            todo.extend(x.operands)
    return out


def _runs_in_operand(module, x) -> bool:
    """A loop, which runs in its operand's buffers, or a call of a computation that is only such a loop
    over its parameter: JAX 0.12's CPU XLA calls threefry's loop over the two halves of random bits so
    (``xla_cpu_small_call``), where 0.10 ran the loop in the entry."""
    if x.opcode == "while":
        return True
    callee = module.computations.get(x.called[0]) if x.opcode == "call" and len(x.called) == 1 else None
    root = callee.root if callee is not None else None
    return (root is not None and root.opcode == "while" and bool(root.operands)
            and root.operands[0] in callee.by_name and callee.by_name[root.operands[0]].opcode == "parameter")


def _pieces(step: Step, module, by_eqn: dict[int, list], housed: set) -> dict[int, list]:
    """Per equation of one result, the buffers that are parts of its value beside the one its node
    stands for: written by a kernel that reads none of the equation's buffers (not a copy) or as
    another result of the instruction writing that one, dying where that one dies, neither housed
    in an output's allocation (the plain step's figure needs a housed one apart). Threefry's halves
    of random bits are: XLA's readers of the bits each compute them from both halves, so a kept mask
    holds both (keras_gpt2, cpsat at 0.8: seven masks held at twice their bytes at XLA's peak). JAX
    0.10's XLA runs their loop in the buffers of the kernels before it; 0.12's calls the loop, whose
    two results are the halves."""
    entry = module.entry
    out: dict[int, list] = {}
    for k, bufs in by_eqn.items():
        if len(step.flat.eqns[k].outs) > 1 or len(bufs) < 2:
            continue
        own = {b.instruction for b, _, _ in bufs}
        node, _, last = bufs[-1]
        if (node.instruction, node.index) in housed:
            continue
        found = [b for b, _, end in bufs[:-1] if end == last and (b.instruction, b.index) not in housed
                 and (b.instruction == node.instruction  # another result of the call (JAX 0.12's loop)
                      or not _operand_kernels(entry, entry.by_name[b.instruction]) & own)]
        if found:
            out[k] = found
    return out


def scratch_buffers(step: Step, module, producer: dict[int, int], by_eqn: dict[int, list],
                    unnamed: list, pieces: dict[int, list]) -> list[tuple[str, int, int, int | None]]:
    """The temporaries XLA makes beyond one per materialized equation: of the buffers its kernels
    write for one equation (:func:`_buffers`), all but the one its node stands for and its
    :func:`_pieces`, and the buffers of kernels no scope names. Each as (instruction, bytes,
    first position in the entry schedule, the equation of its last reader or None)."""
    schedule = module.entry.instructions
    out = list(unnamed)
    for k, bufs in by_eqn.items():
        merged = {id(b) for b in pieces.get(k, ())}
        out.extend(t for t in bufs[:-1] if id(t[0]) not in merged)
    found = []
    for buf, first, last in sorted(out, key=lambda t: t[1]):
        reader = schedule[last]
        found.append((buf.instruction, buf.bytes, first, _eqn_of_buffer(step, module, producer, reader.name, ())))
    return found


def layout_copies(step: Step, module, producer: dict[int, int]) -> dict[int, int]:
    """The step's results XLA writes in a layout of their own and then copies into the output's
    (a ``copy``, or a fusion of one, that the entry's root reads): each result's equation with the
    bytes of the buffer its kernel writes. In the plain step XLA copies each right after its
    kernel; in a planned step, where the kernel runs earlier, the copy can come at the step's end
    (resnet and unet's weight gradients, :mod:`rematopt.exporters.jax_applied`)."""
    from ...xla.memory import ALIASES

    entry = module.entry
    out: dict[int, int] = {}
    todo = list(entry.root.operands) if entry.root.opcode == "tuple" else [entry.root.name]
    for name in todo:
        x = _unbitcast(entry, name)
        if x is None or not _is_copy(module, x) or not x.operands:
            continue
        src = entry.by_name.get(x.operands[0])
        while src is not None and src.opcode in ALIASES and src.operands:
            src = entry.by_name.get(src.operands[0])
        if src is None or src.opcode in ("parameter", "constant"):
            continue
        k = _eqn_of_buffer(step, module, producer, x.operands[0], ())
        k = _eqn_of_buffer(step, module, producer, src.name, ()) if k is None else k
        if k is not None and len(src.shape.leaves) == 1:
            out[k] = src.shape.leaves[0].bytes  # (in the order of the results: the order XLA copies them in)
    return out


def weight_copies(step: Step, module) -> list[int]:
    """The dots and convolutions whose kernels read an argument through a copy XLA makes of it: a
    kernel no equation names that reads parameters alone (keras_gemma's query projection reads its
    [n, d, h] weight as [d, n·h]). Where ``apply_plan`` computes one again it ties those arguments:
    untied, XLA's CSE merged the recomputation's copy with the forward pass's, which then lived to
    the backward pass (:func:`rematopt.exporters.jax_policy._evaluate_tied`)."""
    from .primitives import MATMUL

    entry = module.entry

    def copied(x) -> bool:
        return (x is not None and x.opcode not in ("parameter", "constant") and bool(x.operands)
                and equation_of(x.metadata.op_name) is None
                and all(getattr(_unbitcast(entry, o), "opcode", None) == "parameter" for o in x.operands))

    eqns = step.flat.eqns
    out = set()
    for inst in entry.instructions:
        dots = {k for k in (equation_of(w.metadata.op_name) for w in _written(module, inst))
                if k is not None and eqns[k].prim.name in MATMUL}
        if dots and any(copied(_unbitcast(entry, o)) for o in inst.operands):
            out |= dots
    return sorted(out)


def _unbitcast(comp, name: str):
    """The instruction ``name`` is a bitcast of, through any number of them (None where not in ``comp``)."""
    x = comp.by_name.get(name)
    while x is not None and x.opcode == "bitcast" and x.operands:
        x = comp.by_name.get(x.operands[0])
    return x


def _is_copy(module, inst) -> bool:
    """A layout change: a ``copy``, or a fusion whose root is a copy of its one parameter."""
    if inst.opcode == "copy":
        return True
    if inst.opcode != "fusion" or not inst.called or inst.called[0] not in module.computations:
        return False
    root = module.computations[inst.called[0]].root
    return root.opcode == "copy" and len(inst.operands) == 1


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
        out.append(r if equation_of(r.metadata.op_name) is not None or len(roots) > 1 else inst)
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
    from ...xla.memory import backend_of, compiled_memory, housed_in_outputs, xla_reference

    compiled = compile_named(step)
    module = parse_hlo(compiled.as_text())
    name_unnamed(module)
    backend = backend_of(module)
    reference = xla_reference(compiled.memory_analysis(), backend)
    info = {"backend": backend, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "kernels_peak_bytes":
            compiled_memory(module, backend).peak_bytes, "xla_bytes": reference.bytes, "xla_bytes_are": reference.what}

    eqns = step.flat.eqns
    producer = {v: k for k, e in enumerate(eqns) for v in e.outs}
    by_eqn, unnamed, again = _buffers(step, module, producer)
    housed = {(b.instruction, b.index) for b in housed_in_outputs(module)} if backend == "cpu" else set()
    pieces = _pieces(step, module, by_eqn, housed)
    position, stored, inside = materialized(step, module, producer, again)
    step.kernels_of = kernels_by_equation(step, module, producer)
    step.positions = position
    step.scratch = scratch_buffers(step, module, producer, by_eqn, unnamed, pieces)
    step.written = {k: bufs[-1][0].bytes + sum(b.bytes for b in pieces.get(k, ()))
                    for k, bufs in by_eqn.items() if len(eqns[k].outs) == 1}
    step.pieces = {k: 1 + len(found) for k, found in pieces.items()}
    step.layout_copied = layout_copies(step, module, producer)
    info["weight_copies"] = weight_copies(step, module)
    if backend == "cpu":
        step.housed = frozenset(k for k, bufs in by_eqn.items()
                                if (bufs[-1][0].instruction, bufs[-1][0].index) in housed)
        step.housed_scratch = frozenset(i for i, _ in housed)
    for r in step.out_refs:
        if not isinstance(r, Const) and step.root_of(r) in producer:
            stored.add(step.root_of(r))
    stored |= {v for e in eqns if e.effectful for v in e.outs}
    heads = {producer[v] for v in stored if v in producer} - set(step.view_eqns)
    step.stored = frozenset(stored)
    groups = []
    for h in sorted(heads):
        members, todo = {h}, [h]
        while todo:
            for r in eqns[todo.pop()].ins:
                if isinstance(r, Const):
                    continue
                v = step.root_of(r)
                p = producer.get(v)
                # a value no kernel stores is computed again inside each kernel reading it, and so
                # is one a kernel of h computes inside (not reading it) though another kernel stores it
                if (p is not None and (v not in stored or p in inside.get(h, ())) and p not in members
                        and p not in step.view_eqns):
                    members.add(p)
                    todo.append(p)
        groups.append(sorted(members))
    # what no kernel reads (a residual jax.vjp saves but the backward never reads) stays a node of
    # its own, as in the unfused graph
    grouped = {k for g in groups for k in g} | set(step.view_eqns)
    groups.extend([k] for k in range(len(eqns)) if k not in grouped)
    return _schedule_order(step, groups, position, producer, stored), info


def xla_memory(step: Step, nodes: list, edges: list[tuple[int, int]]) -> list[int]:
    """Make the graph hold memory as XLA allocates it (appending nodes to ``nodes`` and ``edges``);
    returns the graph's order. Beside the nodes of the step's groups (ids unchanged):

    - a value XLA writes as several buffers (:func:`_pieces`) holds them all (``extra.pieces``: how
      many);
    - a temporary XLA makes beyond one per equation (:func:`scratch_buffers`) is a node of its own
      (``extra.xla_buffer``: the instruction), placed at its kernel in XLA's schedule and read by
      the node of its last reader;
    - XLA gives each result (a gradient) an allocation for the whole step: each output node's bytes
      move to a persistent input node (``extra.allocation_of``: the node it holds);
    - on CPU its buffer assignment houses temporaries in those allocations until the output is
      written (:func:`rematopt.xla.memory.housed_in_outputs`, the rule the walk reproduces XLA's
      figures with, over the compiled plain step): the nodes whose buffers it houses there cost
      nothing of their own (``extra.housed``: their bytes). (The same rule over the graph's own
      live ranges housed other buffers of equal size: flax_linen +3.9%, equinox_lm +4.2%.)
    - an output XLA writes in a layout of its own and copies into the output's allocation
      (:func:`layout_copies`) keeps the bytes of that first buffer in ``extra.layout_copy``."""
    from ...graph import Node

    base = list(range(len(nodes)))
    if step.compiled is not None:  # the nodes that are the step's inputs and groups (an exporter's)
        step.compiled["step_nodes"] = len(base)
    for i, g in enumerate(step.groups):  # of several results, the ones XLA writes
        outs = step.flat.eqns[g[-1]].outs
        if len(outs) > 1 and any(v in step.stored for v in outs):
            nodes[step.node_of_group(i)].bytes = sum(aval_bytes(step.flat.avals[v]) for v in outs if v in step.stored)
        elif g[-1] in step.written:  # a kernel may write less (a broadcast moved after it)
            nodes[step.node_of_group(i)].bytes = step.written[g[-1]]
            if g[-1] in step.pieces:
                nodes[step.node_of_group(i)].extra["pieces"] = step.pieces[g[-1]]
    node_of = step.nodes_of_equations()
    where = {step.node_of_group(i): step.positions.get(g[-1]) for i, g in enumerate(step.groups)}
    at = {nid: t for t, nid in enumerate(base)}
    before: dict[int, list[int]] = {}
    for instruction, nbytes, first, reader in step.scratch:
        succ = node_of.get(reader) if reader is not None else None
        if succ is None:
            continue
        slot = next((t for t in range(step.n_inputs, at[succ]) if (where.get(base[t]) or 0) >= first), at[succ])
        nid = len(nodes)
        nodes.append(Node(nid, name=f"{instruction}.{nid}", op="xla_buffer", bytes=nbytes,
                          phase=nodes[succ].phase, extra={"xla_buffer": instruction}))
        edges.append((nid, succ))
        before.setdefault(slot, []).append(nid)
    order = [i for t, nid in enumerate(base) for i in (*before.get(t, []), nid)]
    outputs = {v.id: v.bytes for v in nodes if v.output and not v.is_input and v.bytes}
    for v in nodes:
        if v.is_input or v.output:
            continue
        head = step.groups[v.id - step.n_inputs][-1] if v.id < len(base) else None
        if head in step.housed or v.extra.get("xla_buffer") in step.housed_scratch:
            v.extra["housed"] = v.bytes
            v.bytes = 0
    for i in sorted(outputs):
        node = nodes[i]
        nodes.append(Node(len(nodes), name=f"allocation:{node.name}", op="input", kind="input",
                          bytes=node.bytes, persistent=True, extra={"allocation_of": node.id}))
        node.bytes = 0
        node.extra["allocation"] = len(nodes) - 1
        head = step.groups[i - step.n_inputs][-1] if step.n_inputs <= i < len(base) else None
        if head in step.layout_copied:
            node.extra["layout_copy"] = step.layout_copied[head]
            node.extra["layout_copy_order"] = list(step.layout_copied).index(head)
        order.insert(0, len(nodes) - 1)
    return order


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
