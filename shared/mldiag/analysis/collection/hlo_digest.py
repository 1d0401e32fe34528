"""A small digest of each HLO module, kept in the health snapshot for comparing sessions.

Two captures of one program compile the same HLO unless something changed: an input's shape
or layout, a flag, the code. The digest records what a later diff needs to say which, without
keeping the module text: a fingerprint of the text, the entry parameters' shapes and layouts,
and each executed instruction's *signature*, its opcode (for a fusion, its kind and the
opcodes fused inside). Signatures carry no names and no shapes, so a recompile that renumbers
instructions or only changes shapes adds and removes none, while a new copy, transpose or
collective shows up as one.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.collection.hlo import HloModule, HloParseError, Instruction, parse_module

# Names and signatures kept per module; a larger module keeps its signature counts only.
MAX_OPS = 5000
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


def digest(name: str, text: str) -> dict[str, Any]:
    """The digest of one module's HLO text (see the module docstring)."""
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
    counts: Counter[str] = Counter()
    for computation in module.executed_computations():
        for instruction in computation.instructions:
            if instruction.opcode in _PLUMBING:
                continue
            sig = signature(module, instruction)
            counts[sig] += 1
            if len(ops) < MAX_OPS:
                ops[instruction.name] = sig
    out["instructions"] = sum(counts.values())
    out["signatures"] = dict(sorted(counts.items()))
    out["ops"] = ops
    if sum(counts.values()) > len(ops):
        out["ops_truncated"] = True
    return out


def digests(texts: Mapping[str, str]) -> list[dict[str, Any]]:
    """The digest of every module, sorted by name."""
    return [digest(name, texts[name]) for name in sorted(texts)]
