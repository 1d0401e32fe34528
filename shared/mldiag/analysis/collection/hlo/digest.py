"""A small digest of each HLO module, kept in the health snapshot for comparing sessions.

Two captures of one program compile the same HLO unless something changed: an input's shape
or layout, a flag, the code. The digest records what a later diff needs to say which, without
keeping the module text: a fingerprint of the text, the entry parameters' shapes and layouts,
and each executed instruction's *signature*, its opcode (for a fusion, its kind and the
opcodes fused inside). Signatures carry no names and no shapes, so a recompile that renumbers
instructions or only changes shapes adds and removes none, while a new copy, transpose or
collective shows up as one.

For pairing ops across a recompile by what they compute rather than by their generated names,
each executed instruction also keeps its `op_info`: its result and operand shapes (with
dtypes and layouts), the fingerprint of what it computes (`body`: for a fusion, its fused
computation with every name canonicalised, so a fusion renamed `fusion.3` -> `fusion.7` keeps
it), and its *atoms*, one per computing instruction inside it: `[opcode, dtype, where]`, where
`where` is the instruction's `file.py:LINE` from op metadata (else its op name). A fusion whose
boundary moved keeps its atoms: they then sit in other fusions.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.collection.hlo.text import (
    Computation,
    HloModule,
    HloParseError,
    Instruction,
    parse_module,
)

# Names and signatures kept per module; a larger module keeps its signature counts only.
MAX_OPS = 5000
# Atoms kept per executed op (a larger fusion keeps its first ones and says so).
MAX_ATOMS = 64
# Fused opcodes that say nothing about what a fusion does.
_PLUMBING = frozenset({"parameter", "constant", "bitcast", "tuple", "get-tuple-element"})
COLLECTIVES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "all-reduce-start", "all-reduce-done", "all-gather-start",
    "all-gather-done", "collective-permute-start", "collective-permute-done", "send", "recv",
    "send-done", "recv-done", "ragged-all-to-all",
})
DATA_MOVEMENT = frozenset({"copy", "transpose", "copy-start", "copy-done"})
_PROGRAM = re.compile(r"\((\d+)\)$")


def module_base(name: str) -> str:
    """A module's name without xprof's program id: `jit_step(16)` -> `jit_step`."""
    return re.sub(r"\(\d+\)$", "", name)


def program_id(name: str) -> str:
    """The program id xprof appends to a module name, or ""."""
    match = _PROGRAM.search(name)
    return match.group(1) if match else ""


def fingerprint(text: str) -> str:
    """A hash of the module text without its name line's module name (the name alone does
    not change what runs); equal fingerprints mean the same compiled HLO."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("HloModule "):
        head = lines[0][len("HloModule "):]
        lines[0] = "HloModule " + (head.split(",", 1)[1] if "," in head else "")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def signature(module: HloModule, instruction: Instruction) -> str:
    """What an executed instruction does: `copy`, `all-reduce`, `fusion:kLoop(copy)`,
    `custom-call:<target>`."""
    op = instruction.opcode
    if op == "fusion":
        body = module.fusion_body(instruction)
        fused = sorted({i.opcode for i in (body.instructions if body else [])} - _PLUMBING)
        return f"fusion:{instruction.kind or '?'}({'+'.join(fused)})"
    if op == "custom-call":
        target = instruction.attributes.get("custom_call_target", "").strip('"')
        return f"custom-call:{target}" if target else op
    return op


def opcodes_of(sig: str) -> set[str]:
    """The opcodes a signature stands for (a fusion's fused opcodes)."""
    if sig.startswith("fusion:") and "(" in sig:
        inner = sig[sig.index("(") + 1:-1]
        return {o for o in inner.split("+") if o}
    return {sig.split(":", 1)[0]}


_DROPPED_ATTRIBUTES = frozenset({"metadata", "backend_config", "sharding", "frontend_attributes",
                                  "statistics", "origin", "schedule_name"})
_CALLED = ("calls", "to_apply", "body", "condition", "true_computation", "false_computation",
           "branch_computations", "called_computations", "select", "scatter")
_LOCATION = re.compile(r"^(?P<where>[^\s()]+:\d+)(?: \((?P<op>.*)\))?$")


def _canonical(module: HloModule, computation: Computation, seen: dict[str, str]) -> str:
    """A computation as text with every instruction and computation name replaced by its
    position (parameters by their number): what it computes, not what it is called."""
    if computation.name in seen:
        return seen[computation.name]
    seen[computation.name] = "<recursive>"
    ids = {i.name: f"%{n}" for n, i in enumerate(computation.instructions)}
    lines = []
    for i in computation.instructions:
        args = ",".join(ids.get(o, "?") for o in i.operands)
        attrs = []
        for key in sorted(i.attributes):
            if key in _DROPPED_ATTRIBUTES:
                continue
            value = i.attributes[key]
            if key in _CALLED:
                called = [module.computations.get(c.strip().lstrip("%"))
                          for c in value.strip("{}").split(",") if c.strip()]
                value = "|".join(_fp(_canonical(module, c, seen)) if c else "?"
                                 for c in called)
            attrs.append(f"{key}={value}")
        literal = i.literal if i.opcode != "parameter" else str(i.parameter_number)
        lines.append(f"{'ROOT ' if i.is_root else ''}{ids[i.name]} = {i.shape.text} "
                     f"{i.opcode}({args}){literal} {' '.join(attrs)}")
    seen[computation.name] = "\n".join(lines)
    return seen[computation.name]


def _fp(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _where(instruction: Instruction, sources: Mapping[str, str]) -> str:
    """`file.py:LINE` of an instruction (from the HLO protos' metadata, else the text's), or
    its op name when no line is known, or ""."""
    found = sources.get(instruction.name, "")
    match = _LOCATION.match(found)
    if match:
        return match["where"]
    meta = instruction.metadata
    if meta.source_file and meta.source_line:
        return f"{meta.source_file.rsplit('/', 1)[-1]}:{meta.source_line}"
    return found or meta.op_name


def op_info(module: HloModule, computation: Computation, instruction: Instruction,
            sources: Mapping[str, str], seen: dict[str, str]) -> dict[str, Any]:
    """What one executed instruction computes (see the module docstring)."""
    body = module.fusion_body(instruction)
    inner = [i for i in (body.instructions if body else [instruction])
             if i.opcode not in _PLUMBING]
    operands = [computation.get(o) for o in instruction.operands]
    if body is not None:
        what = _canonical(module, body, seen)
    else:
        # One instruction: its own canonical form, its operands by their shapes.
        alone = Instruction(name=instruction.name, opcode=instruction.opcode,
                            shape=instruction.shape, operands=instruction.operands,
                            computation="", index=0, attributes=instruction.attributes,
                            literal=instruction.literal)
        what = _canonical(module, Computation(name=f"<{instruction.name}>",
                                              instructions=[alone]), {})
    shapes = [o.shape.text if o is not None else "?" for o in operands]
    info: dict[str, Any] = {
        "name": instruction.name,
        "shape": instruction.shape.text,
        "operands": shapes,
        "args": [o.name for o in operands if o is not None and o.opcode not in _PLUMBING],
        "body": _fp(f"{instruction.opcode}:{instruction.kind or ''}:{','.join(shapes)}\n"
                    f"{what}"),
        "atoms": [[i.opcode, i.shape.dtype, _where(i, sources)] for i in inner[:MAX_ATOMS]],
    }
    if len(inner) > MAX_ATOMS:
        info["atoms_truncated"] = len(inner)
    return info


def digest(name: str, text: str, sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The digest of one module's HLO text (see the module docstring); `sources` maps
    instruction names to `file.py:LINE (op name)` (`meta.sources`)."""
    out: dict[str, Any] = {"module": name, "base": module_base(name),
                           "program_id": program_id(name), "fingerprint": fingerprint(text)}
    try:
        module = parse_module(text)
    except HloParseError as e:
        return {**out, "error": str(e)}
    header = text.strip().splitlines()[0] if text.strip() else ""
    layout = re.search(r"entry_computation_layout=\{(.*)\}\s*$", header)
    out["entry_layout"] = layout.group(1) if layout else ""
    entry = module.entry
    params = sorted((i for i in (entry.instructions if entry else [])
                     if i.opcode == "parameter"), key=lambda i: i.parameter_number or 0)
    out["parameters"] = [{"name": p.name, "shape": p.shape.text} for p in params]
    ops: dict[str, str] = {}
    infos: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    seen: dict[str, str] = {}
    for computation in module.executed_computations():
        for instruction in computation.instructions:
            if instruction.opcode in _PLUMBING:
                continue
            sig = signature(module, instruction)
            counts[sig] += 1
            if len(ops) < MAX_OPS:
                ops[instruction.name] = sig
                infos.append(op_info(module, computation, instruction, sources or {}, seen))
    out["instructions"] = sum(counts.values())
    out["signatures"] = dict(sorted(counts.items()))
    out["ops"] = ops
    out["op_info"] = infos
    if sum(counts.values()) > len(ops):
        out["ops_truncated"] = True
    return out


def digests(texts: Mapping[str, str],
            sources: Mapping[str, Mapping[str, str]] | None = None) -> list[dict[str, Any]]:
    """The digest of every module, sorted by name; `sources` is `meta.module_sources`
    (module name -> instruction -> `file.py:LINE (op name)`)."""
    return [digest(name, texts[name], (sources or {}).get(name)) for name in sorted(texts)]
