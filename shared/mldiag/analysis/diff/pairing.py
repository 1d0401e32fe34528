"""Pairing the ops of a recompiled program across two sessions by what they compute.

A recompile renames what XLA generates (`fusion.3` becomes `fusion.7`, and `ynn_fusion` may
now name a different fusion), so names say little. Each executed op of a module's digest
(`hlo.digest.op_info`) carries the fingerprint of what it computes, its shapes, and its atoms
(`[opcode, dtype, file:line]` of each computing instruction inside it). Ops pair in tiers:

1. the same computation: equal fingerprints (shapes, dtypes and layouts included) from the
   same source lines, the same name first when several match;
2. the same code: the same signature and the same atoms by opcode and source line (only shapes,
   dtypes or layouts differ);
3. what is left links up through the atoms it shares (an instruction of one line now fused
   elsewhere) and through data flow (a new copy between two linked ops): each connected set is
   one *regrouped* change, whose atoms added, removed or changed in dtype say what it is (a
   materialized transpose, a dtype change, a fusion boundary that moved);
4. among what shares no line with anything: the same computation from other lines (code
   added above it moved them), then the same name and signature (digests without lines);

and the rest is new or removed. Every op appears once: in a pair, a group, or the remainder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SAME_COMPUTATION = "same computation"
SAME_CODE = "same code"
SAME_NAME = "same name and signature"


@dataclass(frozen=True)
class OpFacts:
    """One executed op of one side, as its digest describes it."""

    name: str
    signature: str
    shape: str
    body: str
    atoms: tuple[tuple[str, str, str], ...]
    args: tuple[str, ...]

    @property
    def code(self) -> frozenset[tuple[str, str]]:
        """(opcode, where) of its atoms that have a source line."""
        return frozenset((op, where) for op, _, where in self.atoms if _is_line(where))


@dataclass
class Group:
    """A regrouped change: ops of A that became ops of B, linked by the code they share."""

    a: list[str] = field(default_factory=list)
    b: list[str] = field(default_factory=list)
    added: list[tuple[str, str, str]] = field(default_factory=list)
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    # (opcode, where, dtype in A, dtype in B) of atoms that changed dtype.
    retyped: list[tuple[str, str, str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "atoms_added": [list(x) for x in self.added],
                "atoms_removed": [list(x) for x in self.removed],
                "dtype_changed": [list(x) for x in self.retyped]}


@dataclass
class Pairing:
    """How the ops of one module pair across the sides."""

    pairs: list[tuple[str, str, str]] = field(default_factory=list)  # (a, b, how)
    groups: list[Group] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": [{"a": a, "b": b, "how": how} for a, b, how in self.pairs],
                "renamed": sum(1 for a, b, _ in self.pairs if a != b),
                "groups": [g.to_dict() for g in self.groups],
                "new": self.new, "removed": self.removed}


def _is_line(where: str) -> bool:
    head, _, line = where.rpartition(":")
    return bool(head) and line.isdigit()


def facts(digest: Mapping[str, Any]) -> dict[str, OpFacts] | None:
    """The ops of a module digest, or None when it has no `op_info` (an older snapshot, or a
    module too large to keep each op)."""
    infos = digest.get("op_info")
    if not isinstance(infos, list) or not infos or digest.get("ops_truncated"):
        return None
    sigs = digest.get("ops") or {}
    out = {}
    for info in infos:
        if not isinstance(info, Mapping) or not info.get("name"):
            continue
        name = str(info["name"])
        out[name] = OpFacts(
            name=name, signature=str(sigs.get(name, "")), shape=str(info.get("shape", "")),
            body=str(info.get("body", "")),
            atoms=tuple((str(a[0]), str(a[1]), str(a[2])) for a in info.get("atoms") or []
                        if isinstance(a, Sequence) and len(a) == 3),
            args=tuple(str(x) for x in info.get("args") or []))
    return out


def pair(a: Mapping[str, OpFacts], b: Mapping[str, OpFacts]) -> Pairing:
    """Pair the ops of one module (see the module docstring)."""
    out = Pairing()
    left_a = dict(a)
    left_b = dict(b)
    order_b = {n: i for i, n in enumerate(b)}

    def take(key: Callable[[OpFacts], Hashable | None], how: str) -> None:
        index: dict[Hashable, list[str]] = {}
        for name in left_b:
            k = key(left_b[name])
            if k is not None:
                index.setdefault(k, []).append(name)
        # Ops that keep their name first, then in the order the module runs them.
        for name_a in sorted(left_a, key=lambda n: n not in left_b):
            k = key(left_a[name_a])
            candidates = [n for n in index.get(k, []) if n in left_b] if k is not None else []
            if not candidates:
                continue
            # The same name first, then the most atoms in common, then the first in B's
            # order (the k-th of several identical ops pairs with the k-th).
            best = min(candidates, key=lambda n: (
                n != name_a, -len(left_a[name_a].code & left_b[n].code), order_b[n]))
            out.pairs.append((name_a, best, how))
            del left_a[name_a], left_b[best]

    # The same computation from the same lines; the same code on other shapes.
    take(lambda x: (x.body, x.code) if x.body else None, SAME_COMPUTATION)
    take(lambda x: (x.signature, x.code) if x.code else None, SAME_CODE)
    out.groups = _regroup(left_a, left_b, a, b)
    for g in out.groups:
        for n in g.a:
            left_a.pop(n, None)
        for n in g.b:
            left_b.pop(n, None)
    # What shares no line with anything: the same computation from lines that moved (code
    # added above it), then the same name and signature (digests without source lines).
    take(lambda x: x.body or None, SAME_COMPUTATION)
    take(lambda x: (x.name, x.signature), SAME_NAME)
    out.new = sorted(left_b)
    out.removed = sorted(left_a)
    return out


def _regroup(left_a: Mapping[str, OpFacts], left_b: Mapping[str, OpFacts],
             all_a: Mapping[str, OpFacts], all_b: Mapping[str, OpFacts]) -> list[Group]:
    """Connected sets of unpaired ops that share code, each with at least one op a side."""
    nodes = [("A", n) for n in sorted(left_a)] + [("B", n) for n in sorted(left_b)]
    parent = {node: node for node in nodes}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(x: tuple[str, str], y: tuple[str, str]) -> None:
        parent[find(x)] = find(y)

    by_code: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for side, ops in (("A", left_a), ("B", left_b)):
        for name, op in ops.items():
            for key in op.code:
                by_code.setdefault(key, []).append((side, name))
    for members in by_code.values():
        for other in members[1:]:
            union(members[0], other)
    # Data flow within one side: a new copy between two ops of a group belongs to it.
    for side, ops in (("A", left_a), ("B", left_b)):
        for name, op in ops.items():
            for arg in op.args:
                if arg in ops:
                    union((side, name), (side, arg))
    components: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for node in nodes:
        components.setdefault(find(node), []).append(node)
    groups = []
    for members in components.values():
        names_a = sorted(n for s, n in members if s == "A")
        names_b = sorted(n for s, n in members if s == "B")
        if not names_a or not names_b:
            continue
        atoms_a = [x for n in names_a for x in all_a[n].atoms]
        atoms_b = [x for n in names_b for x in all_b[n].atoms]
        ka = Counter((op, where) for op, _, where in atoms_a)
        kb = Counter((op, where) for op, _, where in atoms_b)
        dtype_a = {(op, where): dtype for op, dtype, where in atoms_a}
        dtype_b = {(op, where): dtype for op, dtype, where in atoms_b}
        added = [(op, dtype_b[(op, where)], where) for op, where in (kb - ka)]
        removed = [(op, dtype_a[(op, where)], where) for op, where in (ka - kb)]
        retyped = sorted({(op, where, dtype_a[(op, where)], dtype_b[(op, where)])
                          for op, where in ka.keys() & kb.keys()
                          if dtype_a[(op, where)] != dtype_b[(op, where)]})
        groups.append(Group(a=_in_order(names_a, all_a), b=_in_order(names_b, all_b),
                            added=sorted(set(added)), removed=sorted(set(removed)),
                            retyped=retyped))
    groups.sort(key=lambda g: (g.a, g.b))
    return groups


def _in_order(names: Sequence[str], ops: Mapping[str, OpFacts]) -> list[str]:
    """Names in the order the module runs them (its digest's order)."""
    order = {n: i for i, n in enumerate(ops)}
    return sorted(names, key=lambda n: order.get(n, len(order)))
