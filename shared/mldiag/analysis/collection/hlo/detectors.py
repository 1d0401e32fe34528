"""HLO detectors for three data-movement bottlenecks that xprof's own queries miss.

Each detector takes ``{module name: HLO text}`` (as ``get_hlo_text`` returns it) and
returns :class:`Detection` records naming the instruction that executes, i.e. the
instruction of the entry computation (or of a while/conditional/call body) whose name
appears on the timeline and in the op profile. XLA:CPU wraps single ops in
``wrapped_*`` fusions (``kind=kLoop``) and fuses short movement chains into fusions
such as ``transpose_copy_fusion``; the detectors look inside those bodies.

Tensors under :data:`MIN_BYTES` are ignored. Text the parser cannot read yields no
detections for that module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mldiag.analysis.collection.hlo.facts import parsed, source_of
from mldiag.analysis.collection.hlo.text import (
    FUSION,
    Computation,
    HloModule,
    Instruction,
    Shape,
)

MIN_BYTES = 64 * 1024

LAYOUT = "detect_layout_mismatch_copies"
UNFUSED = "detect_unfused_reshapes"
CONVERT_REDUCE = "detect_unnecessary_convert_reduce"

_TRIVIAL = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})
_MOVEMENT = frozenset({"copy", "transpose", "reshape", "bitcast"})
_RELAYOUT = frozenset({"copy", "transpose", "bitcast"})
_NON_FUSIBLE = frozenset({
    "dot", "convolution", "custom-call", "fft", "sort", "scatter", "triangular-solve",
    "cholesky", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
    "ragged-all-to-all", "collective-permute", "collective-broadcast", "send", "recv",
    "infeed", "outfeed", "while", "conditional", "call", "rng", "rng-bit-generator",
})
_NON_FUSIBLE_IN_BODY = frozenset({"dot", "convolution", "custom-call", "fft", "sort",
                                  "scatter"})
_ELEMENTWISE = frozenset({
    "abs", "add", "atan2", "cbrt", "ceil", "clamp", "cosine", "divide", "erf", "exponential",
    "exponential-minus-one", "floor", "log", "log-plus-one", "logistic", "maximum",
    "minimum", "multiply", "negate", "power", "remainder", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "select", "sign", "sine", "sqrt", "subtract", "tan",
    "tanh",
})
_VALUE_PRESERVING = frozenset({"bitcast", "reshape", "copy", "transpose", "broadcast"})
_LOW_PRECISION_FLOATS = frozenset({"bf16", "f16"})


@dataclass(frozen=True)
class Detection:
    """One finding of an HLO detector.

    ``instruction`` is the executing (timeline) instruction; ``inner_instruction`` is
    the instruction inside its fusion body that matched, or ``instruction`` itself.
    Shapes are full HLO shape strings with layouts; ``bytes`` is the size of the
    matched output; ``source`` is ``file.py:123 (op_name)`` when the HLO carries
    metadata, else ``""``.
    """

    detector: str
    module: str
    instruction: str
    inner_instruction: str
    opcode: str
    input_shape: str
    output_shape: str
    input_layout: str
    output_layout: str
    bytes: int
    source: str
    description: str
    # A chain's executing instructions, in order, when it has several costly links: its cost
    # is the sum of theirs.
    chain: tuple[str, ...] = ()
    # For a relayout fused into a consumer: the other ops of that fusion (`add`, `tanh`), whose
    # kernel does the transposing read; its time is the fusion's, an upper bound.
    fused_with: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The detection as a JSON-ready dict with the field names above."""
        return dataclasses.asdict(self)


def detect_layout_mismatch_copies(modules: Mapping[str, str]) -> list[Detection]:
    """Copies and transposes whose only job is to change a tensor's layout.

    Matches a top-level ``copy``/``transpose``, or a fusion whose body only moves data
    without reshaping it (``copy``/``transpose``/``bitcast``, e.g. ``wrapped_copy`` or
    ``transpose_copy_fusion``), when it holds a ``copy`` between two layouts of the same
    dims and dtype (``{1,0}`` -> ``{0,1}``), or a ``transpose`` whose permutation and
    layouts give the same physical order (it only relabels the layout). Also a transpose
    fused into a consumer (``x.T + y`` as one ``add`` fusion): a copy or transpose inside a
    fusion that computes too, when it reorders a large operand physically; the fusion's
    other ops are in ``fused_with``.
    """
    return _run(modules, _layout_mismatches)


def detect_unfused_reshapes(modules: Mapping[str, str]) -> list[Detection]:
    """Standalone reshape/transpose/copy chains that run as their own kernels.

    Movement units are top-level ``reshape``/``transpose``/``copy`` instructions and
    fusions whose bodies only move data; bitcasts are free and only link units. A
    chain is reported once, by its largest unit, when it has two or more units in a
    row, or one unit between two ops it cannot fuse into (dots, custom calls,
    ``kCustom``/``kOutput`` fusions, collectives). A lone layout copy that
    :func:`detect_layout_mismatch_copies` reports is left to that detector unless the
    unit itself chains two or more movement ops.
    """
    return _run(modules, _unfused_reshapes)


def detect_unnecessary_convert_reduce(modules: Mapping[str, str]) -> list[Detection]:
    """Low-precision floats (bf16, f16, f8, ...) converted to f32 and then reduced.

    The ``convert`` must feed a ``reduce`` directly or through elementwise and
    value-preserving movement ops, in the same fusion body or across top-level
    instructions. Reported on the executing instruction that holds the ``convert``.
    """
    return _run(modules, _convert_reduces)


_Detector = Callable[[str, HloModule], Iterator[tuple[int, Detection]]]


def _run(modules: Mapping[str, str], detector: _Detector) -> list[Detection]:
    found: list[tuple[str, int, Detection]] = []
    for name in sorted(modules):
        text = modules[name]
        module = parsed(text) if isinstance(text, str) else None
        if module is None:
            continue
        found.extend((name, index, d) for index, d in detector(name, module))
    found.sort(key=lambda t: (t[0], t[1]))
    return [d for _, _, d in found]


# ---------------------------------------------------------------- movement units


@dataclass(frozen=True)
class _Unit:
    # A top-level (executing) instruction that only moves data.
    instruction: Instruction
    ops: tuple[Instruction, ...]  # the ops themselves, or the fusion body's non-trivial ops
    body: Computation | None  # the fusion body, or None for a top-level op

    @property
    def free(self) -> bool:
        return all(op.opcode == "bitcast" for op in self.ops)

    def operand_shape(self, op: Instruction, computation: Computation) -> Shape | None:
        scope = self.body if self.body is not None else computation
        operand = scope.get(op.operands[0]) if op.operands else None
        return operand.shape if operand is not None else None


def _movement_unit(
    module: HloModule, instruction: Instruction, allowed: frozenset[str]
) -> _Unit | None:
    if instruction.shape.is_tuple:
        return None
    if instruction.opcode in allowed:
        return _Unit(instruction, (instruction,), None)
    body = module.fusion_body(instruction)
    if body is None:
        return None
    ops = tuple(i for i in body.instructions if i.opcode not in _TRIVIAL)
    if not ops or any(op.opcode not in allowed for op in ops):
        return None
    return _Unit(instruction, ops, body)


# ---------------------------------------------------------------- layout mismatch


def _layout_mismatches(name: str, module: HloModule) -> Iterator[tuple[int, Detection]]:
    for computation in module.executed_computations():
        for instruction in computation.instructions:
            found = _layout_change(module, computation, instruction)
            if found is None:
                fused = _fused_relayout(module, computation, instruction)
                if fused is None:
                    continue
                op, in_shape, others = fused
                yield instruction.index, dataclasses.replace(_detection(
                    LAYOUT, name, instruction, op, op.opcode, in_shape, op.shape,
                    op.shape.byte_size,
                    f"In {name}, {_where(instruction, op)} transposes {_dims(in_shape)} "
                    f"(layout {in_shape.layout_text} read as {op.shape.layout_text}) inside "
                    f"the fusion that also computes {', '.join(others)}: no copy is written, "
                    f"but the kernel reads {_mib(op.shape.byte_size)} across its layout "
                    "(strided) every execution.",
                ), fused_with=tuple(others))
                continue
            op, in_shape, why = found
            yield instruction.index, _detection(
                LAYOUT, name, instruction, op, op.opcode, in_shape, op.shape, op.shape.byte_size,
                f"In {name}, {_where(instruction, op)} {why}, "
                f"{_mib(op.shape.byte_size)} written per execution.",
            )


def _layout_change(
    module: HloModule, computation: Computation, instruction: Instruction
) -> tuple[Instruction, Shape, str] | None:
    if instruction.shape.byte_size < MIN_BYTES:
        return None
    unit = _movement_unit(module, instruction, _RELAYOUT)
    if unit is None:
        return None
    changes: list[tuple[Instruction, Shape, str]] = []
    for op in unit.ops:
        in_shape = unit.operand_shape(op, computation)
        if in_shape is None or in_shape.is_tuple or in_shape.dtype != op.shape.dtype:
            return None
        if sorted(in_shape.dims) != sorted(op.shape.dims):
            return None  # a reshape: that is a movement chain, not a relayout
        why = _relayout_reason(op, in_shape)
        if why:
            changes.append((op, in_shape, why))
    copies = [c for c in changes if c[0].opcode == "copy"]
    if copies:
        return copies[0]
    return changes[0] if changes else None


def _fused_relayout(
    module: HloModule, computation: Computation, instruction: Instruction
) -> tuple[Instruction, Shape, list[str]] | None:
    """A large copy/transpose that physically reorders data inside a fusion that computes,
    unless the data comes from a library call (LAPACK's column-major output is read back in
    that call's own layout: nothing in the user's code asks for that transpose)."""
    body = module.fusion_body(instruction)
    if body is None:
        return None
    for producer in computation.operand_instructions(instruction):
        for _ in range(8):
            if producer.opcode != "get-tuple-element":
                break
            producer = next(iter(computation.operand_instructions(producer)), producer)
        if producer.opcode == "custom-call":
            return None
    ops = [i for i in body.instructions if i.opcode not in _TRIVIAL]
    others = list(dict.fromkeys(i.opcode for i in ops if i.opcode not in _MOVEMENT))
    if not others or any(op in _NON_FUSIBLE_IN_BODY for op in others):
        return None  # pure movement (reported above), or a library kernel's own operand order
    for op in ops:
        if op.opcode not in ("copy", "transpose") or op.shape.byte_size < MIN_BYTES:
            continue
        operand = body.get(op.operands[0]) if op.operands else None
        in_shape = operand.shape if operand is not None else None
        if in_shape is None or in_shape.is_tuple or in_shape.layout is None or (
                op.shape.layout is None or in_shape.dtype != op.shape.dtype):
            continue
        if op.opcode == "copy" and _relayout_reason(op, in_shape):
            return op, in_shape, others
        perm = op.dimensions
        if op.opcode == "transpose" and perm and sorted(perm) == list(range(len(perm))) and (
                len(op.shape.layout) == len(perm)
                and tuple(perm[d] for d in op.shape.layout) != in_shape.layout):
            return op, in_shape, others
    return None


def _relayout_reason(op: Instruction, in_shape: Shape) -> str:
    out = op.shape
    if in_shape.layout is None or out.layout is None:
        return ""
    if op.opcode == "copy":
        if in_shape.dims == out.dims and in_shape.physical_layout != out.physical_layout:
            return (f"copies {_dims(in_shape)} from layout {in_shape.layout_text} "
                    f"to {out.layout_text} (same dims and dtype, only the layout changes)")
        return ""
    if op.opcode == "transpose":
        perm = op.dimensions
        rank = len(out.dims)
        if perm is None or sorted(perm) != list(range(rank)) or len(out.layout) != rank:
            return ""
        if perm == tuple(range(rank)) or in_shape.tiling != out.tiling:
            return ""
        if tuple(perm[d] for d in out.layout) == in_shape.layout:
            return (f"transposes {in_shape.text} into {out.text} with dimensions="
                    f"{{{','.join(map(str, perm))}}}, a physical no-op that only turns "
                    f"layout {in_shape.layout_text} into {out.layout_text}")
    return ""


# ---------------------------------------------------------------- unfused reshapes


def _unfused_reshapes(name: str, module: HloModule) -> Iterator[tuple[int, Detection]]:
    for computation in module.executed_computations():
        units = {}
        for instruction in computation.instructions:
            unit = _movement_unit(module, instruction, _MOVEMENT)
            if unit is not None:
                units[instruction.name] = unit
        for chain in _chains(computation, units):
            found = _report_chain(name, module, computation, chain)
            if found is not None:
                yield found


def _chains(computation: Computation, units: Mapping[str, _Unit]) -> list[list[_Unit]]:
    parent = {n: n for n in units}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n, unit in units.items():
        for operand in unit.instruction.operands:
            if operand in units:
                parent[find(operand)] = find(n)
    groups: dict[str, list[_Unit]] = {}
    for n, unit in units.items():
        groups.setdefault(find(n), []).append(unit)
    chains = [sorted(g, key=lambda u: u.instruction.index) for g in groups.values()]
    return sorted(chains, key=lambda c: c[0].instruction.index)


def _report_chain(
    name: str, module: HloModule, computation: Computation, chain: list[_Unit]
) -> tuple[int, Detection] | None:
    costly = [u for u in chain if not u.free]
    if not costly:
        return None
    biggest = max(costly, key=lambda u: (u.instruction.shape.byte_size, -u.instruction.index))
    if biggest.instruction.shape.byte_size < MIN_BYTES:
        return None
    members = {u.instruction.name for u in chain}
    producers = [
        p for u in chain for p in computation.operand_instructions(u.instruction)
        if p.name not in members
    ]
    consumers = [
        c for u in chain for c in computation.users(u.instruction.name) if c.name not in members
    ]
    if len(costly) == 1:
        between = (any(_non_fusible(module, computation, p) for p in producers)
                   and any(_non_fusible(module, computation, c) for c in consumers))
        if not between:
            return None
        if _layout_change(module, computation, costly[0].instruction) is not None:
            return None  # a lone relayout: detect_layout_mismatch_copies reports it
    inner = max(
        (op for op in biggest.ops if op.opcode != "bitcast"),
        key=lambda op: (op.shape.byte_size, -op.index),
    )
    top = biggest.instruction
    operand = next(iter(computation.operand_instructions(top)), None)
    in_shape = operand.shape if operand is not None else top.shape
    steps = " -> ".join(_unit_text(u) for u in chain)
    total = sum(u.instruction.shape.byte_size for u in costly)
    if len(costly) == 1:
        what = (f"a standalone data-movement kernel runs between {_names(producers)} and "
                f"{_names(consumers)}, which cannot absorb it")
    else:
        what = f"{len(costly)} data-movement kernels run back to back outside any real fusion"
    description = (
        f"In {name}, {what}: {steps}; {top.name} turns {in_shape.text} into "
        f"{top.shape.text}, {_mib(total)} written per execution."
    )
    found = _detection(
        UNFUSED, name, top, inner, inner.opcode, in_shape, top.shape, top.shape.byte_size,
        description,
    )
    if len(costly) > 1:
        found = dataclasses.replace(found, chain=tuple(u.instruction.name for u in costly))
    return top.index, found


def _non_fusible(module: HloModule, computation: Computation, instruction: Instruction) -> bool:
    seen = 0
    while instruction.opcode == "get-tuple-element" and seen < 8:
        operand = next(iter(computation.operand_instructions(instruction)), None)
        if operand is None:
            return False
        instruction, seen = operand, seen + 1
    op = instruction.opcode
    if op in _NON_FUSIBLE or op.endswith(("-start", "-done", "-update")):
        return True
    body = module.fusion_body(instruction)
    if body is None:
        return False
    if instruction.kind in ("kCustom", "kOutput"):
        return True
    return any(i.opcode in _NON_FUSIBLE_IN_BODY for i in body.instructions)


def _unit_text(unit: _Unit) -> str:
    top = unit.instruction
    if unit.body is None:
        return f"{top.name} ({top.opcode} {top.shape.text})"
    ops = "->".join(op.opcode for op in unit.ops)
    return f"{top.name} (fusion of {ops}, {top.shape.text})"


def _names(instructions: list[Instruction]) -> str:
    if not instructions:
        return "nothing"
    unique = list(dict.fromkeys(instructions))
    shown = []
    for i in unique[:3]:
        label = i.opcode if i.opcode != "fusion" else f"{i.kind or 'fusion'} fusion"
        shown.append(f"{i.name} ({label})")
    more = f" and {len(unique) - 3} more" if len(unique) > 3 else ""
    return ", ".join(shown) + more


# ---------------------------------------------------------------- convert -> reduce


def _convert_reduces(name: str, module: HloModule) -> Iterator[tuple[int, Detection]]:
    for computation in module.executed_computations():
        for instruction in computation.instructions:
            scope = module.fusion_body(instruction)
            if scope is None:
                candidates = [(computation, instruction)] if instruction.opcode == "convert" else []
            else:
                candidates = [(scope, i) for i in scope.instructions if i.opcode == "convert"]
            for where, convert in candidates:
                operand = next(iter(where.operand_instructions(convert)), None)
                if operand is None or not _widens_low_precision(operand.shape, convert.shape):
                    continue
                if convert.shape.byte_size < MIN_BYTES:
                    continue
                reduces = _reduces_fed_by(module, where, convert)
                # Respect fusion boundaries: a convert fused into the reducing kernel (a kInput
                # fusion, or a Triton kernel computing the reduction in-kernel) never writes
                # its f32 values to memory, and `dtype=f32` on the reduce gives the same HLO.
                reduces = [(c, r) for c, r in reduces
                           if _executing(module, c, r) is not instruction]
                if not reduces:
                    continue
                yield instruction.index, _detection(
                    CONVERT_REDUCE, name, instruction, convert, "convert->reduce",
                    operand.shape, convert.shape, convert.shape.byte_size,
                    _convert_description(name, module, instruction, convert, operand.shape,
                                         reduces),
                )
                break  # one detection per executing instruction


def _widens_low_precision(source: Shape, target: Shape) -> bool:
    low = source.dtype in _LOW_PRECISION_FLOATS or source.dtype.startswith(("f8", "f4", "f6"))
    return low and target.dtype == "f32"


def _reduces_fed_by(
    module: HloModule, computation: Computation, start: Instruction
) -> list[tuple[Computation, Instruction]]:
    # Breadth-first, so the nearest reduce comes first. A value enters a fusion body as
    # parameter(k) when it is the fusion's operand k, and leaves it as the fusion's own
    # value when it is the body's ROOT; tuple_index follows it through tuple/gte.
    found: list[tuple[Computation, Instruction]] = []
    todo: list[tuple[Computation, Instruction, int | None]] = [(computation, start, None)]
    seen: set[tuple[str, str, int | None]] = set()
    while todo and len(seen) < 10_000:
        comp, value, tuple_index = todo.pop(0)
        key = (comp.name, value.name, tuple_index)
        if key in seen:
            continue
        seen.add(key)
        if comp.kind == FUSION and value.is_root:
            for caller_comp, caller in module.fusion_callers(comp):
                todo.append((caller_comp, caller, tuple_index))
        for user in comp.users(value.name):
            op = user.opcode
            if op == "reduce":
                inputs = user.operands[: max(1, len(user.operands) // 2)]
                if value.name in inputs and tuple_index is None and (comp, user) not in found:
                    found.append((comp, user))
            elif tuple_index is not None:
                if op == "get-tuple-element" and user.tuple_index == tuple_index:
                    todo.append((comp, user, None))
            elif op in _ELEMENTWISE or op in _VALUE_PRESERVING:
                todo.append((comp, user, None))
            elif op == "tuple":
                todo.extend((comp, user, k) for k, o in enumerate(user.operands)
                            if o == value.name)
            elif op == "fusion":
                body = module.fusion_body(user)
                if body is None:
                    continue
                for k, operand in enumerate(user.operands):
                    parameter = body.parameter(k) if operand == value.name else None
                    if parameter is not None:
                        todo.append((body, parameter, None))
    return found


def _convert_description(
    name: str, module: HloModule, top: Instruction, convert: Instruction, source: Shape,
    reduces: list[tuple[Computation, Instruction]],
) -> str:
    reduce_comp, reduce = reduces[0]
    reduce_top = _executing(module, reduce_comp, reduce)
    cost = f"the reduction could accumulate in f32 while reading {source.dtype}"
    if reduce_top is top:
        place = f"inside the same fusion {top.name}"
        cost = ("the f32 values stay inside that kernel, so this costs time only if "
                f"{top.name} itself is slow")
    elif reduce_top is not None:
        place = f"in {reduce_top.name}, after {top.name} materialises the f32 copy"
    else:
        place = f"in {reduce_comp.name}"
    dims = reduce.dimensions
    over = f" over dimensions={{{','.join(map(str, dims))}}}" if dims else ""
    more = len(reduces) - 1
    others = f" (and {more} more reduce{'s' if more > 1 else ''})" if more else ""
    kinds = sorted({_reducer(module, r) for _, r in reduces} - {""})
    how = f" (reducers: {', '.join(kinds)})" if kinds else ""
    return (
        f"In {name}, {_where(top, convert)} converts {source.text} to {convert.shape.text} "
        f"({_mib(convert.shape.byte_size)} of f32) that feeds {reduce.name} "
        f"({reduce.shape.text}{over}) {place}{others}{how}; {cost}."
    )


def _reducer(module: HloModule, reduce: Instruction) -> str:
    """What a reduce computes: the opcode at the root of its `to_apply` (add, maximum, ...)."""
    body = module.computations.get(reduce.to_apply or "")
    root = body.root if body is not None else None
    return root.opcode if root is not None else ""


def _executing(
    module: HloModule, computation: Computation, instruction: Instruction
) -> Instruction | None:
    for _ in range(8):
        if computation.kind != FUSION:
            return instruction
        callers = module.fusion_callers(computation)
        if not callers:
            return None
        computation, instruction = callers[0]
    return None


# ---------------------------------------------------------------- shared helpers


def _detection(
    detector: str, module: str, top: Instruction, inner: Instruction, opcode: str,
    in_shape: Shape, out_shape: Shape, size: int, description: str,
) -> Detection:
    return Detection(
        detector=detector,
        module=module,
        instruction=top.name,
        inner_instruction=inner.name,
        opcode=opcode,
        input_shape=in_shape.text,
        output_shape=out_shape.text,
        input_layout=in_shape.layout_text,
        output_layout=out_shape.layout_text,
        bytes=size,
        source=source_of(inner) or source_of(top),
        description=description,
    )


def _where(top: Instruction, inner: Instruction) -> str:
    if inner is top:
        return f"{top.name} ({top.opcode})"
    return f"{top.name} ({top.kind or 'fusion'} fusion, via {inner.name})"


def _dims(shape: Shape) -> str:
    return f"{shape.dtype}[{','.join(map(str, shape.dims))}]"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
