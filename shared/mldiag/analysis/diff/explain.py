"""The ranked explanation of a diff: which change accounts for how many ms of the step-time
delta, each with the tool fields that measure it.

The step splits into the time the device waits for the host and its busy time, and the busy
time into each program's ops (`diff_sides`). A program with the same HLO fingerprint on both
sides that ran slower is one change. A recompiled program splits into the op signatures it
gained or lost (a new all-reduce, a layout copy), each with the time of those ops, and the
rest of its ops, which a change of its entry parameters' shapes accounts for when there is
one. The listed changes, the smaller ones and `unattributed` add up to the step-time delta.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.collection.hlo_digest import DATA_MOVEMENT, opcodes_of
from mldiag.analysis.diff.sides import (
    HLO_DIGESTS,
    MS_PER_STEP,
    PERCENT,
    Profile,
    device_changed,
    is_collective,
)

MAX_EXPLANATION = 10
# Below this (ms per step, or points of device time) a delta is no change.
NEGLIGIBLE = 0.001
# Changes that are structural (in the HLO): listed even when no op time measures them.
_STRUCTURAL = ("new_collective", "removed_collective", "layout_change", "removed_copy",
               "new_ops", "removed_ops", "shape_change", "new_program", "removed_program",
               "device_type_change")


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


def _param_change(p: Mapping[str, Any]) -> str:
    if p["change"] == "added":
        return f"new input {p['name']} {p['b']}"
    if p["change"] == "removed":
        return f"input {p['name']} {p['a']} no longer passed"
    return f"{p['name']} {p['a']} → {p['b']}{_ratio(p)}"


def _ratio(param: Mapping[str, Any]) -> str:
    from mldiag.analysis.collection.hlo import parse_shape

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
                      if e.get("tool") != "get_step_trace"][:4]
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
