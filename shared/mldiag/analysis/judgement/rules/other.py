"""other: what no other category covers: custom calls XLA cannot see into (LAPACK, cuSOLVER,
FFI), and xprof's own smart suggestions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis, impact_of
from mldiag.analysis.judgement.readings import (
    CUSTOM_CALL_REPORT_PERCENT,
    custom_call_api,
    custom_call_share,
)

CATEGORY = "other"
RAISE_ORDER = 80
CUSTOM_CALL_P1_PERCENT = 50.0


def hypotheses(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]
               ) -> list[Hypothesis]:
    return _custom_calls(snapshot) + _suggestions(snapshot)


def _custom_calls(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    """Custom calls (LAPACK, cuSOLVER, FFI): what share of the time XLA cannot see into."""
    found = custom_call_share(snapshot)
    if found is None or found[0] < CUSTOM_CALL_REPORT_PERCENT:
        return []
    share, timed = found
    calls = ev.get(snapshot, ev.CUSTOM_CALLS, "custom_calls")
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
        # A large share of opaque calls is worth the user's attention, but it measures no
        # waste: never P0, and its share is counted after the measured waste.
        priority="P1" if share >= CUSTOM_CALL_P1_PERCENT else "P2",
        title=(f"Custom calls ({', '.join(names[:4])}) take {share:.1f}"
               f"{unit}; XLA cannot fuse them and counts them as 0 FLOPs"),
        evidence=proof,
        impact=impact_of(share, unit, f"{share:.1f}{unit} runs in {len(timed)} custom call(s) "
                       "whose efficiency this profile cannot judge (no FLOP count)"),
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
    what = (f"{h.impact.get('value')}{unit} runs in custom calls: {listed}. XLA treats each "
            "as an opaque library call: it cannot fuse it with its neighbours, and its cost "
            "model counts it as 0 FLOPs, so no roofline or FLOP rate covers this time.")
    fixes: list[str] = []
    for c, api, where in rows:
        advice = _read_outputs_fix(c) or _CUSTOM_CALL_FIXES.get(api) or _CUSTOM_CALL_FIXES.get(
            str(c.get("linalg") or ""))
        if advice and not any(f.startswith(f"`{api}`") for f in fixes):
            fixes.append(f"`{api}`" + (f" at `{where}`" if where else "") + f": {advice}")
    fix = ("Make the library calls cheaper or rarer, biggest first: " + "; ".join(fixes) + "."
           if fixes else
           "Check that each custom call must run every step (hoist work on inputs that do not "
           "change out of the jitted step) and call it on batches rather than one item at a "
           "time.")
    return finding_of(h, what, fix)


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    if h.details.get("kind") == "custom_calls":
        return _custom_calls_finding(h, ctx)
    text = str(h.details.get("suggestion") or h.title)
    return finding_of(h, text, "Follow XProf's suggestion above; see the evidence for the metric.")
