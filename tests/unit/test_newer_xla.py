"""A profile from an XLA newer than xprof's HLO parser: the HLO detectors fail, and the session
says why, with the opcode and what is left unjudged, instead of "no data".

The profile is `scripts/workloads/fused_convert.py` run on jax 0.12.1 (jaxlib 0.12.1, CPU),
whose XLA emits the `fma` opcode that xprof 2.24.2's HLO parser refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mldiag.cli.main import main

PROFILE = Path(__file__).parent / "data" / "newer_xla" / "jax_0_12_1_fused_convert.xplane.pb"


def test_an_unknown_hlo_opcode_is_named_in_what_was_not_judged(tmp_path, capsys):
    session = tmp_path / "logdir" / "plugins" / "profile" / "s1"
    session.mkdir(parents=True)
    shutil.copyfile(PROFILE, session / "host0.xplane.pb")
    out = tmp_path / "out"
    assert main(["analyze", "-q", "--out", str(out), str(tmp_path / "logdir")]) == 0
    printed = capsys.readouterr().out
    snapshot = json.loads((out / "health_snapshot.json").read_text())
    detectors = [t for t in snapshot["tools"] if t.startswith("detect_")]
    assert detectors and all(snapshot["tools"][t]["status"] == "ERROR" for t in detectors)
    analysis = json.loads((out / "analysis.json").read_text())
    said = " ".join(analysis["not_judged"])
    assert "does not know the opcode `fma`" in said, said
    assert "not judged until xprof knows it" in said
    assert "unavailable in this profile" not in said
    assert "opcode `fma`" in printed
    html = (out / "summary.html").read_text()
    assert "does not know the opcode <code>fma</code>" in html
