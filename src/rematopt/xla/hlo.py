"""Read XLA's optimized, scheduled HLO text (``compiled.as_text()``) into plain records.

A scheduled module prints every computation's instructions in schedule order, so the entry
computation's order *is* XLA's schedule. The parser keeps what rematopt needs: shapes (tuple-aware),
operands, called computations, fusion kind, custom-call target, aliasing, and the metadata that maps an
instruction back to the program (``op_name``; source file and line, printed inline or through the
module's ``StackFrames`` tables). Everything else on a line (backend configs, layouts' tiling) is kept
only as raw attribute text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import RematoptError

# Bytes per element of XLA's primitive types (xla_data.proto). Sub-byte types round up per array.
DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16,
    "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64,
    "c128": 128, "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8,
    "f8e4m3b11fnuz": 8, "f8e3m4": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4, "token": 0, "opaque": 0,
}
POINTER_BYTES = 8  # a tuple's index table: one pointer per element, as XLA sizes tuple buffers


class HloError(RematoptError):
    """HLO text that does not parse as a module."""


@dataclass(frozen=True)
class Leaf:
    """One array of a (possibly tuple) shape."""

    dtype: str
    dims: tuple[int, ...]
    # minor-to-major order as printed (``{1,0}``; "" where none is): XLA shares a buffer between two
    # arrays only where dtype, dims and layout all agree; not part of a leaf's equality
    layout: str = field(default="", compare=False)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def bytes(self) -> int:
        return (self.elements * DTYPE_BITS.get(self.dtype, 32) + 7) // 8


@dataclass(frozen=True)
class Shape:
    """An array shape (``leaves`` of one, ``tuple_arity`` None) or a tuple, flattened in order.

    ``index`` maps each leaf to its shape index (``()`` for an array, ``(i, ...)`` inside tuples);
    ``tuple_tables`` counts the tuples (each owns a pointer table) in the nest.
    """

    leaves: tuple[Leaf, ...]
    index: tuple[tuple[int, ...], ...]
    tuple_arity: int | None = None
    tuple_tables: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        """Bytes of the arrays, without tuple index tables."""
        return sum(leaf.bytes for leaf in self.leaves)

    @property
    def is_tuple(self) -> bool:
        return self.tuple_arity is not None

    def leaf_at(self, index: tuple[int, ...]) -> Leaf | None:
        for i, leaf in zip(self.index, self.leaves):
            if i == index:
                return leaf
        return None

    def sub(self, prefix: tuple[int, ...]) -> list[tuple[tuple[int, ...], Leaf]]:
        """The leaves under ``prefix`` with their full shape indices."""
        n = len(prefix)
        return [(i, leaf) for i, leaf in zip(self.index, self.leaves) if i[:n] == prefix]


@dataclass
class Metadata:
    op_name: str = ""
    source_file: str = ""
    source_line: int = 0
    stack: tuple[tuple[str, int, str], ...] = ()  # (file, line, function), innermost first


@dataclass
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str]
    attrs: dict[str, str]
    metadata: Metadata
    computation: str
    is_root: bool = False
    parameter_number: int | None = None
    called: list[str] = field(default_factory=list)  # fused computation, to_apply, body/condition, branches
    fusion_kind: str = ""  # kLoop, kInput, kOutput, kCustom
    custom_call_target: str = ""
    # output shape index -> (operand number, operand shape index), from output_to_operand_aliasing
    output_operand_aliasing: dict[tuple[int, ...], tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    operand_shapes: list[Shape] = field(default_factory=list)  # resolved within the computation

    @property
    def bytes(self) -> int:
        return self.shape.bytes

    def callee(self, attribute: str) -> str:
        """The computation one of its attributes names (a while loop's ``condition`` or ``body``); "" if none."""
        return self.attrs.get(attribute, "").strip().lstrip("%")

    def backend_config(self) -> dict:
        """The backend config as JSON, or ``{}`` where there is none or it is not JSON."""
        raw = self.attrs.get("backend_config", "")
        if raw.startswith("{"):
            try:
                return json.loads(raw)
            except ValueError:
                return {}
        return {}


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False

    def __post_init__(self) -> None:
        self.by_name = {i.name: i for i in self.instructions}
        for i in self.instructions:
            i.operand_shapes = [self.by_name[o].shape for o in i.operands if o in self.by_name]

    @cached_property
    def root(self) -> Instruction:
        for i in self.instructions:
            if i.is_root:
                return i
        return self.instructions[-1]

    @cached_property
    def post_order(self) -> list[str]:
        """Instruction names in a post order from the root (then from each other instruction, in
        order): XLA's tie-break between buffers of one size."""
        by, order, seen = self.by_name, {}, set()
        for start in [self.root] + [i for i in self.instructions if i is not self.root]:
            stack = [(start, False)]
            while stack:
                inst, done = stack.pop()
                if done:
                    order.setdefault(inst.name, len(order))
                    continue
                if inst.name in seen:
                    continue
                seen.add(inst.name)
                stack.append((inst, True))
                stack.extend((by[o], False) for o in reversed(inst.operands) if o in by and o not in seen)
        return list(order)

    @property
    def parameters(self) -> list[Instruction]:
        return sorted((i for i in self.instructions if i.opcode == "parameter"), key=lambda i: i.parameter_number)


@dataclass
class HloModule:
    name: str
    computations: dict[str, Computation]
    entry_name: str
    is_scheduled: bool
    # output shape index -> (parameter number, parameter shape index, kind), from input_output_alias
    input_output_alias: dict[tuple[int, ...], tuple[int, tuple[int, ...], str]] = field(default_factory=dict)

    @property
    def entry(self) -> Computation:
        return self.computations[self.entry_name]

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        """Every instruction of every computation by its name (names are unique in an HLO module)."""
        return {i.name: i for c in self.computations.values() for i in c.instructions}

    @property
    def schedule(self) -> list[Instruction]:
        """The entry computation's instructions in XLA's order (the printed order of a scheduled module)."""
        return self.entry.instructions

    def fused_instructions(self, instruction: Instruction) -> list[Instruction]:
        """Every instruction inside the computations ``instruction`` calls, recursively."""
        out: list[Instruction] = []
        seen: set[str] = set()
        todo = list(instruction.called)
        while todo:
            name = todo.pop(0)
            if name in seen or name not in self.computations:
                continue
            seen.add(name)
            for inner in self.computations[name].instructions:
                out.append(inner)
                todo.extend(inner.called)
        return out


# --- shapes ---------------------------------------------------------------------------------------

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")


def parse_shape(text: str) -> Shape:
    """``f32[8,16]{1,0}``, ``(f32[], (s32[2], pred[]))``, ``token[]``: leaves in order."""
    leaves: list[Leaf] = []
    index: list[tuple[int, ...]] = []
    tables: list[int] = []
    pos = 0
    text = text.strip()

    def parse(prefix: tuple[int, ...]) -> int | None:
        nonlocal pos
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] == "(":
            pos += 1
            arity = 0
            while True:
                while pos < len(text) and text[pos] in " ,":
                    pos += 1
                if text.startswith("/*", pos):  # /*index=5*/
                    pos = text.index("*/", pos) + 2
                    continue
                if pos >= len(text):
                    raise HloError(f"unterminated tuple shape: {text[:80]}")
                if text[pos] == ")":
                    pos += 1
                    tables.append(arity)
                    return arity
                parse(prefix + (arity,))
                arity += 1
        m = _ARRAY.match(text, pos)
        if not m:
            raise HloError(f"bad shape at {text[pos:pos + 40]!r}")
        pos = m.end()
        dims = tuple(int(d.lstrip("<=")) for d in m.group(2).split(",") if d.strip()) if m.group(2) else ()
        leaves.append(Leaf(m.group(1), dims, m.group(3) or ""))
        index.append(prefix)
        return None

    arity = parse(())
    return Shape(tuple(leaves), tuple(index), arity, tuple(tables))


def _split_shape(text: str) -> tuple[str, str]:
    """Split ``SHAPE rest`` where SHAPE may be a parenthesized tuple."""
    if text.startswith("("):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return text[: i + 1], text[i + 1:].lstrip()
        raise HloError(f"unbalanced tuple shape: {text[:80]}")
    m = _ARRAY.match(text)
    if not m:
        raise HloError(f"bad shape at {text[:40]!r}")
    return text[: m.end()], text[m.end():].lstrip()


# --- attributes -----------------------------------------------------------------------------------

def _balanced_end(text: str, start: int) -> int:
    """Index just past the bracketed/quoted group that opens at ``text[start]``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack: list[str] = []
    i = start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    raise HloError(f"unbalanced brackets: {text[start:start + 80]}")


def _attributes(text: str) -> dict[str, str]:
    """``, key=value, key={...}, key="..."`` at top level into a dict of raw value text."""
    out: dict[str, str] = {}
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in ", ":
            i += 1
        m = re.compile(r"([\w.\-]+)=").match(text, i)
        if not m:
            break
        key = m.group(1)
        i = m.end()
        if i < len(text) and text[i] in "{([\"":
            end = _balanced_end(text, i) if text[i] != '"' else _quote_end(text, i)
        else:
            end = i
            while end < len(text) and text[end] != ",":
                end += 1
        out[key] = text[i:end]
        i = end
    return out


def _quote_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


_META_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')


def _unquote(value: str) -> str:
    if value.startswith('"') and value.endswith('"'):
        return value[1:-1].replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")
    return value


def _aliasing(raw: str) -> dict[tuple[int, ...], tuple[int, tuple[int, ...]]]:
    """``{{0}: (1, {}), {}: (0, {2})}`` -> {output index: (operand, operand index)}."""
    out = {}
    for m in re.finditer(r"\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}", raw):
        out[_index(m.group(1))] = (int(m.group(2)), _index(m.group(3)))
    return out


def _index(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


# --- module ---------------------------------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*)?\{\s*$")
_CALLS = ("calls", "to_apply", "body", "condition", "branch_computations", "true_computation",
          "false_computation", "called_computations")


def parse_hlo(text: str, source: str | None = None) -> HloModule:
    """Parse ``compiled.as_text()`` (or a file's text). Raises :class:`HloError` naming ``source``."""
    try:
        return _parse(text)
    except HloError as e:
        raise HloError(f"{source}: {e}" if source else str(e)) from None


def _parse(text: str) -> HloModule:
    lines = text.splitlines()
    header = next((ln for ln in lines if ln.startswith("HloModule ")), None)
    if header is None:
        raise HloError("not an HLO module (no 'HloModule' line)")
    module_name = header.split()[1].rstrip(",")
    head_attrs = _attributes(header[len("HloModule ") + len(module_name) + 1:].lstrip(", "))
    io_alias = {}
    for m in re.finditer(r"\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}(?:,\s*([\w-]+))?\)",
                         head_attrs.get("input_output_alias", "")):
        io_alias[_index(m.group(1))] = (int(m.group(2)), _index(m.group(3)), m.group(4) or "may-alias")
    frames = _stack_frames(lines)

    computations: dict[str, Computation] = {}
    entry_name = None
    current: list[Instruction] | None = None
    cname = ""
    is_entry = False
    for number, ln in enumerate(lines, 1):
        if current is None:
            m = _COMPUTATION.match(ln)
            if m and not ln.startswith("HloModule"):
                cname, is_entry, current = m.group(2), bool(m.group(1)), []
            continue
        if ln.strip() == "}":
            if not current:
                raise HloError(f"computation {cname} has no instructions")
            computations[cname] = Computation(cname, current, is_entry)
            if is_entry:
                entry_name = cname
            current = None
            continue
        m = _INSTRUCTION.match(ln)
        if m:
            current.append(_instruction(m, cname, frames))
        elif ln.strip():
            raise HloError(f"line {number} is not an HLO instruction: {ln.strip()[:60]!r}")
    if current is not None:
        raise HloError(f"computation {cname} is not closed")
    if entry_name is None:
        raise HloError("no ENTRY computation")
    _check_references(computations)
    return HloModule(module_name, computations, entry_name, head_attrs.get("is_scheduled") == "true", io_alias)


def _check_references(computations: dict[str, Computation]) -> None:
    """Every operand names an instruction of its computation and every called computation is
    the module's (XLA prints no module that breaks either)."""
    for comp in computations.values():
        for inst in comp.instructions:
            for operand in inst.operands:
                if operand not in comp.by_name:
                    raise HloError(f"instruction {inst.name} reads %{operand}, which computation {comp.name} "
                                   "does not define")
            for name in inst.called:
                if name not in computations:
                    raise HloError(f"instruction {inst.name} calls %{name}, which the module does not define")


def _instruction(m: re.Match, computation: str, frames: dict[int, tuple]) -> Instruction:
    name, rest = m.group(2), m.group(3)
    shape_text, rest = _split_shape(rest)
    om = re.match(r"([\w\-]+)\(", rest)
    if not om:
        raise HloError(f"instruction {name}: no opcode in {rest[:60]!r}")
    opcode = om.group(1)
    close = _balanced_end(rest, om.end() - 1)
    operand_text = rest[om.end(): close - 1]
    attrs = _attributes(rest[close:])
    operands = re.findall(r"%([\w.\-]+)", operand_text)
    called: list[str] = []
    for key in _CALLS:
        if key in attrs:
            called.extend(re.findall(r"%?([\w.\-]+)", attrs[key].strip("{}")))
    meta = Metadata()
    if "metadata" in attrs:
        fields = {k: _unquote(v) for k, v in _META_FIELD.findall(attrs["metadata"].strip("{}"))}
        meta.op_name = fields.get("op_name", "")
        meta.source_file = fields.get("source_file", "")
        meta.source_line = int(fields.get("source_line", "0") or 0)
        if "stack_frame_id" in fields:
            meta.stack = _unwind(int(fields["stack_frame_id"]), frames)
            if meta.stack and not meta.source_file:
                meta.source_file, meta.source_line = meta.stack[0][0], meta.stack[0][1]
    parameter_number = int(operand_text) if opcode == "parameter" and operand_text.strip().isdigit() else None
    return Instruction(
        name=name, opcode=opcode, shape=parse_shape(shape_text), operands=operands, attrs=attrs,
        metadata=meta, computation=computation, is_root=bool(m.group(1)), parameter_number=parameter_number,
        called=called, fusion_kind=attrs.get("kind", ""),
        custom_call_target=_unquote(attrs.get("custom_call_target", "")),
        output_operand_aliasing=_aliasing(attrs.get("output_to_operand_aliasing", "")),
    )


def _stack_frames(lines: list[str]) -> dict[int, tuple]:
    """The module's FileNames / FunctionNames / FileLocations / StackFrames tables, as
    frame id -> (file, line, function, parent id)."""
    tables: dict[str, dict[int, str]] = {}
    section = None
    for ln in lines:
        if ln in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = ln
            tables[section] = {}
            continue
        if section is None:
            continue
        if not ln.strip() or ln.startswith("%") or ln.startswith("ENTRY"):
            section = None
            continue
        key, _, value = ln.partition(" ")
        if key.isdigit():
            tables[section][int(key)] = value
    files = {k: _unquote(v) for k, v in tables.get("FileNames", {}).items()}
    funcs = {k: _unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locs = {}
    for k, v in tables.get("FileLocations", {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        locs[k] = (files.get(int(f.get("file_name_id", 0)), ""), int(f.get("line", 0)),
                   funcs.get(int(f.get("function_name_id", 0)), ""))
    frames = {}
    for k, v in tables.get("StackFrames", {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", v))
        # XLA prints the parent as (1-based id + 1); 1 means no parent, as the self-loops on root frames show.
        frames[k] = locs.get(int(f.get("file_location_id", 0)), ("", 0, "")) + (int(f.get("parent_frame_id", 1)) - 1,)
    return frames


def _unwind(frame_id: int, frames: dict[int, tuple]) -> tuple[tuple[str, int, str], ...]:
    out = []
    seen = set()
    while frame_id in frames and frame_id not in seen:
        seen.add(frame_id)
        file, line, func, parent = frames[frame_id]
        out.append((file, line, func))
        frame_id = parent
    return tuple(out)


def read_hlo(path) -> HloModule:
    """Parse an HLO text file; an unreadable or malformed file raises :class:`HloError` naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise HloError(f"{path}: cannot read HLO text ({getattr(e, 'strerror', None) or e})") from None
    return parse_hlo(text, str(path))
