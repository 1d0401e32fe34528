"""The ranked explanation of a diff: which change accounts for how many ms of the step-time
delta, each with the tool fields that measure it.

The step splits into the time the device waits for the host and its busy time, and the busy
time into each program's ops (`diff_sides`). A program with the same HLO fingerprint on both
sides that ran slower is one change. A recompiled program splits into the op signatures it
gained or lost (a new all-reduce, a layout copy), each with the time of those ops, and the
rest of its ops, which a change of its entry parameters' shapes accounts for when there is
one. Where both digests describe each op (`op_info`), a recompiled program's ops are paired by
what they compute (`pairing`), not by their generated names: each regrouped set of ops (a
materialized transpose, a dtype change, a fusion boundary that moved) is one change with the
time of all its ops on both sides, the ops left over are new or removed, and the paired ops
are the rest. The listed changes, the smaller ones and `unattributed` add up to the step-time
delta.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.collection.hlo.digest import COLLECTIVES, DATA_MOVEMENT, opcodes_of
from mldiag.analysis.diff.sides import (
    HLO_DIGESTS,
    MS_PER_STEP,
    PERCENT,
    Profile,
    device_changed,
    is_collective,
)
from mldiag.analysis.judgement.evidence import TIMELINE

MAX_EXPLANATION = 10
# Below this (ms per step, or points of device time) a delta is no change.
NEGLIGIBLE = 0.001
# Changes that are structural (in the HLO): listed even when no op time measures them.
_STRUCTURAL = ("new_collective", "removed_collective", "layout_change", "removed_copy",
               "new_ops", "removed_ops", "shape_change", "new_program", "removed_program",
               "device_type_change", "dtype_change", "fusion_change")


def _item(change: str, kind: str, delta: float, total: float | None,
          evidence: Sequence[dict[str, Any] | None], **extra: Any) -> dict[str, Any]:
    share = round(delta / total, 4) if total else None
    return {"change": change, "kind": kind, "delta_ms": round(delta, 4),
            "share_of_delta": share, "evidence": [e for e in evidence if e], **extra}


def _op_cites(pa: Profile, pb: Profile, keys: Sequence[tuple[str, str]],
              limit: int = 4) -> list[dict[str, Any] | None]:
    """Evidence for the ops behind a change: their time on each side, largest first."""
    def size(k: tuple[str, str]) -> float:
        a, b = pa.ops.get(k), pb.ops.get(k)
        return abs((b.value if b else 0.0) - (a.value if a else 0.0))

    out: list[dict[str, Any] | None] = []
    for key in sorted(keys, key=size, reverse=True)[:limit]:
        for p in (pa, pb):
            op = p.ops.get(key)
            if op is not None and op.cite is not None:
                out.append(p.cite(*op.cite))
    return out


def _digest_cite(p: Profile, module: str, field: str) -> dict[str, Any] | None:
    digest = p.digests.get(module)
    if digest is None:
        return None
    return p.cite(HLO_DIGESTS, f"[module={digest.get('module')}].{field}")


def _signature_kind(sig: str, added: bool, layout_changed: bool) -> str:
    opcodes = opcodes_of(sig)
    if is_collective(sig):
        return "new_collective" if added else "removed_collective"
    if opcodes and opcodes <= DATA_MOVEMENT:
        return "layout_change" if layout_changed or added else "removed_copy"
    return "new_ops" if added else "removed_ops"


def _describe_sig(sig: str) -> str:
    if sig.startswith("fusion:"):
        inner = sig[sig.index("(") + 1:-1].replace("+", ", ") if "(" in sig else ""
        return f"fusion of {inner}" if inner else "fusion"
    return sig


def _module_changes(pa: Profile, pb: Profile, module: str, row: Mapping[str, Any],
                    total: float | None) -> list[dict[str, Any]]:
    """The changes one program accounts for: its new or vanished op signatures, then the
    rest of its time, explained by a shape change, a recompile, or nothing (same HLO)."""
    da, db = pa.digests.get(module) or {}, pb.digests.get(module) or {}
    keys_a = [k for k in pa.ops if k[0] == module]
    keys_b = [k for k in pb.ops if k[0] == module]
    delta = pb.module_time(module) - pa.module_time(module)
    status = row.get("status")
    if status != "changed":
        what = ("with the same HLO" if status == "unchanged" else "(HLO not compared)")
        verb = "slower" if delta >= 0 else "faster"
        top = max(set(keys_a) | set(keys_b), key=lambda k: abs(
            (pb.ops[k].value if k in pb.ops else 0) - (pa.ops[k].value if k in pa.ops else 0)),
            default=None)
        lead = f"; most in `{top[1]}`" if top else ""
        if top:
            lead += _waiting(pb, top[1])
        return [_item(f"`{module}` ran {verb} {what} ({_fmt(delta, pb.unit)}{lead})",
                      "same_program", delta, total, [
                          _digest_cite(pa, module, "fingerprint"),
                          _digest_cite(pb, module, "fingerprint"),
                          *_op_cites(pa, pb, list(set(keys_a) | set(keys_b)))],
                      module=module)]
    params = list(row.get("parameters") or [])
    layout_changed = any(p["change"] == "layout" for p in params)
    out = []
    accounted = 0.0
    if row.get("pairing"):
        return _paired_changes(pa, pb, module, row, total)
    ops_added, ops_removed = row.get("ops_added") or {}, row.get("ops_removed") or {}
    ops_a, ops_b = dict(da.get("ops") or {}), dict(db.get("ops") or {})

    def only(ops: Mapping[str, str], other: Mapping[str, str], sig: str) -> set[str]:
        return {n for n, s in ops.items() if s == sig and n not in other}

    involved: set[tuple[str, str]] = set()
    for sig in sorted(set(ops_added) | set(ops_removed)):
        added = sig in ops_added
        if ops_a and ops_b and not (da.get("ops_truncated") or db.get("ops_truncated")):
            # Renamed instructions of this signature count too: their time moved names.
            wanted_a, wanted_b = only(ops_a, ops_b, sig), only(ops_b, ops_a, sig)
            ka = [k for k in keys_a if k[1] in wanted_a]
            kb = [k for k in keys_b if k[1] in wanted_b]
        else:
            # Signature counts only (no names): every op of that signature.
            ka = [k for k in keys_a if pa.ops[k].kind == sig]
            kb = [k for k in keys_b if pb.ops[k].kind == sig]
        involved |= set(ka) | set(kb)
        d = sum(pb.ops[k].value for k in kb) - sum(pa.ops[k].value for k in ka)
        count = len((ops_added if added else ops_removed).get(sig) or []) or 1
        names = ", ".join(f"`{k[1]}`" for k in (kb if added else ka)[:3])
        kind = _signature_kind(sig, added, layout_changed)
        text = (f"{'new' if added else 'vanished'} {_describe_sig(sig)} in `{module}`"
                + (f" ({names})" if names else f" ({count}×, not timed)"))
        if kind == "layout_change":
            moved = [p for p in params if p["change"] == "layout"]
            text = (f"layout change recompiled `{module}`: "
                    + "; ".join(f"input {p['name']} {p['a']} → {p['b']}" for p in moved[:2])
                    + (", so " if moved else "") + text)
        cites = [_digest_cite(pb if added else pa, module, f"signatures.{sig}")]
        cites += [_digest_cite(pa, module, f"parameters[{p['index']}].shape")
                  for p in params[:2]] if kind == "layout_change" else []
        cites += [_digest_cite(pb, module, f"parameters[{p['index']}].shape")
                  for p in params[:2]] if kind == "layout_change" else []
        cites += _op_cites(pa, pb, ka + kb)
        out.append(_item(text, kind, d, total, cites, module=module, signature=sig,
                         timed=bool(ka or kb)))
        accounted += d
    rest = delta - accounted
    shaped = [p for p in params if p["change"] in ("shape", "dtype", "added", "removed")]
    rest_keys = [k for k in set(keys_a) | set(keys_b) if k not in involved]
    if shaped:
        what = "; ".join(_param_change(p) for p in shaped[:3])
        out.append(_item(f"inputs of `{module}` changed ({what}): its ops do "
                         f"{'more' if rest >= 0 else 'less'} work ({_fmt(rest)} per step)",
                         "shape_change", rest, total, [
                             *(_digest_cite(pa, module, f"parameters[{p['index']}].shape")
                               for p in shaped[:2]),
                             *(_digest_cite(pb, module, f"parameters[{p['index']}].shape")
                               for p in shaped[:2]),
                             *_op_cites(pa, pb, rest_keys, 2)], module=module))
    elif rest_keys or abs(rest) > 0:
        out.append(_item(f"the other ops of the recompiled `{module}` ({_fmt(rest)} per step)",
                         "recompile", rest, total, [
                             _digest_cite(pa, module, "fingerprint"),
                             _digest_cite(pb, module, "fingerprint"),
                             *_op_cites(pa, pb, rest_keys, 3)], module=module))
    return out


def _waiting(p: Profile, op: str) -> str:
    """", mostly waiting for host2 (97% of it on B)" when `op` is a collective whose time on
    side `p` is mostly waiting for the last host (analysis.json `hosts`): a slower
    collective in a pod is usually a late host, not a slower transfer."""
    hosts = p.side.analysis.get("hosts") if isinstance(p.side.analysis, Mapping) else None
    if not isinstance(hosts, Mapping):
        return ""
    ops = (hosts.get("collective_split") or {}).get("ops") or []
    row = next((r for r in ops if isinstance(r, Mapping) and r.get("op") == op), None)
    share = row.get("wait_percent") if row else None
    if not isinstance(share, int | float) or share < 50:
        return ""
    late = [str(s.get("host")) for s in hosts.get("stragglers") or [] if isinstance(s, Mapping)]
    return (f", {share:.0f}% of it on {p.name} waiting for "
            + (" and ".join(late) if late else "the last host to arrive") + ", not transfer")


def _time(p: Profile, module: str, names: Sequence[str]) -> float:
    return sum(p.ops[(module, n)].value for n in names if (module, n) in p.ops)


def _lines(wheres: Sequence[str]) -> str:
    """`a.py:12`, `a.py:12–14` (consecutive lines of one file), `a.py:12, 19`, else the first
    two places."""
    found = list(dict.fromkeys(w for w in wheres if w))
    files = {w.rpartition(":")[0] for w in found}
    numbers = sorted({int(w.rpartition(":")[2]) for w in found
                      if w.rpartition(":")[2].isdigit()})
    if len(files) == 1 and numbers and len(numbers) == len(set(found)):
        head = f"{files.pop()}:"
        if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 1:
            return f"{head}{numbers[0]}–{numbers[-1]}"
        return head + ", ".join(str(n) for n in numbers[:4]) + (" …" if len(numbers) > 4
                                                                 else "")
    return ", ".join(found[:2]) + (" …" if len(found) > 2 else "")


def _names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _group_item(pa: Profile, pb: Profile, module: str, group: Mapping[str, Any],
                total: float | None) -> dict[str, Any]:
    """One regrouped set of ops (`pairing.Group`) as a change."""
    a, b = list(group.get("a") or []), list(group.get("b") or [])
    added = [tuple(x) for x in group.get("atoms_added") or []]
    removed = [tuple(x) for x in group.get("atoms_removed") or []]
    retyped = [tuple(x) for x in group.get("dtype_changed") or []]
    added_ops = {x[0] for x in added}
    became = f"{_names(a)} became {_names(b)}" if (a, b) != (b, a) or len(a) != 1 else (
        f"{_names(a)} changed")
    delta = _time(pb, module, b) - _time(pa, module, a)
    facts_b = {str(i.get("name")): i for i in (pb.digests.get(module) or {}).get("op_info")
               or [] if isinstance(i, Mapping)}
    if added_ops & DATA_MOVEMENT:
        kind = "layout_change"
        moved = [x for x in added if x[0] in DATA_MOVEMENT]
        what = "transpose" if any(x[0] == "transpose" for x in moved) else "copy"
        movers = {n for n in b if any(at[0] in DATA_MOVEMENT and tuple(at) in added
                                       for at in facts_b.get(n, {}).get("atoms") or [])}
        consumer = next((n for n in b if n not in movers and any(
            at[0] in ("dot", "convolution") for at in facts_b.get(n, {}).get("atoms") or [])
            and set(facts_b.get(n, {}).get("args") or []) & movers), None)
        text = (f"materialized {what} at {_lines([x[2] for x in moved])} in `{module}`: new "
                + ", ".join(sorted({x[0] for x in moved}))
                + (f" feeding the matmul `{consumer}`" if consumer else "") + f"; {became}")
    elif retyped or "convert" in added_ops:
        kind = "dtype_change"
        converts = [x for x in added if x[0] == "convert"]
        text = f"dtype change in `{module}`"
        if converts:
            text += f": new convert at {_lines([x[2] for x in converts])}"
        if retyped:
            old, new = retyped[0][2], retyped[0][3]
            ops = ", ".join(dict.fromkeys(x[0] for x in retyped))
            text += (f"{';' if converts else ':'} {ops} at {_lines([x[1] for x in retyped])} "
                     f"now in {new} (was {old})")
        text += f"; {became}"
    elif added_ops & COLLECTIVES:
        kind = "new_collective"
        text = f"new {', '.join(sorted(added_ops & COLLECTIVES))} in `{module}`; {became}"
    elif not added and not removed:
        kind = "fusion_change"
        parts = []
        for n in b[:4]:
            atoms = facts_b.get(n, {}).get("atoms") or []
            ops = ", ".join(dict.fromkeys(str(at[0]) for at in atoms))
            lines = _lines([str(at[2]) for at in atoms if at[2]])
            parts.append(f"`{n}` ({ops}{' at ' + lines if lines else ''})")
        text = (f"fusion boundary moved in `{module}`: {_names(a)} became {len(b)} op(s): "
                + "; ".join(parts))
    else:
        kind = "new_ops" if delta >= 0 else "removed_ops"
        text = (f"`{module}` recompiled with "
                + (f"new {', '.join(sorted(added_ops))} at {_lines([x[2] for x in added])}"
                   if added else "")
                + ("; " if added and removed else "")
                + (f"without {', '.join(sorted({x[0] for x in removed}))}" if removed else "")
                + f"; {became}")
    cites: list[dict[str, Any] | None] = [
        *(_digest_cite(pb, module, f"op_info[name={n}].atoms") for n in b[:3]),
        *(_digest_cite(pa, module, f"op_info[name={n}].atoms") for n in a[:2])]
    keys = [(module, n) for n in (*a, *b)]
    return _item(text, kind, delta, total,
                 [*cites, *_op_cites(pa, pb, keys, 6)], module=module, ops_a=a, ops_b=b)


def _paired_changes(pa: Profile, pb: Profile, module: str, row: Mapping[str, Any],
                    total: float | None) -> list[dict[str, Any]]:
    """A recompiled program whose ops pair by what they compute (`pairing`): one change per
    regrouped set, the new and removed ops by signature, and the paired rest."""
    pairing = row["pairing"]
    params = list(row.get("parameters") or [])
    layout_changed = any(p["change"] == "layout" for p in params)
    sig_a = dict((pa.digests.get(module) or {}).get("ops") or {})
    sig_b = dict((pb.digests.get(module) or {}).get("ops") or {})
    out = [_group_item(pa, pb, module, g, total) for g in pairing.get("groups") or []]
    for names, sigs, added in ((pairing.get("new") or [], sig_b, True),
                               (pairing.get("removed") or [], sig_a, False)):
        by_sig: dict[str, list[str]] = {}
        for n in names:
            by_sig.setdefault(sigs.get(n, "?"), []).append(n)
        for sig, ops in sorted(by_sig.items()):
            p = pb if added else pa
            d = _time(p, module, ops) * (1 if added else -1)
            kind = _signature_kind(sig, added, layout_changed)
            timed = any((module, n) in p.ops for n in ops)
            text = (f"{'new' if added else 'vanished'} {_describe_sig(sig)} in `{module}` ("
                    + (", ".join(f"`{n}`" for n in ops[:3]) if timed else
                       f"{len(ops)}×, not timed") + ")")
            if kind == "layout_change":
                moved = [q for q in params if q["change"] == "layout"]
                text = (f"layout change recompiled `{module}`: "
                        + "; ".join(f"input {q['name']} {q['a']} → {q['b']}" for q in moved[:2])
                        + (", so " if moved else "") + text)
            cites = [_digest_cite(p, module, f"signatures.{sig}"),
                     *(_digest_cite(p, module, f"op_info[name={n}].atoms") for n in ops[:2])]
            if kind == "layout_change":
                cites += [_digest_cite(s, module, f"parameters[{q['index']}].shape")
                          for s in (pa, pb) for q in params[:2] if q["change"] == "layout"]
            out.append(_item(text, kind, d, total,
                             [*cites, *_op_cites(pa, pb, [(module, n) for n in ops])],
                             module=module, signature=sig, timed=timed))
    pairs = [(str(x["a"]), str(x["b"])) for x in pairing.get("pairs") or []]
    rest = _time(pb, module, [b for _, b in pairs]) - _time(pa, module, [a for a, _ in pairs])
    # Ops that ran but that no digest lists (no op_info for them): part of the rest.
    listed_a = set(sig_a)
    listed_b = set(sig_b)
    rest += (sum(o.value for (m, n), o in pb.ops.items() if m == module and n not in listed_b)
             - sum(o.value for (m, n), o in pa.ops.items() if m == module and n not in listed_a))
    shaped = [q for q in params if q["change"] in ("shape", "dtype", "added", "removed")]
    keys = [(module, n) for a, b in pairs for n in (a, b)]
    renamed = sum(1 for a, b in pairs if a != b)
    if shaped:
        what = "; ".join(_param_change(q) for q in shaped[:3])
        out.append(_item(f"inputs of `{module}` changed ({what}): its ops do "
                         f"{'more' if rest >= 0 else 'less'} work ({_fmt(rest)} per step)",
                         "shape_change", rest, total, [
                             *(_digest_cite(pa, module, f"parameters[{q['index']}].shape")
                               for q in shaped[:2]),
                             *(_digest_cite(pb, module, f"parameters[{q['index']}].shape")
                               for q in shaped[:2]),
                             *_op_cites(pa, pb, keys, 2)], module=module))
    elif pairs or abs(rest) > 0:
        out.append(_item(
            f"the other ops of the recompiled `{module}`: {len(pairs)} paired by what they "
            f"compute" + (f" ({renamed} renamed)" if renamed else "")
            + f", with no change in their HLO ({_fmt(rest)} per step)",
            "recompile", rest, total, [_digest_cite(pa, module, "fingerprint"),
                                       _digest_cite(pb, module, "fingerprint"),
                                       *_op_cites(pa, pb, keys, 3)], module=module))
    return out


def _param_change(p: Mapping[str, Any]) -> str:
    if p["change"] == "added":
        return f"new input {p['name']} {p['b']}"
    if p["change"] == "removed":
        return f"input {p['name']} {p['a']} no longer passed"
    return f"{p['name']} {p['a']} → {p['b']}{_ratio(p)}"


def _ratio(param: Mapping[str, Any]) -> str:
    from mldiag.analysis.collection.hlo.text import parse_shape

    a, b = parse_shape(str(param.get("a"))), parse_shape(str(param.get("b")))
    if a.dims and b.dims and len(a.dims) == len(b.dims) and a.element_count:
        changed = [(x, y) for x, y in zip(a.dims, b.dims, strict=True) if x != y]
        if len(changed) == 1 and changed[0][0]:
            factor = changed[0][1] / changed[0][0]
            return f", ×{factor:g} along one dimension"
    return ""


def _fmt(ms: float, unit: str = MS_PER_STEP) -> str:
    if unit == PERCENT:
        return f"{ms:+.2f} points"
    return f"{ms:+.2f} ms"


def explain(pa: Profile, pb: Profile, hlo: Mapping[str, Any]
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ranked changes (largest |delta| first, at most 10) and what they leave
    unattributed, for `b` against `a` with the diff's `hlo` section."""
    ms = pa.unit == MS_PER_STEP and pb.unit == MS_PER_STEP
    if ms:
        assert pa.step_ms is not None and pb.step_ms is not None
        total: float | None = pb.step_ms - pa.step_ms
    else:
        total = None
    items: list[dict[str, Any]] = []
    # Waiting: for the host (CPU, or a device idle inside its steps).
    if ms and pa.wait_ms is not None and pb.wait_ms is not None:
        d = pb.wait_ms - pa.wait_ms
        finding = next((f for f in pb.side.analysis.get("findings") or []
                        if f.get("category") == "host_bound"), None)
        cites = [pa.cite(*pa.wait_path) if pa.wait_path else None,
                 pb.cite(*pb.wait_path) if pb.wait_path else None]
        if finding is not None:
            cites += [{"side": "B", **e} for e in finding.get("evidence") or []
                      if e.get("tool") not in ("get_step_trace", TIMELINE)][:4]
        culprit = _host_culprit(finding)
        items.append(_item(
            ("the device waits " + ("longer" if d >= 0 else "less") + " for the host each step "
             f"({pa.wait_ms:.2f} → {pb.wait_ms:.2f} ms): input pipeline or host-side work"
             + (f", in {culprit}" if culprit else "")),
            "host_wait", d, total, cites))
    elif not ms and pa.idle_percent is not None and pb.idle_percent is not None:
        d = pb.idle_percent - pa.idle_percent
        items.append(_item(f"device idle {pa.idle_percent:.2f}% → {pb.idle_percent:.2f}% of "
                           "device time", "device_idle", d, None, []))
    if device_changed(pa, pb):
        if ms and pa.busy_ms is not None and pb.busy_ms is not None:
            d = pb.busy_ms - pa.busy_ms
            items.append(_item(f"device time on {pb.device_type} instead of {pa.device_type} "
                               f"({_fmt(d)} per step): not comparable op by op",
                               "device_type_change", d, total, []))
    elif pa.ops and pb.ops:
        rows = {m["module"]: m for m in hlo.get("modules") or []}
        for module in sorted(pa.modules() | pb.modules()):
            if module not in pa.modules():
                keys = [k for k in pb.ops if k[0] == module]
                items.append(_item(f"new program `{module}` ran in the steps "
                                   f"({_fmt(pb.module_time(module), pb.unit)})", "new_program",
                                   pb.module_time(module), total, _op_cites(pa, pb, keys),
                                   module=module))
            elif module not in pb.modules():
                keys = [k for k in pa.ops if k[0] == module]
                items.append(_item(f"program `{module}` no longer runs in the steps",
                                   "removed_program", -pa.module_time(module), total,
                                   _op_cites(pa, pb, keys), module=module))
            else:
                items += _module_changes(pa, pb, module, rows.get(module, {}), total)
    # What did not move is no change; a new or vanished op that no op time covers still is.
    items = [i for i in items if abs(i["delta_ms"]) >= NEGLIGIBLE or i["kind"] in _STRUCTURAL]
    for item in items:
        if not ms:
            item["delta_points"] = item.pop("delta_ms")
            item["delta_ms"] = None
    key = "delta_ms" if ms else "delta_points"
    items.sort(key=lambda i: -abs(i[key] or 0.0))
    listed = items[:MAX_EXPLANATION]
    rest = sum(i[key] or 0.0 for i in items[MAX_EXPLANATION:])
    accounted = sum(i[key] or 0.0 for i in listed)
    unattributed: dict[str, Any] = {"smaller_changes": round(rest, 4),
                                    "smaller_changes_count": len(items) - len(listed)}
    if total is not None:
        left = total - accounted - rest
        unattributed.update(delta_ms=round(left, 4),
                            share_of_delta=round(left / total, 4) if total else None,
                            note="busy time the op times do not cover (XLA runtime) and "
                                 "rounding" if abs(left) > 1e-3 else "")
    for rank, item in enumerate(listed, 1):
        item["rank"] = rank
    return listed, unattributed


def _host_culprit(finding: Mapping[str, Any] | None) -> str:
    """The host-side event a host-bound finding names (`time sleep`, a loader), if any."""
    for e in (finding or {}).get("evidence") or []:
        if e.get("tool") == "aggregate_xplane_events" and str(e.get("field")).endswith(".event"):
            value = str(e.get("value") or "").lstrip("$")
            if value:
                return f"`{value}`"
    return ""
