"""Each HLO instruction's place in the user's code, read from xprof's HLO protos."""

from __future__ import annotations

import shutil
from pathlib import Path

from mldiag.analysis.collection.hlo.meta import module_sources, sources
from mldiag.analysis.judgement.summary import _first_sentence
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.fixtures import team_fixture


def test_sources_come_from_the_hlo_protos_of_the_tpu_fixture(tmp_path: Path) -> None:
    team_fixture(TPU)
    run_dir = tmp_path / "plugins/profile/s1"
    run_dir.mkdir(parents=True)
    shutil.copyfile(TPU, run_dir / TPU.name)
    from xprof.cli.internal.oss import hlo_tools

    hlo_tools.generate_hlo_protos(str(run_dir))
    found = module_sources(run_dir)
    jit_f = next(v for k, v in found.items() if k.startswith("jit_f("))
    assert jit_f["add.3"] == "host_offload_stress_test.py:29 (jit(f)/jit(main)/add)"
    assert sources(b"") == {} and sources(b"\x0a\x02\x1a\x00") == {}
    (run_dir / "broken.hlo_proto.pb").write_bytes(b"\x0a\xff\xff")
    assert "broken" not in module_sources(run_dir)


def test_the_summary_states_the_fix_s_first_sentence_whole() -> None:
    fix = ("Collapse the chain (e.g. `jnp.einsum('a.b', x)` instead; see below), or pass "
           "`dimension_numbers`. Then measure again.")
    assert _first_sentence(fix) == ("Collapse the chain (e.g. `jnp.einsum('a.b', x)` instead; "
                                    "see below), or pass `dimension_numbers`.")


def test_the_tpu_copy_finding_tells_directions_and_exposed_from_hidden(tmp_path: Path) -> None:
    from mldiag.analysis.engine import analyze

    team_fixture(TPU)
    a = analyze(TPU, tmp_path).analysis
    (copy,) = [f for f in a["findings"] if f["category"] == "data_transfer"]
    assert ("3 host→device (`copy-done`, `copy-done.2`, `copy-done.4`), all making the device "
            "wait at their copy-done") in copy["what"]
    assert ("`copy-done.5` make the device wait and `copy-done.1`, `copy-done.3` cost no wait "
            "at their copy-done") in copy["what"]
    # xprof's own overlap measure (compute inside each window), cited from its follow-up.
    assert "xprof's async-overlap analysis (compute running inside each start→done window): " \
        "of 2395 windows, 2386 have no compute beside them" in copy["what"]
    assert any(e["tool"] == "analyze_async_overlap" for e in copy["evidence"])
    assert any(f["tool"] == "analyze_async_overlap" and f["status"] == "DATA"
               for f in a["follow_ups"])
    assert "(`copy-done.5`)" in copy["fix"] and "copy-done.1" not in copy["fix"]
