"""The collection tools: one spec each, in one sorted registry.

Every property of a collection tool is in its spec, and every table that needs one is derived
from `TOOLS`: the snapshot's order (`collect.COLLECTION_TOOLS`), the `xprof` command a reader
runs to check a cited field (`collect.XPROF_CLI`) and the options the jobs call it with, the
jobs each tool is assembled from (`plan.TOOL_JOBS`), the memory the plan schedules its own jobs
by (`plan.RSS_PER_BYTE`), and the HLO detectors and their labels (`DETECTORS`,
`DETECTOR_LABELS`: judgement's evidence and the report read them). Counts are `len(TOOLS)`.
`tests/unit/test_tools_registry.py` fails when a table drifts from it.

A leaf: it imports nothing of mldiag, so judgement and the report read it without loading the
collection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class XprofCommand:
    """An `xprof` CLI command and the options the collection calls it with."""

    name: str
    options: tuple[tuple[str, int], ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        """The command line after `xprof` (before `--logdir`): what a reader runs."""
        return (self.name, *(arg for key, value in self.options
                             for arg in (f"--{key}", str(value))))

    @property
    def kwargs(self) -> dict[str, Any]:
        """The options as the in-process call (`XprofWorkspace.call`) takes them."""
        return dict(self.options)


@dataclass(frozen=True)
class ToolSpec:
    """One collection tool."""

    # Its key in the snapshot's `tools`.
    name: str
    # Its place in the snapshot, the progress lines and the report's tool table (the design's
    # order); spaced by 10, so a new tool goes between two without renumbering.
    order: int
    # The jobs (`plan.plan_jobs`, run by `jobs.py`) its result is assembled from, once all
    # are done (`collect._Assembler`); a job may serve several tools.
    jobs: tuple[str, ...]
    # The `xprof` command that prints its data for the same file, at the same paths (evidence
    # that cites it is checked against it). None: no command prints it.
    xprof: XprofCommand | None
    # The measured peak memory of the jobs this tool alone runs, per byte of xplane each
    # reads, over `plan.BASE_RSS` (keys: the job, or `<job>_saved` for its variant after the
    # op_stats build). Empty: its jobs read the saved op_stats or HLO protos and take the base.
    rss_per_byte: tuple[tuple[str, float], ...] = ()
    # An HLO detector of ours (its result is `{detections, ...}`; evidence cites it as the
    # pass `mldiag.<name>`): its heading in the report. None: not a detector.
    detector_label: str | None = None


# What the HLO detectors (and mldiag's other HLO passes) read: every module's text, and the op
# profile's (or the timeline's) op times with the module list to time what they find.
HLO_JOBS = ("hlo_texts", "op_profile", "timeline_pass", "list_hlo_modules")

TOOLS: tuple[ToolSpec, ...] = (
    # keep-sorted start
    ToolSpec("detect_layout_mismatch_copies", 90, HLO_JOBS, None,
             detector_label="Layout-mismatch copies"),
    ToolSpec("detect_unfused_reshapes", 100, HLO_JOBS, None, detector_label="Unfused reshapes"),
    ToolSpec("detect_unnecessary_convert_reduce", 110, HLO_JOBS, None,
             detector_label="Unnecessary convert → reduce"),
    ToolSpec("get_device_information", 30, ("device_information",),
             XprofCommand("get_device_information")),
    ToolSpec("get_hlo_op_profile", 80, ("op_profile",),
             XprofCommand("get_hlo_op_profile", (("top_n", 50),))),
    ToolSpec("get_hosts", 40, ("hosts",), XprofCommand("get_hosts")),
    ToolSpec("get_kpi_metrics", 20, ("kpi_metrics",), XprofCommand("get_kpi_metrics")),
    ToolSpec("get_memory_profile", 130, ("memory_profile",), XprofCommand("get_memory_profile"),
             # From the allocators' peak events alone (hosts.copies.peaks_memory_profile), found
             # one chunk of a line at a time: 0.18 GB in all for the 264 MB memory copy of a
             # 1.9 GB TPU-shaped host, where xprof's converter on the copy took 3.3 GB.
             rss_per_byte=(("memory_profile", 0.2),)),
    ToolSpec("get_peak_allocations", 140, ("peak_allocations",),
             XprofCommand("get_peak_allocations", (("limit", 10),))),
    ToolSpec("get_roofline_model", 70, ("roofline",),
             XprofCommand("get_roofline_model", (("top_n", 15),))),
    # xprof's `smart_suggestion` converter output, which no CLI command prints.
    ToolSpec("get_smart_suggestions", 60, ("smart_suggestions",), None, rss_per_byte=(
        # It builds op_stats of its own, in memory, beside the op_stats job: 1.3 GB over the
        # base on the 103 MB profile (tcmalloc), more under glibc's malloc.
        ("smart_suggestions", 16.0),
        # After the op_stats build, from the saved file and the memory copy (which keeps the
        # events it times): 314 MB at 94 MB TPU-shaped, the base's.
        ("smart_suggestions_saved", 0.5))),
    # xprof's step trace in two halves, one per worker (jobs._step_trace_half); our timeline
    # pass (`mldiag.timeline`) is filed beside it.
    ToolSpec("get_step_trace", 10, ("xprof_step_trace", "timeline_pass", "step_trace_pods"),
             XprofCommand("get_step_trace", (("limit", 50),))),
    ToolSpec("get_utilization_viewer", 50, ("utilization_viewer",),
             XprofCommand("get_utilization_viewer"),
             rss_per_byte=(("utilization_viewer", 14.0),)),
    # The overview is the op_stats job's answer: that build is every op_stats tool's, and
    # its memory is the plan's.
    ToolSpec("get_xprof_overview", 0, ("op_stats",), XprofCommand("get_overview")),
    ToolSpec("list_hlo_modules", 120, ("list_hlo_modules",), XprofCommand("list_hlo_modules")),
    # keep-sorted end
)

BY_NAME: dict[str, ToolSpec] = {tool.name: tool for tool in TOOLS}
IN_SNAPSHOT_ORDER: tuple[ToolSpec, ...] = tuple(sorted(TOOLS, key=lambda tool: tool.order))
# The HLO detectors' labels, by name, and their names.
DETECTOR_LABELS: dict[str, str] = {
    tool.name: tool.detector_label for tool in TOOLS if tool.detector_label is not None}
DETECTORS: tuple[str, ...] = tuple(DETECTOR_LABELS)
