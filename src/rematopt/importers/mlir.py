"""MLIR front end: one function of a module (StableHLO as JAX lowers it, or a
compiler's own dialect in generic form) becomes a graph.

The module is parsed by the MLIR parser bundled with jaxlib (StableHLO, CHLO,
func, arith, math, tensor registered; unregistered dialects allowed, so
``"tessera.matmul"(...)`` parses in generic form). Calls to functions of the
same module are inlined in the parsed IR first, so the graph is built from one
flat block in which every op but the terminator is one node:

* block arguments are input nodes, the returned values' producers outputs;
* bytes come from the result types (element bit width, whole bytes per
  element); a dimension that is dynamic without a ``#stablehlo.bounds`` bound
  makes its result count :data:`DYNAMIC_RESULT_BYTES`;
* costs are measured attributes when present, else the shared roofline model
  (:mod:`rematopt.importers.costmodel`);
* an op is recomputable when re-running it cannot change the program: the
  pure dialects' ops, :data:`PURE_OPS`, sharding pass-throughs, and the ops
  of :data:`REGION_OPS` whose regions hold only such ops; a
  ``tessera.recompute`` mark on any other op is ``REMAT_EFFECTFUL``;
* phases come from ``tessera.autodiff.phase`` or, in JAX-lowered modules
  printed with debug info, from the name stack in each op's location
  (``transpose(jvp(...))`` is the backward pass).

The parser drops SSA names, so names are recovered from the source text at
each op's location (``%square = ...`` -> ``square``); ops the exporter renamed
carry a name location instead. :func:`load_function` is shared with the
exporter, which needs the parsed IR next to the graph.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ImportFailure
from ..graph import Graph, Node
from . import costmodel

# A result with a dynamic dimension and no bound: its size is unknowable
# statically, so it counts a nominal 4 KiB (one page) rather than zero.
DYNAMIC_RESULT_BYTES = 4096

# Dialects whose registered ops are free of side effects (region-free ones).
PURE_DIALECTS = frozenset({"stablehlo", "arith", "math", "tensor", "chlo"})
# Side-effecting ops of those dialects: communication, I/O, randomness from hidden
# state (``rng``; ``rng_bit_generator`` is a pure function of its state operand),
# tokens.
EFFECTFUL_OPS = frozenset({
    "stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed",
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all", "stablehlo.reduce_scatter",
    "stablehlo.collective_permute", "stablehlo.collective_broadcast", "stablehlo.custom_call",
    "stablehlo.rng", "stablehlo.after_all", "stablehlo.create_token",
    "stablehlo.optimization_barrier", "stablehlo.partition_id", "stablehlo.replica_id",
})
# Ops with regions that compute a pure function of their operands when every op
# in their regions is pure (a reduction's combiner, a sort's comparator, a loop
# body): re-running them gives the same values. Others (sdy.manual_computation,
# unknown dialects' region ops) stay opaque.
REGION_OPS = frozenset({
    "stablehlo.reduce", "stablehlo.reduce_window", "stablehlo.sort", "stablehlo.map",
    "stablehlo.select_and_scatter", "stablehlo.scatter", "stablehlo.while", "stablehlo.if", "stablehlo.case",
})
# Terminators inside those regions (they only yield values).
REGION_TERMINATORS = frozenset({"stablehlo.return"})
# Sharding annotations: they pass their operand through, so re-running one is a
# copy of a value (Shardy's constraint, and GSPMD's ``custom_call @Sharding``
# that carries an ``mhlo.sharding`` attribute).
PASS_THROUGH_OPS = frozenset({"sdy.sharding_constraint"})
PASS_THROUGH_CALLS = frozenset({"Sharding"})
# Ops whose results are their operands, in place: an optimization barrier
# allocates nothing and moves nothing (it only orders), so its node has 0
# bytes and cost, and its k-th result is the k-th operand's value.
ALIAS_OPS = frozenset({"stablehlo.optimization_barrier"})
# XLA's host-offload annotation (``custom_call`` with this frontend attribute,
# as JAX lowers ``device_put(x, memory_kind=...)``): a result placed in host
# memory takes no device bytes.
PLACEMENT_KEY = "_xla_buffer_placement"
HOST_KINDS = frozenset({"pinned_host", "unpinned_host"})
# The compiler ops its remat pass may recompute (known to be pure).
PURE_OPS = frozenset({
    "tessera.matmul", "tessera.batched_gemm", "tessera.softmax", "tessera.layer_norm", "tessera.rms_norm",
    "tessera.exp", "tessera.log", "tessera.gelu", "tessera.silu",
})
# Ops whose FLOPs are 2 x output elements x the lhs's last dimension.
MATMUL_OPS = frozenset({"stablehlo.dot", "tessera.matmul", "tessera.batched_gemm"})

# Attributes of the compiler's remat pass (see docs/mlir.md).
ATTR_RECOMPUTE = "tessera.recompute"
ATTR_PHASE = "tessera.autodiff.phase"
ATTR_COST = ("tessera.backward_work_ns", "tessera.remat_cost_ns")  # first present wins
ATTR_BYTES = "tessera.residual.retained_bytes"
ATTR_BUDGET_MB = "tessera.remat_budget_mb"
ATTR_BUDGET_BYTES = "tessera.remat_budget_bytes"  # wins over the MiB figure: it is exact
EFFECTFUL_MARK = "REMAT_EFFECTFUL"
# JAX's name stacks: ``jit(f)/transpose(jvp(f))/mul`` is the backward pass of
# ``jit(f)/jvp(f)/mul``; every other op (constants too) is forward.
_BACKWARD_SCOPE = "transpose("
# Why a JAX-lowered module printed without locations has no phases, and how to
# get them (``meta.no_phases``; ``import mlir`` prints it). The structure alone
# does not tell them apart soundly: see docs/mlir.md, Phases.
NO_LOCATIONS = ("no phases could be read: the module has no locations; print it with "
                "lowered.as_text(debug_info=True) to keep JAX's name stacks, which mark the backward pass")

_NAME = r"[A-Za-z_$.\-0-9]+"
# "%a, %b = " or "%r:2 = " before an op's location; some custom parsers put the
# location after the op name ("%s = stablehlo.reduce(...").
_RESULTS_BEFORE_OP = re.compile(rf"%({_NAME})(?::\d+)?\s*(?:,\s*%{_NAME}(?::\d+)?\s*)*=\s*(?:[\w.$\-]+\s*)?$")
_ARG_AT = re.compile(rf"%({_NAME})")
_FILE_LOC = re.compile(r'^loc\(".*":(\d+):\d+\)$')
_BOUNDS = re.compile(r"#stablehlo\.bounds<([^>]*)>")


@dataclass
class MlirFunction:
    """A parsed module, its selected function (calls inlined) and its graph.
    ``node_ops[i]`` is node i's operation (None for inputs); ``args[i]`` the
    block argument of input node i. The context must stay alive with the IR."""

    path: Path
    context: Any
    module: Any
    func: Any
    graph: Graph
    node_ops: list[Any]
    args: dict[int, Any]


def import_mlir(path: str | Path, function: str | None = None, drop_unsafe_marks: bool = False) -> Graph:
    """Read ``function`` (default: ``main``, else the only public function)
    of an MLIR file as a :class:`Graph`.

    Raises ImportFailure ``"FILE:LINE: reason"`` for a syntax or verifier error,
    an unknown function or an unsupported construct, and ``"REMAT_EFFECTFUL:
    OP at FILE:LINE:COL ..."`` for a ``tessera.recompute`` mark on an op that is
    not recomputable (with ``drop_unsafe_marks``, a warning; the mark is ignored).
    """
    return load_function(path, function, drop_unsafe_marks=drop_unsafe_marks).graph


def load_function(path: str | Path, function: str | None = None, device: str | None = None,
                  drop_unsafe_marks: bool = False) -> MlirFunction:
    """Parse ``path``, select ``function``, inline its calls and build its graph
    (roofline costs on ``device``, default A100), keeping the IR for the exporter."""
    path = Path(path)
    ir = _ir()
    text = _read(path)
    ctx = _context()
    with ctx, ir.Location.unknown():
        module = _parse(ir, path, text)
        func = _select_function(ir, path, module, function)
        names = _Names(path, text)
        located = any(_scope_names(op.location) for op in _ops(func))  # before the inliner adds names
        _inline_calls(ir, path, module, func.regions[0].blocks[0], names, stack=[_sym_name(func)])
        graph, node_ops, args = _build_graph(ir, path, func, names, device or costmodel.DEFAULT_DEVICE,
                                             drop_unsafe_marks)
        if not graph.has_phases and not located and _lowered_by_jax(module, func):
            graph.meta["no_phases"] = NO_LOCATIONS
    return MlirFunction(path, ctx, module, func, graph, node_ops, args)


# -- parsing ----------------------------------------------------------------


def _ir():
    try:
        from jax.interpreters.mlir import ir
    except ImportError:
        raise ImportFailure("reading MLIR needs jaxlib's MLIR bindings: pip install 'rematopt[mlir]'") from None
    return ir


def _context():
    """jaxlib's context with its dialects registered, unregistered ops allowed."""
    from jax.interpreters.mlir import make_ir_context

    ctx = make_ir_context()
    ctx.allow_unregistered_dialects = True
    return ctx


def _read(path: Path) -> str:
    if not path.exists():
        raise ImportFailure(f"{path}: no such file")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise ImportFailure(f"{path}: not a text file (MLIR bytecode is not supported)") from None


def _parse(ir, path: Path, text: str):
    try:
        return ir.Module.parseFile(str(path))
    except ir.MLIRError as e:
        diags = list(e.error_diagnostics)
        if not diags:
            raise ImportFailure(f"{path}: {e}") from None
        d = diags[0]
        line = _loc_line(d.location)
        where = f"{path}:{line}" if line else str(path)
        raise ImportFailure(f"{where}: {d.message.splitlines()[0]}") from None


def _sym_name(func) -> str:
    return func.attributes["sym_name"].value


def _loc_line(loc) -> int | None:
    """Line of a file location (diagnostics carry undowncast locations: read the text)."""
    line = getattr(loc, "start_line", None)
    if line is None:
        m = _FILE_LOC.search(str(loc))
        line = int(m.group(1)) if m else None
    return line


def _fail_at(path: Path, op, problem: str):
    line = _loc_line(op.location)
    raise ImportFailure(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")


def _where(names: "_Names", op, name: str) -> str:
    """``FILE:LINE:COL`` of ``op`` in the MLIR source; ``FILE (name, its
    location)`` when that is elsewhere (an inlined op, or a JAX location
    naming the Python source)."""
    pos = names.file_pos(op.location)
    return f"{names.path}:{pos[0]}:{pos[1]}" if pos else f"{names.path} ({name}, {op.location})"


def _functions(module) -> dict[str, Any]:
    return {_sym_name(op): op for op in module.body.operations if op.operation.name == "func.func"}


def _select_function(ir, path: Path, module, name: str | None):
    funcs = _functions(module)
    if not funcs:
        raise ImportFailure(f"{path}: the module has no func.func")
    if name is None:
        public = [n for n, f in funcs.items() if _is_public(f) and _has_body(f)]
        if "main" in funcs:
            name = "main"
        elif len(public) == 1:
            name = public[0]
        else:
            raise ImportFailure(f"{path}: no function main and {len(public)} public functions "
                                f"({', '.join(public) or 'none'}); pick one with --function")
    if name not in funcs:
        raise ImportFailure(f"{path}: no function {name!r} (functions: {', '.join(funcs)})")
    func = funcs[name]
    if not _has_body(func):
        _fail_at(path, func, f"function {name!r} is only a declaration (no body)")
    if len(func.regions[0].blocks) != 1:
        _fail_at(path, func, f"function {name!r} has several blocks (unstructured control flow is not supported)")
    return func


def _is_public(func) -> bool:
    vis = func.attributes["sym_visibility"].value if "sym_visibility" in func.attributes else "public"
    return vis == "public"


def _has_body(func) -> bool:
    return len(func.regions[0].blocks) > 0


# -- names ------------------------------------------------------------------


class _Names:
    """SSA names recovered from the source text at each location."""

    def __init__(self, path: Path, text: str):
        self.path = str(path)
        self.lines = text.splitlines()

    def file_pos(self, loc) -> tuple[int, int] | None:
        if getattr(loc, "filename", None) == self.path:
            return loc.start_line, loc.start_col
        return None

    def of_op(self, op) -> str | None:
        """``%square = arith.mulf ...`` -> ``square``; None for numbered or
        unnamed results. A name location (set by the exporter or the inliner) wins."""
        loc = op.location
        name = getattr(loc, "name_str", None)
        if name is not None:
            return name if re.fullmatch(_NAME, name) else None
        pos = self.file_pos(loc)
        if pos is None or pos[0] > len(self.lines):
            return None
        m = _RESULTS_BEFORE_OP.search(self.lines[pos[0] - 1][: pos[1] - 1])
        return m.group(1) if m and not m.group(1).isdigit() else None

    def of_arg(self, arg) -> str | None:
        """``%x: tensor<...>`` -> ``x``; a name location (JAX's
        ``params['w'][0]``) made a valid SSA name (``params_w_0``), so that
        the exporter prints it as it is."""
        name = getattr(arg.location, "name_str", None)
        if name is not None:
            return re.sub(r"[^A-Za-z_$.\-0-9]+", "_", name).strip("_") or None
        pos = self.file_pos(arg.location)
        if pos is None or pos[0] > len(self.lines):
            return None
        m = _ARG_AT.match(self.lines[pos[0] - 1], pos[1] - 1)
        return m.group(1) if m and not m.group(1).isdigit() else None


# -- inlining ---------------------------------------------------------------


def _inline_calls(ir, path: Path, module, block, names: _Names, stack: list[str], ops=None) -> None:
    """Replace each ``func.call`` to a function with a body in this module by a
    copy of the callee's body; the copies are named ``<call>.<name>``."""
    funcs = _functions(module)
    for k, op in enumerate(list(block.operations) if ops is None else ops):
        if op.operation.name != "func.call":
            continue
        callee_name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        callee = funcs.get(callee_name)
        if callee is None or not _has_body(callee):
            continue  # an external declaration stays an opaque call
        if callee_name in stack:
            _fail_at(path, op, f"recursive call to @{callee_name} cannot be inlined")
        if len(callee.regions[0].blocks) != 1:
            _fail_at(path, callee, f"function {callee_name!r} has several blocks "
                                  "(unstructured control flow is not supported)")
        prefix = names.of_op(op) or f"call.{callee_name}.{k}"
        body = callee.regions[0].blocks[0]
        mapping = dict(zip(body.arguments, op.operands))
        copies = []
        returned = []
        for j, inner in enumerate(body.operations):
            if inner.operation.name == "func.return":
                returned = [mapping.get(v, v) for v in inner.operands]
                break
            copy = inner.operation.clone(ip=ir.InsertionPoint(op))
            replace_operands(copy, mapping)
            mapping.update(zip(inner.results, copy.results))
            # named after the call, keeping both locations: the call's name stack says
            # whether the callee runs in the backward pass (JAX's transposed calls)
            copy.location = ir.Location.name(f"{prefix}.{names.of_op(inner) or f'{inner.operation.name}.{j}'}",
                                             childLoc=ir.Location.fused([inner.location, op.location]))
            copies.append(copy)
        for result, value in zip(op.results, returned):
            result.replace_all_uses_with(value)
        op.operation.erase()
        _inline_calls(ir, path, module, block, names, stack + [callee_name], copies)


def replace_operands(op, mapping: dict) -> None:
    """Rewire every use in ``op`` and its regions of a key of ``mapping``."""
    for v in list(op.operands):
        if v in mapping:
            op.operation.replace_uses_of_with(v, mapping[v])
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                replace_operands(inner, mapping)


def used_values(op) -> list:
    """Operands of ``op`` and values its regions use from outside (captures)."""
    values = list(op.operands)
    inner: set = set()
    for region in op.regions:
        for block in region.blocks:
            inner.update(block.arguments)
            for nested in block.operations:
                inner.update(nested.results)
                values.extend(used_values(nested))
    return [v for v in values if v not in inner]


# -- sizes and costs ----------------------------------------------------------


def _element_bytes(ir, t) -> int:
    """Bytes of one element: whole bytes (i1 takes one, as XLA stores it)."""
    if isinstance(t, ir.ComplexType):
        return 2 * _element_bytes(ir, t.element_type)
    if isinstance(t, ir.IndexType):
        return 8
    width = getattr(t, "width", None)
    return math.ceil(width / 8) if width else 0


def _elements(ir, t) -> int | None:
    """Element count of a tensor type (bounded dimensions at their bound),
    1 for a scalar, None when a dimension is dynamic without a bound."""
    if isinstance(t, ir.UnrankedTensorType):
        return None
    if not isinstance(t, ir.ShapedType):
        return 1
    bounds = _bounds(t)
    count = 1
    for d, size in enumerate(t.shape):
        if t.is_dynamic_dim(d):
            if bounds is None or bounds[d] is None:
                return None
            size = bounds[d]
        count *= size
    return count


def _bounds(t) -> list[int | None] | None:
    encoding = getattr(t, "encoding", None)
    m = _BOUNDS.search(str(encoding)) if encoding is not None else None
    if not m:
        return None
    return [None if b.strip() == "?" else int(b) for b in m.group(1).split(",")]


def value_bytes(ir, t) -> int:
    """Device bytes of a value of type ``t``."""
    elem = _element_bytes(ir, t.element_type if isinstance(t, (ir.ShapedType, ir.UnrankedTensorType)) else t)
    count = _elements(ir, t)
    return DYNAMIC_RESULT_BYTES if count is None else count * elem


def _shape(ir, t) -> list[int]:
    return list(t.shape) if isinstance(t, ir.RankedTensorType) and t.has_static_shape else []


def contraction_flops(ir, op) -> float | None:
    """FLOPs of a matmul-like op or a convolution (2 per multiply-add), None
    for any other op."""
    name = op.operation.name
    in_types = [v.type for v in op.operands]
    out_elems = sum(_elements(ir, r.type) or 0 for r in op.results)
    lhs = _shape(ir, in_types[0]) if in_types else []
    if name == "stablehlo.dot_general" and lhs:
        from jaxlib.mlir.dialects import stablehlo as hlo

        dims = hlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"]).lhs_contracting_dimensions
        return costmodel.matmul_flops(out_elems, math.prod(lhs[d] for d in dims))
    if name in MATMUL_OPS and lhs:
        return costmodel.matmul_flops(out_elems, lhs[-1])
    if name == "stablehlo.convolution" and len(in_types) > 1 and _shape(ir, in_types[1]):
        from jaxlib.mlir.dialects import stablehlo as hlo

        kernel = _shape(ir, in_types[1])
        out_dim = hlo.ConvDimensionNumbers(op.attributes["dimension_numbers"]).kernel_output_feature_dimension
        return costmodel.conv_flops(out_elems, math.prod(kernel), kernel[out_dim])
    return None


def element_counts(ir, op) -> tuple[list[int], list[int]]:
    """Elements of each operand and of each result (0 when unknowable)."""
    return ([_elements(ir, v.type) or 0 for v in op.operands], [_elements(ir, r.type) or 0 for r in op.results])


def roofline_cost(ir, op, dev: costmodel.Device) -> float:
    """Seconds for one execution of ``op`` on ``dev`` (shared roofline model)."""
    moved = sum(value_bytes(ir, v.type) for v in list(op.operands) + list(op.results))
    flops = contraction_flops(ir, op)
    if flops is None:
        ins, outs = element_counts(ir, op)
        flops = costmodel.elementwise_flops(op.operation.name, max(ins + outs, default=0))
    return costmodel.roofline_seconds(flops, moved, dev)


def _number(attr) -> float | None:
    value = getattr(attr, "value", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def is_recomputable(op) -> bool:
    """Re-executing it cannot change the program: it has results and is pure
    (see :func:`is_pure`)."""
    return bool(op.results) and is_pure(op)


def is_pure(op) -> bool:
    """A pure dialect's op (minus communication, I/O, randomness and tokens),
    a known-pure compiler op, a sharding pass-through, or one of
    :data:`REGION_OPS` whose regions hold only pure ops and terminators."""
    name = op.operation.name
    if name == "stablehlo.custom_call":
        target = op.attributes["call_target_name"] if "call_target_name" in op.attributes else None
        return getattr(target, "value", None) in PASS_THROUGH_CALLS
    if name in EFFECTFUL_OPS:
        return False
    if len(op.regions) > 0:
        return name in REGION_OPS and all(
            inner.operation.name in REGION_TERMINATORS or is_pure(inner)
            for region in op.regions for block in region.blocks for inner in block.operations)
    return name in PURE_OPS or name in PASS_THROUGH_OPS or name.split(".", 1)[0] in PURE_DIALECTS


def memory_kind(op) -> str | None:
    """The memory kind a host-offload annotation puts its result in, else None."""
    if op.operation.name != "stablehlo.custom_call" or "mhlo.frontend_attributes" not in op.attributes:
        return None
    front = op.attributes["mhlo.frontend_attributes"]
    if PLACEMENT_KEY not in front:
        return None
    return getattr(front[PLACEMENT_KEY], "value", None)


def _scope_names(loc) -> list[str]:
    """Every name in a location tree (name, call-site and fused locations)."""
    out: list[str] = []
    stack = [loc]
    while stack:
        loc = stack.pop()
        name = getattr(loc, "name_str", None)
        if name is not None:
            out.append(name)
            stack.append(loc.child_loc)
        elif hasattr(loc, "callee"):
            stack.extend([loc.callee, loc.caller])
        elif hasattr(loc, "locations"):
            stack.extend(loc.locations)
    return out


def _ops(func):
    """Every op in ``func``'s body, nested regions included."""
    stack = list(func.regions[0].blocks[0].operations)
    while stack:
        op = stack.pop()
        yield op
        stack.extend(inner for region in op.regions for block in region.blocks for inner in block.operations)


def _lowered_by_jax(module, func) -> bool:
    """JAX marks its lowerings: ``mhlo.num_partitions`` on the module,
    ``jax.result_info`` on the results of ``main``."""
    if "mhlo.num_partitions" in module.operation.attributes:
        return True
    results = func.attributes["res_attrs"] if "res_attrs" in func.attributes else []
    return any("jax.result_info" in str(a) for a in results)


def located_backward(op) -> bool:
    """Whether JAX's name stack in the op's location is inside a ``transpose(...)``."""
    return any(_BACKWARD_SCOPE in n for n in _scope_names(op.location))


# -- the graph ------------------------------------------------------------------


def _build_graph(ir, path: Path, func, names: _Names, device: str, drop_unsafe_marks: bool):
    block = func.regions[0].blocks[0]
    dev = costmodel.device(device)
    nodes: list[Node] = []
    node_ops: list[Any] = []
    args: dict[int, Any] = {}
    producer: dict[Any, int] = {}
    taken: set[str] = set()

    def unique(name: str) -> str:
        if name in taken:
            name = f"{name}.{len(nodes)}"
        taken.add(name)
        return name

    for k, arg in enumerate(block.arguments):
        i = len(nodes)
        nodes.append(Node(id=i, name=unique(names.of_arg(arg) or f"arg{k}"), op="input", kind="input",
                          bytes=value_bytes(ir, arg.type)))
        node_ops.append(None)
        args[i] = arg
        producer[arg] = i

    edges: list[tuple[int, int]] = []
    measured: dict[int, float] = {}
    phases: dict[int, str] = {}  # from tessera.autodiff.phase
    located_backward_ops: set[int] = set()  # from JAX's name stacks
    through: dict[Any, int] = {}  # a barrier's result -> the barrier's node
    terminator = None
    for op in block.operations:
        name = op.operation.name
        if name == "func.return":
            terminator = op
            break
        i = len(nodes)
        attrs = op.attributes
        alias = name in ALIAS_OPS
        on_host = memory_kind(op) in HOST_KINDS
        size = 0 if alias or on_host else sum(value_bytes(ir, r.type) for r in op.results)
        if ATTR_BYTES in attrs:
            override = _number(attrs[ATTR_BYTES])
            if override is None or not 0 <= override < math.inf:
                _fail_at(path, op, f"{ATTR_BYTES} must be a finite number >= 0")
            size = int(override)
        for key in ATTR_COST:
            if key in attrs:
                cost = _number(attrs[key])
                if cost is None or not cost >= 0 or not math.isfinite(cost):
                    _fail_at(path, op, f"{key} must be a finite number >= 0")
                measured[i] = cost
                break
        if ATTR_PHASE in attrs:
            phases[i] = str(attrs[ATTR_PHASE].value) if isinstance(attrs[ATTR_PHASE], ir.StringAttr) else ""
        elif located_backward(op):
            located_backward_ops.add(i)
        recomputable = is_recomputable(op)
        node_name = unique(names.of_op(op) or f"{name}.{i}")
        marked = ATTR_RECOMPUTE in attrs
        if marked and not recomputable:
            msg = (f"{EFFECTFUL_MARK}: {name} at {_where(names, op, node_name)}: marked {ATTR_RECOMPUTE} but "
                   "not provably pure, so re-running it would change the program")
            if not drop_unsafe_marks:
                raise ImportFailure(msg + " (--drop-unsafe-marks ignores such marks)")
            warnings.warn(msg + "; mark ignored", stacklevel=4)
            marked = False
        nodes.append(Node(id=i, name=node_name, op=name, bytes=size,
                          cost=0.0 if alias else roofline_cost(ir, op, dev), recomputable=recomputable,
                          recompute=marked))
        node_ops.append(op)
        used = [v for v in used_values(op) if v in producer]
        # a value passed through a barrier lives as long as its readers through
        # it read it; the barrier itself is read too, so it keeps its place
        readers = [producer[v] for v in used] + [through[v] for v in used if v in through]
        for p in dict.fromkeys(readers):
            edges.append((p, i))
        for k, r in enumerate(op.results):
            if alias:
                producer[r] = producer.get(op.operands[k], i)
                through[r] = i
            else:
                producer[r] = i
    if terminator is None:
        _fail_at(path, func, "function body does not end in func.return")
    for v in terminator.operands:
        nodes[producer[v]].output = True
        if v in through:
            nodes[through[v]].output = True

    meta: dict[str, Any] = {"source": "mlir", "file": str(path), "function": _sym_name(func)}
    if measured:
        # Measured figures are in ns; modelled ones are converted so one unit holds.
        for v in nodes:
            if not v.is_input:
                v.cost = measured.get(v.id, v.cost * 1e9)
        meta["cost_unit"] = "ns"
    else:
        meta.update(cost_unit="s", device=device)
    if phases or located_backward_ops:
        for v in nodes:
            if not v.is_input:
                backward = phases[v.id] == "backward" if v.id in phases else v.id in located_backward_ops
                v.phase = "backward" if backward else "forward"
    budget = _function_budget(path, func)
    if budget is not None:
        meta["budget_bytes"] = budget
    fname = _sym_name(func)
    gname = path.stem if fname == "main" else f"{path.stem}.{fname}"
    return Graph(gname, nodes, edges, None, meta, str(path)), node_ops, args


def _function_budget(path: Path, func) -> int | None:
    """The pass's budget from the function's attributes: bytes, else MiB x 2^20."""
    for key, scale in ((ATTR_BUDGET_BYTES, 1), (ATTR_BUDGET_MB, 2**20)):
        if key in func.attributes:
            value = _number(func.attributes[key])
            if value is None or not value >= 0 or not math.isfinite(value):
                _fail_at(path, func, f"{key} must be a finite number >= 0")
            return int(value * scale)
    return None
