"""The pipeline stages: plain functions `handle(message, services)`, one registry.

One module per concern; the imports point one way, from the registry down to the leaf:

- services: `Services` (what the stages need, built once by the bootstrap) and the helpers
  that fail a session or publish what follows a transition (the leaf).
- claims: the idempotency claims around a stage's work and the keep-alive of a long one.
- intake: on_profile_object, a finalized xplane registers its host in its session (creating
  run and session when the file came from outside); a complete session gets one
  AnalyzeSession.
- capture: on_degradation_alert (the run's auto-capture policy), on_capture_request (a
  capture on the run's profiler targets) and continuous (start or stop the ring).
- sessions: whether a message is still its session's current work, where its analysis
  objects live, which generations of its hosts to read.
- fanout: collect_host, one host of a many-host or large session, and where the hosts'
  shares run (one function instance each, or shared by the collect job's tasks).
- analysis: collect (the 15-tool health snapshot, then triage: OPTIMAL goes straight to the
  report, anything else to investigation; the combine of a fanned-out session;
  collect_windows for the other tasks of a collect job sharing a large host's windows or
  a fanned-out session's hosts),
  investigate (the investigator and its follow-up calls), render_report (analysis.json and
  summary.html; the session is REPORTED) and prebuild_viewer (prebuild_viewer_share for
  the other tasks of a collect job sharing its windowed hosts).
- window_shards: where the collect job's tasks share a large host's windows (StoredWindows:
  claims in the state store, windows in the bucket; window_exchange, window_count_of).
- registry: HANDLERS, the message type → stage registry; handle and dispatch route by it.
- maintenance: the sweeper (sweep, rescan, requeue_stuck) and dead_lettered.
- liveness: probe_targets, the background prober of plain profiler servers (read paths
  show its stored answers and never connect to a target).

Every stage is idempotent. Claims keyed by the event (or by session and version) make
duplicates no-ops; a transient error propagates so the bus redelivers; a permanent one
(unreadable profile, bad message) marks the session FAILED with its reason and is acknowledged.

The names below are the package's interface (`stages.handle`, `from mldiag.stages import
Services`); anything else is used, and patched in tests, in the module that defines it.
"""

from mldiag.stages.analysis import (
    collect,
    collect_windows,
    investigate,
    prebuild_viewer,
    prebuild_viewer_share,
    render_report,
)
from mldiag.stages.capture import continuous, on_capture_request, on_degradation_alert
from mldiag.stages.fanout import collect_host
from mldiag.stages.intake import on_profile_object
from mldiag.stages.liveness import probe_targets
from mldiag.stages.maintenance import dead_lettered, requeue_stuck, rescan, sweep
from mldiag.stages.registry import HANDLERS, dispatch, handle
from mldiag.stages.services import Services

__all__ = [
    "HANDLERS",
    "Services",
    "collect",
    "collect_host",
    "collect_windows",
    "continuous",
    "dead_lettered",
    "dispatch",
    "handle",
    "investigate",
    "on_capture_request",
    "on_degradation_alert",
    "on_profile_object",
    "prebuild_viewer",
    "prebuild_viewer_share",
    "probe_targets",
    "render_report",
    "requeue_stuck",
    "rescan",
    "sweep",
]
