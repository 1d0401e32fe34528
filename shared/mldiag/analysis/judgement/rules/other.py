"""other: what no other category covers: custom calls (Pallas/Mosaic kernels, library GEMMs,
fused attention, LAPACK/FFI), and xprof's own smart suggestions.

A custom call is judged as xprof knows it: one whose FLOPs xprof derives from its shapes has
an efficiency like any op, and a finding when its time at that efficiency is recoverable; one
xprof marks opaque is a note on the page (triage's `not_judged`), not a finding, unless the
call has a fix of its own (a LAPACK call whose outputs are not all read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement import op_kinds
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.readings import (
    CUSTOM_CALL_REPORT_PERCENT,
    custom_call_api,
    custom_call_share,
)
from mldiag.analysis.judgement.roofline import (
    ROOFLINE_LOW_PERCENT,
    SHAPE_DERIVED,
    RooflineOp,
    roofline_ops,
)

CATEGORY = "other"
RAISE_ORDER = 80
CUSTOM_CALL_P1_PERCENT = 50.0
# A judged custom call's recoverable share of device time (its time above its roofline).
JUDGED_CALL_P0_PERCENT = 30.0
JUDGED_CALL_P1_PERCENT = 10.0
JUDGED_CALL_MIN_PERCENT = 1.0


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot = reading.snapshot
    if ev.tool_data(snapshot, "get_roofline_model") is not None:
        # xprof knows each custom call's FLOP provenance: judge the shape-derived ones.
        return _judged_calls(snapshot) + _suggestions(snapshot)
    return _custom_calls(snapshot) + _suggestions(snapshot)


def _detector_call(snapshot: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    calls = ev.get(snapshot, ev.CUSTOM_CALLS, "custom_calls", []) or []
    return next((c for c in calls if isinstance(c, Mapping) and c.get("instruction") == name),
                {})


def _op_source(snapshot: Mapping[str, Any], op: RooflineOp) -> str:
    """`file:line` of the op from xprof's source info (its first frame), else the HLO's."""
    row = (ev.get(snapshot, "get_roofline_model", "top_operations", []) or [])[op.index]
    first = str(row.get("source_info") or "").split(" -> ")[0].strip()
    if first:
        return first
    src = str(_detector_call(snapshot, op.name).get("source") or "")
    return src.partition(" (")[0] if ".py:" in src else ""


def _judged_calls(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    """Custom calls with shape-derived FLOPs that run far below their roofline: the time above
    it is what tuning the kernel can win back."""
    out = []
    tool = "get_roofline_model"
    for op in roofline_ops(snapshot):
        eff = op.judged_efficiency_percent
        if op.provenance != SHAPE_DERIVED or eff is None or op.share_percent is None:
            continue
        recoverable = op.share_percent * (1.0 - min(eff, 100.0) / 100.0)
        if eff >= ROOFLINE_LOW_PERCENT or recoverable < JUDGED_CALL_MIN_PERCENT:
            continue
        call = _detector_call(snapshot, op.name)
        kind = op_kinds.kind_of(str(call.get("target") or ""), op.name, op.category,
                               str(call.get("source") or ""), category=op.category)
        if kind in (op_kinds.CUSTOM_CALL, op_kinds.LOOP_FUSION, op_kinds.GEMM_FUSION):
            kind = op_kinds.CUSTOM_CALL
        base = f"top_operations[{op.index}]"
        row = (ev.get(snapshot, tool, "top_operations", []) or [])[op.index]
        proof = [ev.cite(snapshot, tool, f"{base}.{f}") for f in (
            "name", "category", "flops_provenance", "total_self_time_ms",
            "total_self_time_percent", "roofline_efficiency_percent",
            "compute_efficiency_percent", "source_info") if row.get(f) not in (None, "")]
        per_call = ""
        if op.per_call_flops_scaled:
            per_call = (f"; xprof's {op.efficiency_percent:.2f}% counts one call's FLOPs "
                        f"against all {op.calls} calls' time, so over its calls it runs at "
                        f"{eff:.2f}%")
        label = op_kinds.LABELS[kind]
        out.append(Hypothesis(
            category="other",
            priority=priority_of(recoverable, JUDGED_CALL_P0_PERCENT, JUDGED_CALL_P1_PERCENT),
            title=(f"{label[0].upper() + label[1:]} `{op.name}` runs at {eff:.2f}% of its "
                   f"roofline ({op.share_percent:.1f}% of device time"
                   + (f", {op.calls} call{'s' if op.calls != 1 else ''}" if op.calls
                      else "") + ")"),
            evidence=proof,
            impact=impact_of(recoverable, "% of device time",
                             f"{recoverable:.1f}% of device time: `{op.name}` takes "
                             f"{op.share_percent:.1f}% and would take {eff:.2f}% of that at its "
                             f"roofline (FLOPs derived from its shapes by xprof{per_call})")
            | {"upper_bound": True},
            details={"kind": "judged_call", "op_kind": kind, "op": op.name,
                     "index": op.index, "calls": op.calls, "estimate": True,
                     # Stated in the finding ("… ms per call"): computed here, so the
                     # evidence check finds it in the triage.
                     "per_call_ms": (op.self_time_ms / op.calls
                                     if op.self_time_ms is not None and op.calls else None),
                     "source_file_line": _op_source(snapshot, op)},
        ))
    return out


def _custom_calls(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    """Custom calls without a roofline (XLA:CPU's LAPACK, FFI) that have a fix of their own:
    the calls' time that the change wins back. The others are a note (triage)."""
    found = custom_call_share(snapshot)
    if found is None:
        return []
    calls = ev.get(snapshot, ev.CUSTOM_CALLS, "custom_calls")
    timed = [i for i in found[1] if _advice(calls[i])]
    share = sum(float(calls[i]["percent_of_step"]) for i in timed)
    if not timed or share < CUSTOM_CALL_REPORT_PERCENT:
        return []
    tool = ev.CUSTOM_CALLS
    proof = []
    for i in timed[:4]:
        proof += [ev.cite(snapshot, tool, f"custom_calls[{i}].{f}")
                  for f in ("instruction", "target", "time_ms", "percent_of_step", "source")
                  if calls[i].get(f) not in (None, "")]
    window = calls[timed[0]].get("share_of") == "capture window"
    unit = "% of device time" if window else "% of step"
    names = list(dict.fromkeys(
        custom_call_api(str(calls[i].get("source") or ""), str(calls[i].get("linalg") or ""))
        or str(calls[i].get("target")) for i in timed))
    return [Hypothesis(
        category="other",
        # The calls' time is an upper bound on what their fixes win back: never P0, and its
        # share is counted after the measured waste.
        priority="P1" if share >= CUSTOM_CALL_P1_PERCENT else "P2",
        title=(f"Library calls ({', '.join(names[:4])}) take {share:.1f}"
               f"{unit}, and each has a cheaper form"),
        evidence=proof,
        impact=impact_of(share, unit, f"up to {share:.1f}{unit}: the time of {len(timed)} "
                         "library call(s) that a cheaper call or a hoisted one can win back"),
        details={"kind": "custom_calls", "estimate": True, "indices": timed,
                 "apis": names},
    )]


def _suggestions(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    found = ev.get(snapshot, "get_smart_suggestions", "suggestions", []) or []
    out = []
    for i, s in enumerate(found[:3]):
        if not isinstance(s, Mapping):
            continue
        text = str(s.get("suggestion") or s.get("text") or s)
        key = next(iter(s.keys()), None)
        if key is None:
            continue
        out.append(Hypothesis(
            category="other", priority="P2", title=f"XProf suggestion: {text[:120]}",
            evidence=[ev.cite(snapshot, "get_smart_suggestions", f"suggestions[{i}].{key}")],
            impact=impact_of(None, "% of step", "not quantified by XProf"),
            details={"suggestion": text},
        ))
    return out


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []

_CUSTOM_CALL_FIXES = {
    "eigh": "if only the eigenvalues are used, call `jnp.linalg.eigvalsh` (no eigenvectors); "
            "if the matrix does not change between steps, decompose it once outside the step",
    "svd": "pass `compute_uv=False` when only singular values are used and "
           "`full_matrices=False` otherwise; for the largest singular value alone, a few power "
           "iterations (`jnp.linalg.norm(a, 2)` is itself an SVD) are far cheaper",
    "solve": "for a symmetric positive definite matrix, factor with "
             "`jax.scipy.linalg.cho_factor` and solve with `cho_solve` (half the work of LU); "
             "when the matrix is reused, factor it once with `jax.scipy.linalg.lu_factor` and "
             "call `lu_solve` per right-hand side; batch right-hand sides into one call",
    "inv": "do not invert: solve with `jnp.linalg.solve` (or `cho_solve`) instead",
    "cholesky": "reuse the factor across steps when the matrix does not change",
    "qr": "use `mode='r'` when Q is not needed",
}


def _read_outputs_fix(call: Mapping[str, Any]) -> str:
    """Advice from which of a LAPACK call's outputs the program reads (HLO users): eigh's
    output 0 is the eigenvectors; gesdd's outputs 2 and 3 are U and Vᵀ."""
    read = call.get("outputs_read")
    if not isinstance(read, list):
        return ""
    linalg = str(call.get("linalg") or "")
    if linalg == "eigh":
        if 0 not in read:
            return ("the eigenvectors (output 0) are never read: call `jnp.linalg.eigvalsh`, "
                    "which does not compute them")
        return ("the eigenvectors are read, so `eigvalsh` would not do; if the matrix does not "
                "change between steps, decompose it once outside the step, and when only a few "
                "extreme eigenpairs are used, `jax.experimental.sparse.linalg.lobpcg_standard` "
                "computes just those")
    if linalg == "svd":
        if 2 not in read and 3 not in read:
            return ("only the singular values are read (U and Vᵀ, outputs 2 and 3, are not); "
                    "when only the largest is needed, a few power iterations on `a.T @ a` are "
                    "far cheaper than a full SVD")
        return ("U or Vᵀ is read: use `full_matrices=False` (the thin SVD) unless the full "
                "bases are needed")
    return ""


def _advice(call: Mapping[str, Any]) -> str:
    """A LAPACK call's own fix: from the outputs the program reads, else its API's."""
    api = custom_call_api(str(call.get("source") or ""), str(call.get("linalg") or ""))
    return (_read_outputs_fix(call) or _CUSTOM_CALL_FIXES.get(api)
            or _CUSTOM_CALL_FIXES.get(str(call.get("linalg") or "")) or "")


def _judged_call_finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    d = h.details
    row = (ev.get(ctx.snapshot, "get_roofline_model", "top_operations", []) or [])[d["index"]]
    self_ms = ev.number(row.get("total_self_time_ms"))
    calls = d.get("calls")
    per_call_ms = self_ms / calls if self_ms is not None and calls else None
    extra = []
    groups = ev.get(ctx.snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for cat, rows in groups.items():
        for i, r in enumerate(rows):
            if str(r.get("name", "")).split("/")[-1] == d["op"] and r.get("occurrences"):
                extra.append(ev.cite(ctx.snapshot, "get_hlo_op_profile",
                                     f"grouped_operations.{cat}[{i}].occurrences"))
                break
        if extra:
            break
    label = op_kinds.LABELS[d["op_kind"]]
    what = (f"`{d['op']}` is a {label} (xprof op category `{row.get('category')}`) whose FLOPs "
            f"xprof derives from its operand shapes (flops_provenance={SHAPE_DERIVED}), so it "
            "is judged like any op: " + h.impact["text"].split(": ", 1)[-1] + ".")
    if calls and per_call_ms is not None:
        what += (f" It ran {calls} time{'s' if calls != 1 else ''}, {per_call_ms:.3g} ms per "
                 "call.")
    fix = op_kinds.custom_call_fix(d["op_kind"], d["op"], d.get("source_file_line") or "",
                                   per_call_ms, calls)
    return finding_of(h, what, fix, extra)


def _custom_calls_finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    calls = ev.get(ctx.snapshot, ev.CUSTOM_CALLS, "custom_calls", []) or []
    unit = str(h.impact.get("unit"))
    rows = []
    for i in h.details.get("indices", [])[:4]:
        c = calls[i]
        src = str(c.get("source") or "")
        where = src.partition(" (")[0] if ".py:" in src else ""
        rows.append((c, custom_call_api(src, str(c.get("linalg") or "")), where))
    listed = "; ".join(
        f"`{c['instruction']}` (custom call `{c.get('target')}`, from `{api}`"
        + (f" at `{where}`" if where else "") + f"): {c.get('time_ms')} ms, "
        f"{float(c['percent_of_step']):.1f}{unit}" for c, api, where in rows)
    what = (f"{h.impact.get('value')}{unit} runs in library calls: {listed}. XLA treats each "
            "as an opaque library call it cannot fuse with its neighbours; what each call "
            "computes, and which of its outputs the program reads, says how to make it "
            "cheaper.")
    fixes: list[str] = []
    for c, api, where in rows:
        advice = _advice(c)
        if advice and not any(f.startswith(f"`{api}`") for f in fixes):
            fixes.append(f"`{api}`" + (f" at `{where}`" if where else "") + f": {advice}")
    fix = "Make the library calls cheaper or rarer, biggest first: " + "; ".join(fixes) + "."
    return finding_of(h, what, fix)


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    if h.details.get("kind") == "custom_calls":
        return _custom_calls_finding(h, ctx)
    if h.details.get("kind") == "judged_call":
        return _judged_call_finding(h, ctx)
    text = str(h.details.get("suggestion") or h.title)
    return finding_of(h, text, "Follow XProf's suggestion above; see the evidence for the metric.")
