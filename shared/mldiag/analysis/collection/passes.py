"""mldiag's own passes: their names, what each is computed from, and the follow-up calls the
timeline pass answers ahead.

The collection files each pass under the snapshot's `passes` by these names, and judgement's
evidence cites their numbers under them (`mldiag.<pass>`), never under an xprof tool a reader
could re-run. A leaf, like `registry`: the collection writes these names and judgement reads
them, so both import them from here and neither imports the other for them
(`judgement.evidence` and `judgement.followups` re-export them).
"""

from __future__ import annotations

from typing import Any

from mldiag.analysis.collection.registry import DETECTORS

PASS_PREFIX = "mldiag."
TIMELINE = "mldiag.timeline"
CUSTOM_CALLS = "mldiag.custom_calls"
ASYNC_COPIES = "mldiag.async_copies"
KERNEL_TABLE = "mldiag.kernel_table"
HLO_EXCERPT = "mldiag.hlo_excerpt"
MEMORY_ALLOCATORS = "mldiag.memory_allocators"

# mldiag's own passes whose results the snapshot holds, and what each is computed from (the
# collection writes the `from` of each run; this is what a snapshot without it says).
PASSES: dict[str, tuple[str, ...]] = {
    # keep-sorted start
    ASYNC_COPIES: ("get_hlo_text: the copy-start/copy-done pairs of each module and their "
                   "memory spaces", "get_hlo_op_profile total_self_time_ms of each copy-done "
                   "(or mldiag.timeline op times)"),
    CUSTOM_CALLS: ("get_hlo_text: the custom-call instructions of each module",
                   "get_hlo_op_profile total_self_time_ms over total_profile_time_ms (or "
                   "mldiag.timeline op times over its step time or active span)"),
    MEMORY_ALLOCATORS: ("xprof's memory_profile converter, the data of the XProf UI's "
                        "Memory Profile page (the one `xprof get_memory_profile` "
                        "summarises): per memory id, profileSummary.memoryCapacity, "
                        "peakStats and peakStatsTimePs, verbatim in bytes and as GiB",
                        "the allocator whose peak `xprof get_memory_profile` prints: the "
                        "highest peakStats.peakBytesInUse"),
    TIMELINE: ("xplane: each host's XLA execution lines (device planes, or the XLA:CPU "
               "executor threads) and step markers, read event by event",),
    # keep-sorted end
    **{f"{PASS_PREFIX}{d}": ("get_hlo_text: the HLO of each module, matched op by op",
                             "get_hlo_op_profile or mldiag.timeline op times")
       for d in DETECTORS},
}

# The host-bound follow-up: Python-tracer frames on the host plane. The timeline pass
# computes it from the events it has decoded anyway (single-host sessions), and the snapshot
# carries it in precomputed_follow_ups (xprof's aggregate_xplane_events output for these
# arguments).
HOST_PYTHON_EVENTS: dict[str, Any] = {"plane_regex": "^/host:CPU$", "event_regex": r"^\$"}
# The async-overlap follow-up as the investigator asks for it. The timeline pass computes
# it from the device lines it has decoded (collection.xspace.async_overlap), so the answer is ready
# when collection ends instead of a 15 s re-read of a 100 MB trace after it.
ASYNC_OVERLAP: dict[str, Any] = {"top_k": 10}
