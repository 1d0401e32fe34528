"""Evidence names who made the number: every evidence row that names an xprof tool is checked
against the raw `xprof <tool>` CLI on a fresh copy of the same file, as a reader would.

The profiles are the team's TPU and GPU fixtures and planted XLA:CPU workloads (a host-bound
loop, LAPACK custom calls). Each profile is analysed; then each raw command the evidence needs
runs once, in its own subprocess, on its own copy of the profile with its own TMPDIR (xprof's
CLI caches op_stats there and next to the trace), all side by side. A row naming an xprof tool
must find its field at the same path (list selectors allowed) with the same value, as the
report prints it. A row naming an mldiag pass (`mldiag.timeline`) must say what it was
computed from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.collect import XPROF_CLI
from mldiag.analysis.engine import analyze
from mldiag.analysis.judgement import evidence as ev
from tests.helpers.fixtures import GPU, REPO, SHARED_FIXTURES, TPU, team_fixture

WORKLOADS = REPO / "scripts" / "workloads"
XPROF = Path(sys.executable).with_name("xprof")
# Planted XLA:CPU workloads whose findings cite both xprof tools and mldiag's passes.
PLANTED = ("host_bound", "custom_calls")
# The passes a row may name: the snapshot's and the follow-ups' own tables.
KNOWN_PASSES = {*ev.PASSES, ev.KERNEL_TABLE, ev.HLO_EXCERPT}

Command = tuple[str, ...]


def _rows(analysis: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for f in analysis["findings"]:
        for row in f["evidence"]:
            yield f["title"], row


def _commands(analysis: Mapping[str, Any], tool: str) -> list[Command]:
    """The raw CLI commands whose output a row naming `tool` must be found in: the collection
    tool's (with the arguments the collection used), or each follow-up call's of that tool."""
    if tool in XPROF_CLI:
        cli = XPROF_CLI[tool]
        return [tuple(cli)] if cli else []
    out = []
    for f in analysis["follow_ups"]:
        if f["tool"] == tool and f.get("status") == "DATA" and not f.get("pass"):
            args = [a for k, v in sorted((f.get("args") or {}).items()) for a in (f"--{k}", str(v))]
            out.append((tool, *args))
    return out


def _fresh_copy(src: Path, root: Path) -> Path:
    """A writable copy of a logdir without the caches an earlier run left next to the trace."""
    dst = root / "logdir"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
        "*op_stats*", "*.hlo_proto.pb", "analysis", "*.parquet"))
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _run_raw(logdir: Path, command: Command) -> Any:
    """`xprof <command> --logdir <fresh copy>`, parsed: JSON, or {"text": ...} for a tool that
    answers in text (as mldiag records it)."""
    with tempfile.TemporaryDirectory(prefix="raw-xprof-") as tmp:
        copy = _fresh_copy(logdir, Path(tmp))
        env = {**os.environ, "TMPDIR": tmp, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run([str(XPROF), *command, "--logdir", str(copy)], env=env,
                              capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"__failed__": f"rc={done.returncode}: {done.stderr[-500:]}"}
    out = done.stdout.strip()
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return {"text": out}


def _same(stated: Any, raw: Any) -> bool:
    """The report prints a cited value verbatim (as JSON): equal, up to float noise."""
    if isinstance(stated, int | float) and isinstance(raw, int | float) and not isinstance(
            stated, bool) and not isinstance(raw, bool):
        return abs(float(stated) - float(raw)) <= 1e-9 * max(1.0, abs(float(raw)))
    return bool(json.loads(json.dumps(stated)) == json.loads(json.dumps(raw)))


def _profile_dirs(tmp: Path) -> dict[str, Path]:
    out = {name: team_fixture(SHARED_FIXTURES / name) for name in (TPU, GPU)}

    def profile(workload: str) -> tuple[str, Path]:
        logdir = tmp / f"planted_{workload}"
        subprocess.run([sys.executable, str(WORKLOADS / f"{workload}.py"), "--logdir",
                        str(logdir)], check=True, timeout=300, capture_output=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
        return f"planted_{workload}", logdir

    with ThreadPoolExecutor(len(PLANTED)) as pool:
        out.update(dict(pool.map(profile, PLANTED)))
    return out


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each profile's analysis, and the raw output of every command its evidence needs."""
    tmp = tmp_path_factory.mktemp("provenance")
    analyses, logdirs = {}, {}
    for name, src in _profile_dirs(tmp).items():
        logdirs[name] = _fresh_copy(src, tmp / name)
        analyses[name] = analyze(logdirs[name], tmp / name / "out").analysis
    needed = sorted({(name, cmd) for name, a in analyses.items() for _, row in _rows(a)
                     if not ev.is_pass(row["tool"]) for cmd in _commands(a, row["tool"])})
    with ThreadPoolExecutor(max(4, (os.cpu_count() or 1) * 2)) as pool:
        outputs = dict(zip(needed, pool.map(lambda nc: _run_raw(logdirs[nc[0]], nc[1]), needed),
                           strict=True))
    return {"analyses": analyses, "raw": outputs}


def _unresolved(name: str, analysis: Mapping[str, Any], raw: Mapping[Any, Any]
                ) -> tuple[list[str], int]:
    problems, resolved = [], 0
    for title, row in _rows(analysis):
        tool, field = row["tool"], row["field"]
        where = f"{name}: {tool} {field} (finding {title!r})"
        if ev.is_pass(tool):
            if tool not in KNOWN_PASSES or not row.get("from"):
                problems.append(f"{where}: an mldiag pass row without a known pass and `from`")
            continue
        commands = _commands(analysis, tool)
        if not commands:
            problems.append(f"{where}: names no xprof CLI command (an mldiag computation must "
                            "be cited under its mldiag.* pass name)")
            continue
        said = []
        for cmd in commands:
            out = raw[(name, cmd)]
            try:
                value = ev.lookup(out, field)
            except (ev.MissingField, ValueError):
                said.append(f"`xprof {' '.join(cmd)}` has no such field"
                            + (f" ({out['__failed__']})" if "__failed__" in out else ""))
                continue
            if _same(row["value"], value):
                break
            said.append(f"`xprof {' '.join(cmd)}` says {json.dumps(value)[:80]}, the row "
                        f"{json.dumps(row['value'])[:80]}")
        else:
            problems.append(f"{where}: " + "; ".join(said))
            continue
        resolved += 1
    return problems, resolved


def test_every_xprof_attributed_row_is_in_the_raw_tool_output(checked: dict[str, Any]) -> None:
    problems, resolved = [], 0
    for name, analysis in checked["analyses"].items():
        p, r = _unresolved(name, analysis, checked["raw"])
        problems += p
        resolved += r
    assert not problems, "\n".join(problems)
    # The check ran on real citations: the fixtures' findings cite xprof's tools.
    assert resolved >= 10


def test_the_planted_and_fixture_verdicts_hold(checked: dict[str, Any]) -> None:
    a = checked["analyses"]
    assert {f["category"] for f in a["tpu_inference_2"]["findings"]} >= {"data_transfer", "idle"}
    assert a["gpu_multi_worker"]["findings"][0]["category"] == "idle"
    assert a["planted_host_bound"]["findings"][0]["category"] == "host_bound"
    assert a["planted_custom_calls"]["findings"][0]["category"] == "other"
    for analysis in a.values():
        assert analysis["status"] == "NEEDS_ATTENTION"
