"""Findings of the HLO detectors: one op, one finding.

The `layout_copy`, `unfused_reshape` and `convert_reduce` rules (`rules/`) each name a
detector tool. An op that several detectors flag, or a chain of ops, is one hypothesis that
names every cause, led by the costliest, so their hypotheses are raised together, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of

DETECTOR_P0_PERCENT = 10.0
DETECTOR_P1_PERCENT = 3.0
MATERIAL_DETECTOR_PERCENT = 1.0


def hypotheses(snapshot: Mapping[str, Any],
               detectors: Mapping[str, tuple[str, str]]) -> list[Hypothesis]:
    """One hypothesis per executing op, with every detector's cause for it.

    `detectors`: each HLO detector tool → (its finding category, the label its titles use),
    in the order their detections are read."""
    label_of = dict(detectors.values())
    groups: dict[tuple[str, str], list[tuple[str, int, Mapping[str, Any]]]] = {}
    for tool in detectors:
        found = ev.get(snapshot, tool, "detections", []) or []
        for i, d in enumerate(found):
            if d.get("executed_in_profile") is False:
                continue
            groups.setdefault((str(d.get("module")), str(d.get("instruction"))), []).append(
                (tool, i, d))

    # A link of a chain is part of the chain's finding, not one of its own.
    for key in list(groups):
        for _, _, d in list(groups.get(key, [])):
            for member in d.get("chain") or ():
                other = (key[0], str(member))
                if other != key and other in groups:
                    groups[key] += groups.pop(other)

    def pct_of(d: Mapping[str, Any]) -> float | None:
        return ev.number(d.get("percent_of_step"))

    ranked = sorted(groups.values(), key=lambda g: -max(pct_of(d) or 0.0 for _, _, d in g))
    out = []
    per_category: dict[str, int] = {}
    for group in ranked:
        # The cause that costs most leads (a chain's sum beats its first link alone).
        tool, i, d = max(group, key=lambda t: pct_of(t[2]) or 0.0)
        category = detectors[tool][0]
        rank = per_category.get(category, 0)
        if rank >= 3:
            continue
        pct = pct_of(d)
        if pct is None:
            priority = "P2"
        else:
            # A fused transpose's share is its whole fusion's, an upper bound: below 1% it
            # is noise even when it is the only one.
            if pct < MATERIAL_DETECTOR_PERCENT and (rank > 0 or d.get("fused_with")):
                continue
            priority = priority_of(pct, DETECTOR_P0_PERCENT, DETECTOR_P1_PERCENT)
            if d.get("fused_with") and priority == "P0":
                priority = "P1"  # the fusion's whole time bounds the transpose's, above
        per_category[category] = rank + 1
        fields = ["instruction", "module", "input_shape", "output_shape", "input_layout",
                  "output_layout", "time_ms", "percent_of_step"]
        # The detectors are mldiag's own passes: cited as `mldiag.<detector>`.
        proof = [ev.cite(snapshot, ev.PASS_PREFIX + tool, f"detections[{i}].{f}")
                 for f in fields if f in d]
        for k, link in enumerate(d.get("links") or []):
            if link.get("time_ms") is not None:
                proof.append(ev.cite(snapshot, ev.PASS_PREFIX + tool,
                                     f"detections[{i}].links[{k}].time_ms"))
        causes = [{"category": detectors[t][0], "tool": t, "index": j,
                   "description": x.get("description", "")} for t, j, x in group]
        for other_tool, j, _ in group:
            if other_tool != tool:
                proof.append(ev.cite(snapshot, ev.PASS_PREFIX + other_tool,
                                     f"detections[{j}].instruction"))
        labels = list(dict.fromkeys(label_of[c["category"]] for c in causes))
        fused = list(d.get("fused_with") or ())
        if fused and tool == "detect_layout_mismatch_copies":
            labels[0] = f"Transpose fused into the {'/'.join(fused[:3])} kernel"
        # Without steps the op's time is a share of the capture window, not of a step.
        window = d.get("share_of") == "capture window"
        unit = "% of device time" if window else "% of step"
        share = (f"{pct:.1f}{unit}" if pct is not None else "time not measured")
        links = len(d.get("chain") or ())
        what = f"{links}-link chain from {d.get('instruction')}" if links > 1 else str(
            d.get("instruction"))
        out.append(Hypothesis(
            category=category, priority=priority,
            title=f"{' and '.join(labels)}: {what} ({share})",
            evidence=proof,
            impact=impact_of(pct, unit,
                           f"{d.get('time_ms')} ms ({share}"
                           + (" over the capture window" if window else "")
                           + f") spent in {what}"
                           + (", the whole fusion's time: an upper bound on the transpose's"
                              if fused else "") if pct is not None else
                           "not found on the timeline; impact not measured"),
            details={"detection": d, "tool": tool, "index": i, "causes": causes,
                     "estimate": bool(fused)},
        ))
        if fused and pct is not None:
            out[-1].impact["upper_bound"] = True
    return out
