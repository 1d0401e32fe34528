"""Instrumentation is never the bottleneck, on a real capture with the SDK: the session that
starts right after another records that one's upload and its own metric conversions, and
the analysis names the workload's host work alone (see back_to_back_workload.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mldiag.analysis.engine import analyze
from mldiag.analysis.judgement import evidence as ev

HERE = Path(__file__).resolve().parent


def test_the_sdks_own_work_is_named_as_instrumentation_not_host_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MLDIAG_HOME": str(home),
           "MLDIAG_HOST_NAME": "h0"}
    subprocess.run([sys.executable, str(HERE / "back_to_back_workload.py"), "--run", "b2b"],
                   check=True, env=env, timeout=300, capture_output=True)
    session = home / "bucket" / "b2b" / "plugins" / "profile" / "b"
    logdir = tmp_path / "logdir" / "plugins" / "profile" / "b"
    logdir.mkdir(parents=True)
    (logdir / "h0.xplane.pb").write_bytes((session / "h0.xplane.pb").read_bytes())
    result = analyze(tmp_path / "logdir", tmp_path / "out")
    (finding,) = [f for f in result.analysis["findings"] if f["category"] == "host_bound"]
    busy = finding["what"].partition("Not counted as the cause:")[0]
    assert "`time sleep`" in busy
    for sdk in ("__float__", "rmtree", "storage.py", "metrics.py", "run.py", "acquire"):
        assert sdk not in busy and sdk not in finding["fix"], sdk
    assert "Instrumentation ran" in finding["what"]
    snapshot = json.loads((tmp_path / "out" / "health_snapshot.json").read_text())
    measured = ev.get(snapshot, ev.TIMELINE, "host_instrumentation")
    frames = {f["event"].split(" ")[-1]: f for f in measured["frames"]}
    # The loss conversions ran on the SDK's metrics thread; each record is counted.
    assert frames["record"]["count"] == 8 and "_loop" in frames
    assert any(r["event"].endswith(" __float__") and r["instrumentation_ps"] > 0
               for r in measured["by_event"])
