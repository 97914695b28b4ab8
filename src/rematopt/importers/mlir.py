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
* only ops in :data:`PURE_OPS` (and the pure dialects) without regions are
  recomputable: an op with a region or an unknown op may have effects.

The parser drops SSA names, so names are recovered from the source text at
each op's location (``%square = ...`` -> ``square``); ops the exporter renamed
carry a name location instead. :func:`load_function` is shared with the
exporter, which needs the parsed IR next to the graph.
"""

from __future__ import annotations

import math
import re
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
# Side-effecting ops of those dialects: communication, I/O, randomness, tokens.
EFFECTFUL_OPS = frozenset({
    "stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed",
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all", "stablehlo.reduce_scatter",
    "stablehlo.collective_permute", "stablehlo.collective_broadcast", "stablehlo.custom_call",
    "stablehlo.rng", "stablehlo.rng_bit_generator", "stablehlo.after_all", "stablehlo.create_token",
    "stablehlo.optimization_barrier", "stablehlo.partition_id", "stablehlo.replica_id",
})
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


def import_mlir(path: str | Path, function: str | None = None) -> Graph:
    """Read ``function`` (default: ``main``, else the only public function)
    of an MLIR file as a :class:`Graph`.

    Raises ImportFailure ``"FILE:LINE: reason"`` for a syntax or verifier error,
    an unknown function or an unsupported construct.
    """
    return load_function(path, function).graph


def load_function(path: str | Path, function: str | None = None, device: str | None = None) -> MlirFunction:
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
        _inline_calls(ir, path, module, func.regions[0].blocks[0], names, stack=[_sym_name(func)])
        graph, node_ops, args = _build_graph(ir, path, func, names, device or costmodel.DEFAULT_DEVICE)
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

    def _file_pos(self, loc) -> tuple[int, int] | None:
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
        pos = self._file_pos(loc)
        if pos is None or pos[0] > len(self.lines):
            return None
        m = _RESULTS_BEFORE_OP.search(self.lines[pos[0] - 1][: pos[1] - 1])
        return m.group(1) if m and not m.group(1).isdigit() else None

    def of_arg(self, arg) -> str | None:
        name = getattr(arg.location, "name_str", None)
        if name is not None:
            return name
        pos = self._file_pos(arg.location)
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
            copy.location = ir.Location.name(f"{prefix}.{names.of_op(inner) or f'{inner.operation.name}.{j}'}")
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
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                values.extend(used_values(inner))
    return values


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


def roofline_cost(ir, op, dev: costmodel.Device) -> float:
    """Seconds for one execution of ``op`` on ``dev`` (shared roofline model)."""
    name = op.operation.name
    in_types = [v.type for v in op.operands]
    out_types = [r.type for r in op.results]
    moved = sum(value_bytes(ir, t) for t in in_types + out_types)
    out_elems = sum(_elements(ir, t) or 0 for t in out_types)
    lhs = _shape(ir, in_types[0]) if in_types else []
    if name == "stablehlo.dot_general" and lhs:
        from jaxlib.mlir.dialects import stablehlo as hlo

        dims = hlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"]).lhs_contracting_dimensions
        flops = costmodel.matmul_flops(out_elems, math.prod(lhs[d] for d in dims))
    elif name in MATMUL_OPS and lhs:
        flops = costmodel.matmul_flops(out_elems, lhs[-1])
    elif name == "stablehlo.convolution" and len(in_types) > 1 and _shape(ir, in_types[1]):
        from jaxlib.mlir.dialects import stablehlo as hlo

        kernel = _shape(ir, in_types[1])
        out_dim = hlo.ConvDimensionNumbers(op.attributes["dimension_numbers"]).kernel_output_feature_dimension
        flops = costmodel.conv_flops(out_elems, math.prod(kernel), kernel[out_dim])
    else:
        elems = max([_elements(ir, t) or 0 for t in in_types + out_types], default=0)
        flops = costmodel.elementwise_flops(name, elems)
    return costmodel.roofline_seconds(flops, moved, dev)


def _number(attr) -> float | None:
    value = getattr(attr, "value", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def is_recomputable(op) -> bool:
    """Pure and region-free: re-executing it cannot change the program's effects."""
    name = op.operation.name
    if len(op.regions) > 0 or name in EFFECTFUL_OPS or not op.results:
        return False
    return name in PURE_OPS or name.split(".", 1)[0] in PURE_DIALECTS


# -- the graph ------------------------------------------------------------------


def _build_graph(ir, path: Path, func, names: _Names, device: str):
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
    phases: dict[int, str] = {}
    terminator = None
    for op in block.operations:
        name = op.operation.name
        if name == "func.return":
            terminator = op
            break
        i = len(nodes)
        attrs = op.attributes
        size = sum(value_bytes(ir, r.type) for r in op.results)
        if ATTR_BYTES in attrs:
            override = _number(attrs[ATTR_BYTES])
            if override is None or override < 0:
                _fail_at(path, op, f"{ATTR_BYTES} must be a number >= 0")
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
        recomputable = is_recomputable(op)
        nodes.append(Node(id=i, name=unique(names.of_op(op) or f"{name}.{i}"), op=name, bytes=size,
                          cost=roofline_cost(ir, op, dev), recomputable=recomputable,
                          recompute=recomputable and ATTR_RECOMPUTE in attrs))
        node_ops.append(op)
        for p in dict.fromkeys(producer[v] for v in used_values(op) if v in producer):
            edges.append((p, i))
        for r in op.results:
            producer[r] = i
    if terminator is None:
        _fail_at(path, func, "function body does not end in func.return")
    for v in terminator.operands:
        nodes[producer[v]].output = True

    meta: dict[str, Any] = {"source": "mlir", "file": str(path), "function": _sym_name(func)}
    if measured:
        # Measured figures are in ns; modelled ones are converted so one unit holds.
        for v in nodes:
            if not v.is_input:
                v.cost = measured.get(v.id, v.cost * 1e9)
        meta["cost_unit"] = "ns"
    else:
        meta.update(cost_unit="s", device=device)
    if phases:
        for v in nodes:
            if not v.is_input:
                v.phase = "backward" if phases.get(v.id) == "backward" else "forward"
    fattrs = func.attributes
    if ATTR_BUDGET_MB in fattrs:
        mb = _number(fattrs[ATTR_BUDGET_MB])
        if mb is None or not mb >= 0 or not math.isfinite(mb):
            _fail_at(path, func, f"{ATTR_BUDGET_MB} must be a finite number >= 0")
        meta["budget_bytes"] = int(mb * 2**20)
    fname = _sym_name(func)
    gname = path.stem if fname == "main" else f"{path.stem}.{fname}"
    return Graph(gname, nodes, edges, None, meta, str(path)), node_ops, args
