"""Regression explanation: what changed between two analysed sessions, and how much of the
step-time delta each change accounts for (`mldiag diff`, and every alert-triggered report).

`build_diff(a, b)` compares two sides (`diff_sides.Side`: a health snapshot and its
analysis.json) and returns the diff.json document:

- `kpis`: step time (with its spread and whether the change exceeds run-to-run variation),
  host wait, the compute / communication / host shares, device idle, peak memory, roofline;
- `ops`: per-step op time deltas by module, with the ops that appeared and vanished;
- `kernels`: kernel time deltas, where kernel statistics exist (xprof's `diff_sessions`, or
  the investigations' `get_kernel_stats` follow-ups);
- `hlo`: modules whose fingerprint changed: entry parameters whose shape or layout changed,
  op signatures added and removed;
- `findings`: new, resolved, and changed priority;
- `config`: run configs, framework, xprof and mldiag versions, device type, host count;
- `hosts`: when both sides are pods (analysis.json `hosts`), host by host: step, lateness and
  waits before and after, and the stragglers that appeared or went away (`diff.hosts`);
- `explanation`: one ranked list `{change, kind, delta_ms, share_of_delta, evidence}`, the
  largest first, whose deltas add up to the step-time delta with `unattributed`;
- `comparability`: what differs in kind between the two (device type, hosts, step markers,
  step names, op sources, HLO digests, versions) and what it means for the rest.

The explanation (`diff_explain`) follows the step: host wait, then each program's ops.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import mldiag
from mldiag.analysis.diff import hosts, pairing, stats
from mldiag.analysis.diff.explain import NEGLIGIBLE, explain
from mldiag.analysis.diff.sides import (
    PERCENT,
    Profile,
    Side,
    device_changed,
    is_collective,
    noise_ms,
    profile,
)
from mldiag.analysis.judgement import evidence as ev

DIFF_SCHEMA_VERSION = "1.0"
TOP_OPS = 15
_PRIORITY = {"P0": 0, "P1": 1, "P2": 2}

__all__ = ["DIFF_SCHEMA_VERSION", "Side", "build_diff"]


def build_diff(a: Side, b: Side, *, xprof_diff: Mapping[str, Any] | None = None
               ) -> dict[str, Any]:
    """The diff.json document of `b` against `a` (a: before, the baseline; b: after).

    `xprof_diff` is xprof's own `diff_sessions` output for the same two profiles, when it was
    run (it needs the raw profiles): its kernel diff then fills `kernels`."""
    pa, pb = profile(a, "A"), profile(b, "B")
    if pa.unit != pb.unit:
        # One side has no steps: both in % of device time.
        pa.as_percent()
        pb.as_percent()
    notes = _comparability(pa, pb)
    hlo = _hlo(pa, pb)
    explanation, unattributed = explain(pa, pb, hlo)
    doc: dict[str, Any] = {
        "schema_version": DIFF_SCHEMA_VERSION,
        "a": _describe(pa), "b": _describe(pb),
        "unit": pa.unit if pa.unit == pb.unit else PERCENT,
        "comparability": {"level": _level(notes), "notes": notes},
        "kpis": _kpis(pa, pb),
        "ops": _ops(pa, pb),
        "kernels": _kernels(pa, pb, xprof_diff),
        "hlo": hlo,
        "findings": _findings(pa, pb),
        "config": _config(pa, pb),
        "explanation": explanation,
        "unattributed": unattributed,
        "xprof_version": b.snapshot.get("xprof_version"),
        "mldiag_version": mldiag.__version__,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    pods = hosts.host_diff(a.analysis.get("hosts"), b.analysis.get("hosts"))
    if pods is not None:
        doc["hosts"] = pods
    doc["headline"] = headline(doc)
    return doc


# ---------------------------------------------------------------- sides and comparability


def _describe(p: Profile) -> dict[str, Any]:
    session = p.snapshot.get("session") or {}
    return {"label": p.side.label, "run": session.get("run"), "session": session.get("session"),
            "version": session.get("version"), "path": session.get("path"),
            "status": p.side.analysis.get("status"), "device_type": p.device_type or None,
            "hosts": p.hosts, "steps": p.steps, "source": p.side.source,
            "analyzed_at": (p.side.analysis.get("session") or {}).get("analyzed_at"),
            "capture": session.get("capture") or {}}


def _note(aspect: str, a: Any, b: Any, consequence: str) -> dict[str, Any]:
    return {"aspect": aspect, "a": a, "b": b, "consequence": consequence}


def _comparability(pa: Profile, pb: Profile) -> list[dict[str, Any]]:
    """What differs in kind between the sides, and what cannot be compared because of it."""
    notes = []
    if pa.device_type and pb.device_type and pa.device_type != pb.device_type:
        notes.append(_note("device type", pa.device_type, pb.device_type,
                           "ops, kernels and HLO compiled for different devices are not the "
                           "same work: only step-level figures are compared, and the device "
                           "time is one change"))
    if pa.hosts and pb.hosts and pa.hosts != pb.hosts:
        notes.append(_note("hosts", pa.hosts, pb.hosts,
                           "per-step figures are averages over each side's hosts; a host "
                           "missing on one side shifts them"))
    for p, other in ((pa, pb), (pb, pa)):
        if p.step_ms is None and other.step_ms is not None:
            notes.append(_note("step markers", "present" if p is pb else "absent",
                               "present" if p is pa else "absent",
                               f"{p.name} has no step markers, so step times cannot be "
                               "compared: the explanation ranks changes in their share of "
                               "device time instead"))
    if pa.step_ms is None and pb.step_ms is None:
        notes.append(_note("step markers", "absent", "absent",
                           "neither side has step markers: the explanation ranks changes in "
                           "their share of device time over each capture"))
    if pa.step_names and pb.step_names and set(pa.step_names) != set(pb.step_names):
        notes.append(_note("step names", ", ".join(pa.step_names), ", ".join(pb.step_names),
                           "the two captures annotate different steps: a step of one may not "
                           "be the same work as a step of the other"))
    for p in (pa, pb):
        if 0 < p.steps < 3:
            notes.append(_note(f"steps of {p.name}", pa.steps, pb.steps,
                               f"{p.name} has {p.steps} step(s): run-to-run variation cannot "
                               "be estimated, so no delta is judged significant"))
    if pa.op_source and pb.op_source and pa.op_source != pb.op_source:
        notes.append(_note("op times", pa.op_source, pb.op_source,
                           "op times come from different sources on the two sides"))
    for p in (pa, pb):
        if not p.has_digests:
            notes.append(_note(f"HLO of {p.name}", pa.has_digests, pb.has_digests,
                               f"no HLO digests on {p.name} ({p.digest_gap}): whether a "
                               "program recompiled cannot be told"))
    va, vb = pa.snapshot.get("xprof_version"), pb.snapshot.get("xprof_version")
    if va and vb and va != vb:
        notes.append(_note("xprof version", va, vb,
                           "the tool outputs were converted by different xprof versions"))
    common = pa.modules() & pb.modules()
    if pa.ops and pb.ops and not common and not device_changed(pa, pb):
        notes.append(_note("programs", sorted(pa.modules())[:5], sorted(pb.modules())[:5],
                           "no program ran on both sides: the two captures run different "
                           "code"))
    return notes


def _level(notes: Sequence[Mapping[str, Any]]) -> str:
    aspects = {n["aspect"] for n in notes}
    if "device type" in aspects or "programs" in aspects:
        return "step level only"
    return "partial" if notes else "full"


# ---------------------------------------------------------------- KPIs


def _delta(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    d = b - a
    return round(d, 4), (round(100.0 * d / a, 2) if a else None)


def _kpi(name: str, unit: str, a: float | None, b: float | None,
         evidence: Sequence[dict[str, Any] | None], **extra: Any) -> dict[str, Any]:
    d, pct = _delta(a, b)
    return {"name": name, "unit": unit, "a": _r(a), "b": _r(b), "delta": d,
            "delta_percent": pct, "evidence": [e for e in evidence if e], **extra}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _shares(p: Profile) -> dict[str, float | None]:
    """Host, communication and compute shares of the step, in percent."""
    if p.step_ms and p.wait_ms is not None and p.busy_ms is not None:
        comm = sum(o.value for o in p.ops.values() if is_collective(o.kind))
        host = 100.0 * p.wait_ms / p.step_ms
        comm_pct = 100.0 * comm / p.step_ms if p.ops else None
        compute = 100.0 * p.busy_ms / p.step_ms - (comm_pct or 0.0)
        return {"host": host, "communication": comm_pct, "compute": compute}
    idle = p.idle_percent
    comm_share = (sum(o.value for o in p.ops.values() if is_collective(o.kind))
                  if p.unit == PERCENT and p.ops else None)
    busy = 100.0 - idle if idle is not None else None
    return {"host": idle, "communication": comm_share,
            "compute": busy - (comm_share or 0.0) if busy is not None else None}


def variation(pa: Profile, pb: Profile) -> dict[str, Any]:
    """Whether the step-time change exceeds run-to-run variation: the Mann-Whitney U test on
    both sides' per-step times (`stats`), or, without 3 step times a side, two standard errors
    of the difference of the means."""
    test = stats.mann_whitney(pa.step_samples, pb.step_samples)
    if test is not None:
        return {**test, "samples": "get_step_trace step_breakdown[*].step_time_ms"}
    noise = noise_ms(pa, pb)
    d, _ = _delta(pa.step_ms, pb.step_ms)
    return {"test": "two standard errors of the difference of the mean step times",
            "method": "no per-step times on both sides (3 or more each)",
            "a_steps": pa.steps, "b_steps": pb.steps, "noise_ms": _r(noise, 3),
            "significant": (abs(d) > noise) if d is not None and noise is not None else None}


def _kpis(pa: Profile, pb: Profile) -> list[dict[str, Any]]:
    out = []
    noise = noise_ms(pa, pb)
    judged = variation(pa, pb) if pa.step_ms is not None and pb.step_ms is not None else None
    out.append(_kpi(
        "step time", "ms", pa.step_ms, pb.step_ms,
        [p.cite(*p.step_path) for p in (pa, pb) if p.step_path],
        a_stddev=_r(pa.step_sd), b_stddev=_r(pb.step_sd), a_steps=pa.steps, b_steps=pb.steps,
        noise_ms=_r(noise, 3), significant=judged["significant"] if judged else None,
        variation=judged))
    out.append(_kpi("host wait per step", "ms", pa.wait_ms, pb.wait_ms,
                    [p.cite(*p.wait_path) for p in (pa, pb) if p.wait_path]))
    sa, sb = _shares(pa), _shares(pb)
    for key, label in (("host", "host share (device waiting)"),
                       ("communication", "communication share"),
                       ("compute", "compute share")):
        out.append(_kpi(label, "% of step", sa[key], sb[key], []))
    out.append(_kpi("device idle", "%", pa.idle_percent, pb.idle_percent, [],
                    a_source=pa.metrics.get("device_idle_source"),
                    b_source=pb.metrics.get("device_idle_source")))
    for key, label, unit in (("peak_memory_gib", "peak memory", "GiB"),
                             ("roofline_efficiency_percent", "roofline efficiency", "%")):
        out.append(_kpi(label, unit, ev.number(pa.metrics.get(key)),
                        ev.number(pb.metrics.get(key)), []))
    return out


def kpi(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """One KPI of a diff document by name (empty when absent)."""
    return next((k for k in doc.get("kpis") or [] if k.get("name") == name), {})


# ---------------------------------------------------------------- ops and kernels


def _ops(pa: Profile, pb: Profile) -> dict[str, Any]:
    if device_changed(pa, pb):
        return {"unit": None, "changed": [], "new": [], "vanished": [],
                "note": "not compared: the sides ran on different device types"}
    if not pa.ops or not pb.ops:
        missing = [p.name for p in (pa, pb) if not p.ops]
        return {"unit": None, "changed": [], "new": [], "vanished": [],
                "note": f"no per-op times on {' and '.join(missing)} (no op profile, and no "
                        "XLA:CPU timeline with steps)"}
    rows: list[dict[str, Any]] = []
    for key in set(pa.ops) | set(pb.ops):
        oa, ob = pa.ops.get(key), pb.ops.get(key)
        a = oa.value if oa else 0.0
        b = ob.value if ob else 0.0
        either = ob or oa
        rows.append({"module": key[0], "op": key[1], "kind": either.kind if either else "",
                     "a": round(a, 4), "b": round(b, 4), "delta": round(b - a, 4),
                     "status": "new" if oa is None else "vanished" if ob is None else "both"})
    rows.sort(key=lambda r: (-abs(float(r["delta"])), r["module"], r["op"]))
    return {
        "unit": pb.unit, "source": {"a": pa.op_source, "b": pb.op_source},
        "changed": [r for r in rows if r["status"] == "both"][:TOP_OPS],
        "new": [r for r in rows if r["status"] == "new"][:TOP_OPS],
        "vanished": [r for r in rows if r["status"] == "vanished"][:TOP_OPS],
        "note": ("wall time: each side's op times scaled to add up to its busy time (XLA:CPU "
                 "runs ops on several threads and devices at once)"
                 if "timeline" in (pa.op_source, pb.op_source) else
                 "each op's share of device time, times the step time"),
    }


def _follow_up_kernels(p: Profile) -> dict[str, float] | None:
    for doc in (p.side.investigation, p.side.analysis):
        for f in (doc or {}).get("follow_ups") or []:
            if f.get("tool") == "get_kernel_stats" and f.get("status") == "DATA":
                kernels = (f.get("data") or {}).get("kernels") or []
                return {str(k.get("kernel_name")): float(k.get("total_duration_us") or 0.0)
                        for k in kernels if isinstance(k, Mapping) and k.get("kernel_name")}
    return None


def _kernels(pa: Profile, pb: Profile, xprof_diff: Mapping[str, Any] | None) -> dict[str, Any]:
    if xprof_diff:
        diffs = list(xprof_diff.get("kernel_diffs") or [])
        per_step = pa.steps and pb.steps
        return {
            "available": bool(diffs), "source": "xprof diff_sessions",
            "total_device_ms": {
                "a": _us_ms(xprof_diff.get("baseline_total_device_duration_us")),
                "b": _us_ms(xprof_diff.get("optimized_total_device_duration_us")),
                "delta": _us_ms(xprof_diff.get("total_device_duration_delta_us"))},
            "kernels": [{"kernel": k.get("kernel_name"),
                         "a_ms": _us_ms(k.get("baseline_duration_us")),
                         "b_ms": _us_ms(k.get("optimized_duration_us")),
                         "delta_ms": _us_ms(k.get("delta_duration_us")),
                         "delta_ms_per_step": round(
                             float(k.get("optimized_duration_us") or 0) / 1000 / pb.steps
                             - float(k.get("baseline_duration_us") or 0) / 1000 / pa.steps, 4)
                         if per_step else None}
                        for k in diffs],
            "note": "xprof's totals are over each whole capture; per step where both sides "
                    "have steps" + ("" if diffs else ": no kernel records (kernel statistics "
                                    "exist on GPU profiles)"),
        }
    ka, kb = _follow_up_kernels(pa), _follow_up_kernels(pb)
    if ka is None or kb is None:
        missing = " and ".join(p.name for p, k in ((pa, ka), (pb, kb)) if k is None)
        return {"available": False, "source": None, "kernels": [],
                "note": f"no kernel statistics on {missing}: they exist on GPU profiles, where "
                        "the investigation calls get_kernel_stats (run `mldiag diff` on the "
                        "profile paths, or with --xprof, for xprof's full kernel diff)"}
    sa, sb = max(pa.steps, 1), max(pb.steps, 1)
    rows: list[dict[str, Any]] = []
    for name in set(ka) | set(kb):
        a_ms = round(ka.get(name, 0.0) / 1000 / sa, 4)
        b_ms = round(kb.get(name, 0.0) / 1000 / sb, 4)
        rows.append({"kernel": name, "a_ms": a_ms, "b_ms": b_ms,
                     "delta_ms": round(b_ms - a_ms, 4)})
    rows.sort(key=lambda r: -abs(float(r["delta_ms"])))
    return {"available": True, "source": "get_kernel_stats follow-ups", "kernels": rows[:20],
            "note": "the top kernels each investigation listed, ms per step; a kernel missing "
                    "on one side may only be outside its top list"}


def _us_ms(us: Any) -> float | None:
    value = ev.number(us)
    return None if value is None else round(value / 1000.0, 4)


# ---------------------------------------------------------------- HLO


def _params(da: Mapping[str, Any], db: Mapping[str, Any]) -> list[dict[str, Any]]:
    from mldiag.analysis.collection.hlo.text import parse_shape

    out = []
    pa, pb = list(da.get("parameters") or []), list(db.get("parameters") or [])
    for i in range(max(len(pa), len(pb))):
        a = pa[i]["shape"] if i < len(pa) else None
        b = pb[i]["shape"] if i < len(pb) else None
        if a == b:
            continue
        change = "added" if a is None else "removed" if b is None else "shape"
        if a is not None and b is not None:
            sa, sb = parse_shape(a), parse_shape(b)
            if sa.dtype == sb.dtype and sa.dims == sb.dims:
                change = "layout"
            elif sa.dtype != sb.dtype and sa.dims == sb.dims:
                change = "dtype"
        name = (pb[i] if i < len(pb) else pa[i]).get("name")
        out.append({"index": i, "name": name, "a": a, "b": b, "change": change})
    return out


def _op_changes(da: Mapping[str, Any], db: Mapping[str, Any]
                ) -> tuple[dict[str, list[str]], dict[str, list[str]], list[str]]:
    """Op signatures added and removed by a recompile, each with its instruction names, and
    the instructions kept under their name whose fusion changed.

    Instructions are matched by name first; a recompile that renumbers instructions
    (`all-reduce.7` becoming `all-reduce.9`) leaves names on both sides that pair up by
    signature, and only what is left over was added or removed. Without per-instruction
    names (a module too large for the digest) the signature counts alone are compared."""
    oa, ob = dict(da.get("ops") or {}), dict(db.get("ops") or {})
    if da.get("ops_truncated") or db.get("ops_truncated") or not (oa and ob):
        ca, cb = Counter(da.get("signatures") or {}), Counter(db.get("signatures") or {})
        return ({k: [] for k in sorted((cb - ca).elements())},
                {k: [] for k in sorted((ca - cb).elements())}, [])
    refused = sorted(n for n in oa.keys() & ob.keys() if oa[n] != ob[n])
    only_a: dict[str, list[str]] = {}
    only_b: dict[str, list[str]] = {}
    for n in sorted(oa.keys() - ob.keys()):
        only_a.setdefault(oa[n], []).append(n)
    for n in sorted(ob.keys() - oa.keys()):
        only_b.setdefault(ob[n], []).append(n)
    added, removed = {}, {}
    for sig in sorted(set(only_a) | set(only_b)):
        na, nb = only_a.get(sig, []), only_b.get(sig, [])
        if len(nb) > len(na):
            added[sig] = nb
        elif len(na) > len(nb):
            removed[sig] = na
    return added, removed, refused


def _hlo(pa: Profile, pb: Profile) -> dict[str, Any]:
    if not pa.has_digests or not pb.has_digests:
        return {"available": False, "modules": [],
                "note": "no HLO digests on " + " and ".join(
                    f"{p.name} ({p.digest_gap})" for p in (pa, pb) if not p.has_digests)}
    ran = pa.modules() | pb.modules()
    modules = []
    for base in sorted(set(pa.digests) | set(pb.digests)):
        da, db = pa.digests.get(base), pb.digests.get(base)
        row: dict[str, Any] = {"module": base, "a": da.get("module") if da else None,
                               "b": db.get("module") if db else None,
                               "ran_in_steps": base in ran}
        if da is None or db is None:
            row["status"] = "new" if da is None else "vanished"
        elif da.get("fingerprint") == db.get("fingerprint"):
            row["status"] = "unchanged"
        else:
            added, removed, refused = _op_changes(da, db)
            row.update(status="changed", a_fingerprint=da.get("fingerprint"),
                       b_fingerprint=db.get("fingerprint"), parameters=_params(da, db),
                       ops_added=added, ops_removed=removed, ops_refused=refused)
            fa, fb = pairing.facts(da), pairing.facts(db)
            if fa is not None and fb is not None:
                # Ops paired by what they compute, not by their generated names.
                row["pairing"] = pairing.pair(fa, fb).to_dict()
        modules.append(row)
    # Programs that ran in the steps first, then changes.
    order = {"changed": 0, "new": 1, "vanished": 2, "unchanged": 3}
    modules.sort(key=lambda m: (not m["ran_in_steps"], order[m["status"]], m["module"]))
    return {"available": True, "modules": modules,
            "changed": sum(1 for m in modules if m["status"] != "unchanged")}


# ---------------------------------------------------------------- findings and config


def _finding_key(f: Mapping[str, Any]) -> tuple[str, str]:
    subject = ""
    for e in f.get("evidence") or []:
        if str(e.get("field", "")).endswith((".instruction", ".op", ".kernel_name")):
            subject = str(e.get("value"))
            break
    return str(f.get("category")), subject


def _findings(pa: Profile, pb: Profile) -> dict[str, Any]:
    fa = {_finding_key(f): f for f in pa.side.analysis.get("findings") or []}
    fb = {_finding_key(f): f for f in pb.side.analysis.get("findings") or []}

    def brief(f: Mapping[str, Any]) -> dict[str, Any]:
        return {k: f.get(k) for k in ("id", "category", "priority", "title", "impact",
                                       "evidence")}

    changed = []
    for key in fa.keys() & fb.keys():
        if fa[key].get("priority") != fb[key].get("priority"):
            changed.append({**brief(fb[key]), "a_priority": fa[key].get("priority")})
    ranks = {k: _PRIORITY.get(str(f.get("priority")), 3) for k, f in {**fa, **fb}.items()}

    def by_priority(key: tuple[str, str]) -> tuple[int, tuple[str, str]]:
        return ranks[key], key

    return {
        "a_status": pa.side.analysis.get("status"), "b_status": pb.side.analysis.get("status"),
        "new": [brief(fb[k]) for k in sorted(fb.keys() - fa.keys(), key=by_priority)],
        "resolved": [brief(fa[k]) for k in sorted(fa.keys() - fb.keys(), key=by_priority)],
        "changed_priority": changed,
        "unchanged": [brief(fb[k]) for k in sorted(fa.keys() & fb.keys(), key=by_priority)
                      if fa[k].get("priority") == fb[k].get("priority")],
    }


def _environment(p: Profile) -> dict[str, Any]:
    snap = p.snapshot
    env = ev.get(snap, "get_xprof_overview", "run_environment", {}) or {}
    ctx = p.side.context
    return {"device_type": p.device_type or None, "device_cores": env.get("device_core_count"),
            "hosts": p.hosts, "host_names": (snap.get("session") or {}).get("hosts"),
            "is_training": env.get("is_training"),
            "framework": ctx.get("framework"), "platform": ctx.get("platform"),
            "xprof_version": snap.get("xprof_version"),
            "mldiag_version": snap.get("mldiag_version"),
            "run": ctx.get("run"), "run_configs": dict(ctx.get("configs") or {}),
            "capture": {k: v for k, v in ((snap.get("session") or {}).get("capture") or
                                          {}).items() if k in ("kind", "trigger")}}


def _config(pa: Profile, pb: Profile) -> dict[str, Any]:
    ea, eb = _environment(pa), _environment(pb)
    changed = []
    for key in ea:
        if key in ("run_configs", "host_names", "capture"):
            continue
        if ea[key] != eb[key] and (ea[key] is not None or eb[key] is not None):
            changed.append({"key": key, "a": ea[key], "b": eb[key]})
    ca, cb = ea["run_configs"], eb["run_configs"]
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            changed.append({"key": f"config {key}", "a": ca.get(key), "b": cb.get(key)})
    return {"a": ea, "b": eb, "changed": changed}


# ---------------------------------------------------------------- the sentence


def _test_brief(test: Any) -> str:
    """`Mann-Whitney U p=0.002, median shift +8.61 ms`, or "" without a rank test."""
    if not isinstance(test, Mapping) or test.get("p_value") is None:
        return ""
    shift = (test.get("effect") or {}).get("median_shift_ms")
    return (f"Mann-Whitney U p={test['p_value']:.2g}"
            + (f", median shift {shift:+.2f} ms" if shift is not None else ""))


def headline(doc: Mapping[str, Any]) -> str:
    """The diff in one sentence, for the verdict summary and the CLI."""
    a = doc["a"]["label"]
    step = kpi(doc, "step time")
    top = (doc.get("explanation") or [None])[0]
    notes = doc.get("comparability", {}).get("notes") or []
    device = next((n for n in notes if n["aspect"] == "device type"), None)
    lead = (f"Against {a} ({device['a']}; this is {device['b']}), " if device
            else f"Since {a}, ")
    if step.get("a") is not None and step.get("b") is not None and abs(
            step["delta"]) < NEGLIGIBLE:
        change = f"step time is unchanged ({step['b']:.2f} ms)"
    elif step.get("a") is not None and step.get("b") is not None:
        d, pct = step["delta"], step.get("delta_percent")
        moved = ("rose" if d > 0 else "fell") if step.get("significant") is not False else (
            "stayed within run-to-run variation")
        change = (f"step time {moved} from {step['a']:.2f} to {step['b']:.2f} ms "
                  f"({d:+.2f} ms" + (f", {pct:+.0f}%" if pct is not None else "") + ")")
        test = _test_brief(step.get("variation"))
        if test:
            change = change[:-1] + f"; {test})"
        if step.get("significant") is False:
            change = (f"step time stayed within run-to-run variation ({step['a']:.2f} → "
                      f"{step['b']:.2f} ms, "
                      + (test or f"noise ±{step['noise_ms']:.2f} ms") + ")")
    else:
        idle = kpi(doc, "device idle")
        missing = " and ".join(x for x in ("A", "B") if step.get(x.lower()) is None)
        why = f"no step markers on {missing}"
        change = (f"step time cannot be compared ({why})" if idle.get("a") is None
                  or idle.get("b") is None else
                  f"device idle went from {idle['a']:.1f}% to {idle['b']:.1f}% ({why} to "
                  "compare step times)")
    if top is None:
        if "cannot be compared" in change:
            return _with_stragglers(
                f"{lead}{change}, and neither the ops nor the idle time can be compared.", doc)
        return _with_stragglers(f"{lead}{change}; no change was found between the two.", doc)
    share = top.get("share_of_delta")
    amount = (f"{top['delta_ms']:+.2f} ms" if top.get("delta_ms") is not None else
              f"{top.get('delta_points', 0):+.2f} points of device time")
    part = f", {share:.0%} of the delta" if share is not None and step.get(
        "significant") is not False and 0 < share <= 2 else ""
    text = top["change"].replace("`", "")
    return _with_stragglers(f"{lead}{change}; the largest change: {text} ({amount}{part}).",
                            doc)


def _with_stragglers(said: str, doc: Mapping[str, Any]) -> str:
    """The sentence, and the stragglers that appeared or went away between two pods."""
    pods = doc.get("hosts")
    extra = hosts.sentence(pods) if isinstance(pods, Mapping) else ""
    return f"{said} {extra}" if extra else said

