"""A small, dependency-free parser for HLO module text.

It reads the text XLA prints for an HloModule, in both forms seen in practice:

- the short form xprof returns (``get_hlo_text``): ``name = f32[8]{0} add(a, b)``;
- the long form of ``Compiled.as_text()`` or xprof's ``long_txt``: ``%name = ...``,
  computation signatures, ``metadata={...}`` and a ``StackFrames`` table.

The parser is lenient: lines it does not understand are skipped, so odd or truncated
text yields a partial module rather than an exception. :class:`HloParseError` is
raised only when the text contains no computation at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mldiag.errors import MldiagError

# Bits per element of each HLO primitive type; sub-byte types pack.
_DTYPE_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4,
    "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f6e2m3fn": 6, "f6e3m2fn": 6, "f8e8m0fnu": 8,
    "token": 0, "opaque": 0,
}

# Computation kinds, from how the computation is called.
ENTRY = "entry"
FUSION = "fusion"
REGION = "region"  # to_apply/select/scatter regions of reduce, sort, all-reduce, map, ...
CONTROL = "control"  # bodies of while/conditional/call: their instructions execute as ops
OTHER = "other"  # referenced some other way (async wrappers, custom-call) or not at all

_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?(?P<name>[^\s(]+)\s*(\(.*\)\s*->\s*.+?)?\s*\{\s*$")
_SHAPE = re.compile(r"^(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\](?P<layout>\{[^}]*\})?$")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_META_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')
_TABLE_ENTRY = re.compile(r"^\s*(\d+)\s+(.*?)\s*$")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_OPEN = "([{"
_CLOSE = ")]}"


class HloParseError(MldiagError, ValueError):
    """The text is not an HLO module this parser can read.

    Permanent: the same text never parses; its passes skip that module."""


@dataclass(frozen=True)
class Shape:
    """One HLO shape: an array shape, or a tuple of shapes (``dtype == "tuple"``).

    ``layout`` is the minor-to-major dimension order, or None when the text has no
    layout. ``tiling`` is whatever follows ``:`` in the layout (TPU tiles such as
    ``T(8,128)``) without the memory space, which is in ``memory_space``.
    """

    text: str
    dtype: str
    dims: tuple[int, ...] = ()
    layout: tuple[int, ...] | None = None
    tiling: str = ""
    memory_space: int | None = None
    elements: tuple[Shape, ...] = ()

    @property
    def is_tuple(self) -> bool:
        """Whether this is a tuple shape."""
        return self.dtype == "tuple"

    @property
    def element_count(self) -> int:
        """Number of array elements (summed over tuple elements)."""
        if self.is_tuple:
            return sum(e.element_count for e in self.elements)
        return math.prod(self.dims)

    @property
    def byte_size(self) -> int:
        """Bytes of the array data (summed over tuple elements); 0 for unknown types."""
        if self.is_tuple:
            return sum(e.byte_size for e in self.elements)
        return (self.element_count * _DTYPE_BITS.get(self.dtype, 0) + 7) // 8

    @property
    def layout_text(self) -> str:
        """The layout as HLO prints it without the memory space, e.g. ``{1,0}``."""
        if self.layout is None:
            return ""
        inner = ",".join(str(d) for d in self.layout)
        return "{" + inner + (":" + self.tiling if self.tiling else "") + "}"

    @property
    def physical_layout(self) -> tuple[tuple[int, ...] | None, str]:
        """What decides the physical element order: minor-to-major and tiling."""
        return self.layout, self.tiling


@dataclass(frozen=True)
class Metadata:
    """The parts of an instruction's ``metadata={...}`` that locate it in user code."""

    op_name: str = ""
    source_file: str = ""
    source_line: int | None = None


@dataclass(frozen=True, eq=False)
class Instruction:
    """One HLO instruction. ``index`` is its position in the module text."""

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    computation: str
    index: int
    is_root: bool = False
    attributes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    metadata: Metadata = Metadata()
    literal: str = ""  # the text inside the parentheses of constant(...) and parameter(...)

    @property
    def calls(self) -> str | None:
        """The computation named by ``calls=`` (fusion bodies), if any."""
        return _computation_ref(self.attributes.get("calls"))

    @property
    def kind(self) -> str | None:
        """The fusion kind (``kLoop``, ``kInput``, ``kOutput``, ``kCustom``), if any."""
        return self.attributes.get("kind")

    @property
    def to_apply(self) -> str | None:
        """The computation named by ``to_apply=``, if any."""
        return _computation_ref(self.attributes.get("to_apply"))

    @property
    def dimensions(self) -> tuple[int, ...] | None:
        """The ``dimensions={...}`` attribute (transpose permutation, reduce dims)."""
        return _int_list(self.attributes.get("dimensions"))

    @property
    def parameter_number(self) -> int | None:
        """For ``parameter(k)``, k; otherwise None."""
        if self.opcode != "parameter":
            return None
        try:
            return int(self.literal)
        except ValueError:
            return None

    @property
    def tuple_index(self) -> int | None:
        """For ``get-tuple-element``, the ``index=`` attribute; otherwise None."""
        try:
            return int(self.attributes.get("index", ""))
        except ValueError:
            return None


@dataclass
class Computation:
    """One HLO computation: its instructions in text order and how it is called."""

    name: str
    is_entry: bool = False
    kind: str = OTHER
    instructions: list[Instruction] = field(default_factory=list)
    _by_name: dict[str, Instruction] = field(default_factory=dict, repr=False)
    _users: dict[str, list[Instruction]] = field(default_factory=dict, repr=False)

    def add(self, instruction: Instruction) -> None:
        """Append an instruction (used by the parser)."""
        self.instructions.append(instruction)
        self._by_name[instruction.name] = instruction
        for operand in instruction.operands:
            self._users.setdefault(operand, []).append(instruction)

    def get(self, name: str) -> Instruction | None:
        """The instruction called ``name`` in this computation, if any."""
        return self._by_name.get(name)

    def users(self, name: str) -> list[Instruction]:
        """Instructions of this computation that take ``name`` as an operand."""
        return list(self._users.get(name, ()))

    def operand_instructions(self, instruction: Instruction) -> list[Instruction]:
        """The operands of ``instruction`` that are instructions of this computation."""
        found = (self._by_name.get(o) for o in instruction.operands)
        return [i for i in found if i is not None]

    @property
    def root(self) -> Instruction | None:
        """The ROOT instruction (the last one when none is marked)."""
        for instruction in self.instructions:
            if instruction.is_root:
                return instruction
        return self.instructions[-1] if self.instructions else None

    def parameter(self, number: int) -> Instruction | None:
        """The ``parameter(number)`` instruction, if any."""
        for instruction in self.instructions:
            if instruction.parameter_number == number:
                return instruction
        return None


@dataclass
class HloModule:
    """A parsed HLO module."""

    name: str
    computations: dict[str, Computation] = field(default_factory=dict)
    # Callers of each computation: (computation of the caller, calling instruction).
    callers: dict[str, list[tuple[Computation, Instruction]]] = field(default_factory=dict)

    @property
    def entry(self) -> Computation | None:
        """The ENTRY computation (the last computation when none is marked)."""
        for computation in self.computations.values():
            if computation.is_entry:
                return computation
        return next(reversed(self.computations.values()), None)

    def executed_computations(self) -> list[Computation]:
        """Computations whose instructions run as separate ops: the entry and the bodies of
        while/conditional/call. Their instructions are the names on the timeline."""
        return [c for c in self.computations.values() if c.kind in (ENTRY, CONTROL)]

    def fusion_body(self, instruction: Instruction) -> Computation | None:
        """The body computation of a fusion instruction."""
        if instruction.opcode != "fusion" or instruction.calls is None:
            return None
        return self.computations.get(instruction.calls)

    def fusion_operand(
        self, body: Computation, parameter: Instruction
    ) -> tuple[Computation, Instruction] | None:
        """The operand that feeds ``parameter`` of fusion body ``body``: the fusion's
        computation and the operand instruction (first caller when there are several)."""
        number = parameter.parameter_number
        if number is None:
            return None
        for caller_computation, caller in self.callers.get(body.name, ()):
            if caller.opcode != "fusion" or number >= len(caller.operands):
                continue
            operand = caller_computation.get(caller.operands[number])
            if operand is not None:
                return caller_computation, operand
        return None

    def fusion_callers(self, body: Computation) -> list[tuple[Computation, Instruction]]:
        """The fusion instructions that call ``body``."""
        return [(c, i) for c, i in self.callers.get(body.name, ()) if i.opcode == "fusion"]

    def instructions(self) -> Iterator[Instruction]:
        """All instructions, in text order."""
        for computation in self.computations.values():
            yield from computation.instructions


def parse_shape(text: str) -> Shape:
    """Parse one shape, e.g. ``f32[512,1024]{0,1}`` or ``(f32[2]{0}, s32[])``.

    Unknown forms give ``Shape(text, dtype="unknown")`` rather than an exception.
    """
    text = _COMMENT.sub("", text).strip()
    if text.startswith("("):
        end = _scan_balanced(text, 0)
        inner = text[1 : end - 1] if end > 0 else text[1:]
        elements = tuple(parse_shape(p) for p in _split_top_level(inner) if p.strip())
        return Shape(text=text, dtype="tuple", elements=elements)
    match = _SHAPE.match(text)
    if match is None:
        return Shape(text=text, dtype="unknown")
    dims: list[int] = []
    for raw in match["dims"].split(","):
        raw = raw.strip().removeprefix("<=")
        if not raw:
            continue
        if not raw.isdigit():
            return Shape(text=text, dtype="unknown")
        dims.append(int(raw))
    layout: tuple[int, ...] | None = None
    tiling = ""
    memory_space: int | None = None
    if match["layout"]:
        body = match["layout"][1:-1]
        order, _, suffix = body.partition(":")
        layout = _int_list("{" + order + "}")
        if layout is None:
            return Shape(text=text, dtype="unknown")
        space = _MEMORY_SPACE.search(suffix)
        if space is not None:
            memory_space = int(space.group(1))
        tiling = _MEMORY_SPACE.sub("", suffix)
    return Shape(
        text=text,
        dtype=match["dtype"],
        dims=tuple(dims),
        layout=layout,
        tiling=tiling,
        memory_space=memory_space,
    )


def parse_module(text: str) -> HloModule:
    """Parse HLO module text into computations and instructions.

    Raises HloParseError when the text holds no computation.
    """
    module = HloModule(name="")
    tables: dict[str, dict[int, str]] = {t: {} for t in _TABLES}
    table: dict[int, str] | None = None
    current: Computation | None = None
    index = 0
    pending: list[tuple[Computation, str]] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        if current is None:
            if line.startswith("HloModule "):
                module.name = line[len("HloModule ") :].split(",", 1)[0].strip()
                continue
            if line in _TABLES:
                table = tables[line]
                continue
            header = _HEADER.match(_COMMENT.sub("", line))
            if header is not None:
                table = None
                name = header["name"].lstrip("%")
                current = Computation(name=name, is_entry=line.startswith("ENTRY"))
                module.computations[name] = current
                continue
            entry = _TABLE_ENTRY.match(line) if table is not None else None
            if entry is not None and table is not None:
                table[int(entry.group(1))] = entry.group(2)
            continue
        if line == "}":
            current = None
            continue
        pending.append((current, line))
    if not module.computations:
        raise HloParseError("no HLO computation found in the text")
    frames = _StackFrames(tables)
    for computation, line in pending:
        instruction = _parse_instruction(line, computation.name, index, frames)
        if instruction is not None:
            computation.add(instruction)
            index += 1
    _assign_kinds(module)
    return module


def _parse_instruction(
    line: str, computation: str, index: int, frames: _StackFrames
) -> Instruction | None:
    line = _strip_comments(line)
    is_root = line.startswith("ROOT ")
    if is_root:
        line = line[len("ROOT ") :].lstrip()
    name, sep, rest = line.partition(" = ")
    if not sep or not name or " " in name.strip():
        return None
    rest = rest.lstrip()
    # The shape: a balanced tuple, or one token (layouts hold no spaces).
    if rest.startswith("("):
        end = _scan_balanced(rest, 0)
        if end < 0:
            return None
    else:
        end = _scan_token(rest)
    shape_text, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren <= 0:
        return None
    opcode = rest[:paren].strip()
    if not re.fullmatch(r"[a-z][a-z0-9\-_.]*", opcode):
        return None
    close = _scan_balanced(rest, paren)
    if close < 0:
        return None
    inside = rest[paren + 1 : close - 1]
    literal = ""
    operands: tuple[str, ...] = ()
    if opcode in ("constant", "parameter", "iota"):
        literal = inside.strip()
    else:
        operands = tuple(
            _operand_name(p) for p in _split_top_level(inside) if _operand_name(p)
        )
    attributes: dict[str, str] = {}
    for part in _split_top_level(rest[close:]):
        key, eq, value = part.strip().partition("=")
        if eq and key:
            attributes[key.strip()] = value.strip()
    return Instruction(
        name=name.strip().lstrip("%"),
        opcode=opcode,
        shape=parse_shape(shape_text),
        operands=operands,
        computation=computation,
        index=index,
        is_root=is_root,
        attributes=MappingProxyType(attributes),
        metadata=_parse_metadata(attributes.get("metadata", ""), frames),
        literal=literal,
    )


# Long-form text names source lines through tables: stack frame -> file location -> file.
class _StackFrames:
    def __init__(self, tables: Mapping[str, Mapping[int, str]]) -> None:
        self._files = {k: _unquote(v) for k, v in tables["FileNames"].items()}
        self._locations = {k: _fields(v) for k, v in tables["FileLocations"].items()}
        self._frames = {k: _fields(v) for k, v in tables["StackFrames"].items()}

    def location(self, frame_id: int) -> tuple[str, int | None]:
        frame = self._frames.get(frame_id, {})
        location = self._locations.get(_to_int(frame.get("file_location_id")) or -1, {})
        file_name = self._files.get(_to_int(location.get("file_name_id")) or -1, "")
        return file_name, _to_int(location.get("line"))


def _parse_metadata(text: str, frames: _StackFrames) -> Metadata:
    if not text.startswith("{"):
        return Metadata()
    fields = {k: _unquote(v) for k, v in _META_FIELD.findall(text[1:-1])}
    source_file = fields.get("source_file", "")
    source_line = _to_int(fields.get("source_line"))
    frame_id = _to_int(fields.get("stack_frame_id"))
    if not source_file and frame_id is not None:
        source_file, source_line = frames.location(frame_id)
    return Metadata(
        op_name=fields.get("op_name", ""), source_file=source_file, source_line=source_line
    )


def _assign_kinds(module: HloModule) -> None:
    for computation in module.computations.values():
        for instruction in computation.instructions:
            for key, kind in _called(instruction):
                callee = module.computations.get(key)
                if callee is None:
                    continue
                module.callers.setdefault(callee.name, []).append((computation, instruction))
                # A computation called both ways keeps the most "executed" role.
                if callee.kind == OTHER or (callee.kind == REGION and kind == CONTROL):
                    callee.kind = kind
    for computation in module.computations.values():
        if computation.is_entry:
            computation.kind = ENTRY
    if not any(c.is_entry for c in module.computations.values()):
        entry = module.entry
        if entry is not None and entry.name not in module.callers:
            entry.kind = ENTRY


def _called(instruction: Instruction) -> Iterator[tuple[str, str]]:
    attrs = instruction.attributes
    op = instruction.opcode
    for key in ("calls", "to_apply", "body", "condition", "select", "scatter",
                "true_computation", "false_computation", "branch_computations",
                "called_computations"):
        value = attrs.get(key)
        if value is None:
            continue
        if op == "fusion" and key == "calls":
            kind = FUSION
        elif op in ("while", "conditional", "call"):
            kind = CONTROL
        elif key in ("to_apply", "select", "scatter"):
            kind = REGION
        else:
            kind = OTHER
        for name in value.strip("{}").split(","):
            ref = _computation_ref(name)
            if ref:
                yield ref, kind


def _computation_ref(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip().lstrip("%")
    return value or None


def _operand_name(text: str) -> str:
    # Operands print as "name", "%name" or, in older long forms, "f32[2]{0} %name".
    token = text.strip().rsplit(" ", 1)[-1] if text.strip() else ""
    return token.lstrip("%")


def _int_list(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    inner = value.strip().strip("{}").strip()
    if not inner:
        return ()
    try:
        return tuple(int(v) for v in inner.split(","))
    except ValueError:
        return None


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def _fields(text: str) -> dict[str, str]:
    return dict(_META_FIELD.findall(text.strip().strip("{}")))


def _strip_comments(line: str) -> str:
    return _COMMENT.sub("", line) if "/*" in line else line


def _walk(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, char, bracket depth after it) for every char outside "quoted" strings."""
    depth = 0
    in_quote = False
    i = start
    while i < len(text):
        ch = text[i]
        if in_quote:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_quote = False
        elif ch == '"':
            in_quote = True
        else:
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
            yield i, ch, depth
        i += 1


# Index just past the bracket that closes text[start], or -1 when it never closes.
def _scan_balanced(text: str, start: int) -> int:
    for i, ch, depth in _walk(text, start):
        if ch in _CLOSE and depth == 0:
            return i + 1
    return -1


def _scan_token(text: str) -> int:
    """Index of the first space outside brackets (the end of a non-tuple shape)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == " " and depth <= 0:
            return i
    return len(text)


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    start = 0
    for i, ch, depth in _walk(text):
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]
