"""Facts read from HLO text for the rules, beside the detectors: every asynchronous copy and
its direction (`async_copies`, line by line), and the custom calls and the library routines
behind them (`custom_calls`). Each takes ``{module name: HLO text}``, as ``get_hlo_text``
returns it. Also the parse cache and the source locations the detectors share with them.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.collection.hlo.text import HloModule, HloParseError, Instruction, parse_module


@functools.lru_cache(maxsize=64)
def parsed(text: str) -> HloModule | None:
    """The module parsed from `text`, None when it does not parse. Cached: the detectors and
    `custom_calls` usually read the same texts, and each is parsed once."""
    try:
        return parse_module(text)
    except HloParseError:
        return None


def source_of(instruction: Instruction) -> str:
    """Where the instruction comes from in the user's code: `file.py:line (op name)`, as
    its metadata has it (either part alone, or "")."""
    meta = instruction.metadata
    where = ""
    if meta.source_file:
        where = os.path.basename(meta.source_file)
        if meta.source_line is not None:
            where += f":{meta.source_line}"
    if where and meta.op_name:
        return f"{where} ({meta.op_name})"
    return where or meta.op_name


_COPY_START = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\((.*)\)\s+copy-start\(")
_COPY_DONE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bcopy-done\(%?([\w.\-]+)\)")
_SHAPE = re.compile(r"\w+\[[^\]]*\](?:\{[^}]*\})?")


def async_copies(modules: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every asynchronous copy (copy-start/copy-done pair) and its direction, from the memory
    spaces of its destination and source: S(5) is host memory, no space is device memory."""
    out: list[dict[str, Any]] = []
    for module, text in modules.items():
        starts: dict[str, tuple[str, str]] = {}
        dones: list[tuple[str, str]] = []
        for line in text.splitlines():
            m = _COPY_START.match(line)
            if m:
                shapes = _SHAPE.findall(m.group(2))
                if len(shapes) >= 2:
                    starts[m.group(1)] = (shapes[0], shapes[1])
                continue
            d = _COPY_DONE.match(line)
            if d:
                dones.append((d.group(1), d.group(2)))
        for done, start in dones:
            if start not in starts:
                continue
            dest, src = starts[start]
            to_host, from_host = "S(5)" in dest, "S(5)" in src
            direction = ("host→device" if from_host and not to_host else
                         "device→host" if to_host and not from_host else "device→device")
            out.append({"module": module, "copy_done": done, "copy_start": start,
                        "direction": direction, "destination_shape": dest,
                        "source_shape": src})
    return out


# ---------------------------------------------------------------- custom calls

# LAPACK/cuSOLVER routine stems and the JAX primitive that lowers to them.
_LINALG_ROUTINES = (
    ("syevd", "eigh"), ("heevd", "eigh"), ("syevj", "eigh"), ("gesdd", "svd"),
    ("gesvd", "svd"), ("getrf", "lu"), ("potrf", "cholesky"), ("geqrf", "qr"),
    ("orgqr", "qr"), ("ungqr", "qr"), ("geev", "eig"), ("gees", "schur"),
    ("sytrd", "tridiagonal"), ("gehrd", "hessenberg"), ("trsm", "triangular_solve"),
)


def custom_calls(modules: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every executing custom call (top level, or inside a fusion): its target and, for the
    LAPACK/cuSOLVER routines, the JAX primitive behind it. XLA cannot fuse these calls and
    its cost model counts them as 0 FLOPs. ``outputs_read`` lists the tuple outputs that
    something reads (None when the call is not a top-level tuple): eigenvectors nobody
    reads, for example, are work `eigvalsh` would skip."""
    out: list[dict[str, Any]] = []
    for name in sorted(modules):
        text = modules[name]
        module = parsed(text) if isinstance(text, str) else None
        if module is None:
            continue
        for computation in module.executed_computations():
            for instruction in computation.instructions:
                call = instruction if instruction.opcode == "custom-call" else None
                body = module.fusion_body(instruction) if call is None else None
                if body is not None:
                    call = next((i for i in body.instructions if i.opcode == "custom-call"),
                                None)
                if call is None:
                    continue
                target = call.attributes.get("custom_call_target", "").strip('"')
                primitive = next((p for stem, p in _LINALG_ROUTINES if stem in target), "")
                read: list[int] | None = None
                if call is instruction and call.shape.is_tuple:
                    users = computation.users(call.name)
                    if all(u.opcode == "get-tuple-element" for u in users):
                        read = sorted({u.tuple_index for u in users
                                       if u.tuple_index is not None})
                out.append({"module": name, "instruction": instruction.name,
                            "target": target, "linalg": primitive,
                            "output_shape": call.shape.text, "outputs_read": read,
                            "source": source_of(call) or source_of(instruction)})
    return out
