"""Benchmark: how long `mldiag diff` takes, reading stored snapshots, against collecting again.

    python bench/diff.py [--sizes 100] [--workdir DIR] [--json OUT] [--repeat 5] [--xprof]

1. The two shared fixtures (`../shared/fixtures`): each analysed once, as the pipeline does,
   into a local bucket and state store (REPORTED sessions). Then, medians of `--repeat`:
   - `build_diff` in-process on the stored snapshots (the pipeline's report stage does this),
     for TPU vs TPU, GPU vs GPU and TPU vs GPU, with diff.html rendered;
   - `mldiag diff RUN/A RUN/B` as a fresh process (Python start-up and imports included);
   - with `--xprof`, xprof's own `diff_sessions` on the raw profiles, which converts both
     again, for contrast.
2. Pairing a recompiled program's ops (`--pair-ops N`, default 4000, below the 5000 a digest
   keeps per module): the digests of two synthetic modules of N fusions, every fusion renamed and
   one boundary moved, then `pairing.pair` on them (medians of `--repeat`).
3. Large sessions, `--sizes` MB each: two profiles of bench/scale.py's workload are generated
   (about 2.3 KB a step), analysed once into the store, and diffed the same ways. What a diff
   would cost if it collected both sides again is the two analyses' time, printed beside it.

Wall and CPU seconds; the diff's own peak RSS for the subprocess runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import PeakTreeRss, write_results  # noqa: E402 - bench/_proc.py, beside this file
from _workdir import workdir  # noqa: E402
from scale import generate  # noqa: E402

from mldiag.adapters.local.state import SqliteStateStore  # noqa: E402
from mldiag.adapters.local.storage import LocalDirStorage  # noqa: E402
from mldiag.analysis.collection.profile_input import resolve_session  # noqa: E402
from mldiag.model import REPORTED, HostRecord, SessionRecord  # noqa: E402
from mldiag.regression import compare_sessions, diff_artifacts  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
MLDIAG = Path(sys.executable).with_name("mldiag")


class Store:
    """A local bucket and state store holding REPORTED sessions analysed by `mldiag analyze`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.bucket = home / "bucket"
        self.state = SqliteStateStore(home / "state.db")
        self.storage = LocalDirStorage(self.bucket)

    def add(self, run: str, session: str, xplanes: list[Path]) -> dict[str, Any]:
        """Copy the xplanes into the bucket and analyse them there, once (kept across runs:
        the store is the bench's workdir)."""
        self.state.ensure_run(run, discovered=False)
        found = self.state.get_session(run, session)
        base = self.bucket / run / "plugins" / "profile" / session
        if found is not None and (base / "analysis" / "v1" / "analysis.json").is_file():
            return json.loads((base / "analysis" / "analysis_timing.json").read_text())
        base.mkdir(parents=True, exist_ok=True)
        hosts = {}
        for x in xplanes:
            shutil.copyfile(x, base / x.name)
            host = x.name.removesuffix(".xplane.pb")
            hosts[host] = HostRecord(object_name=f"{run}/plugins/profile/{session}/{x.name}",
                                     generation="1", size=x.stat().st_size, arrived_at=0.0)
        start, cpu0 = time.perf_counter(), _children_cpu()
        subprocess.run([str(MLDIAG), "analyze", str(base), "--out",
                        str(base / "analysis" / "v1"), "-q"], check=True, capture_output=True)
        timing = {"analyze_wall_s": round(time.perf_counter() - start, 2),
                  "analyze_cpu_s": round(_children_cpu() - cpu0, 2),
                  "xplane_mb": round(sum(x.stat().st_size for x in xplanes) / 1024**2, 1)}
        for name in ("health_snapshot.json", "analysis.json", "investigation.json"):
            shutil.copyfile(base / "analysis" / "v1" / name, base / "analysis" / name)
        (base / "analysis" / "analysis_timing.json").write_text(json.dumps(timing))
        verdict = json.loads((base / "analysis" / "analysis.json").read_text())["status"]
        now = time.time()
        self.state.create_session(SessionRecord(
            run=run, session=session, state=REPORTED, hosts=hosts, verdict=verdict,
            reported_version=1, created_at=now, updated_at=now))
        return timing


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def in_process(store: Store, run: str, a: str, b: str, repeat: int) -> dict[str, Any]:
    """build_diff on the stored snapshots (read from the bucket each time) + diff.html."""
    sa, sb = store.state.get_session(run, a), store.state.get_session(run, b)
    assert sa is not None and sb is not None
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu0 = time.perf_counter(), time.process_time()
        doc = compare_sessions(store.storage, store.state, sa, sb)
        data, page = diff_artifacts(doc)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu0)
    snapshot_kb = sum((store.bucket / run / "plugins" / "profile" / s / "analysis" / "v1" /
                       "health_snapshot.json").stat().st_size for s in (a, b)) / 1024
    return {"wall_ms": round(1000 * statistics.median(walls), 1),
            "cpu_ms": round(1000 * statistics.median(cpus), 1),
            "snapshots_kb": round(snapshot_kb, 1), "diff_json_kb": round(len(data) / 1024, 1),
            "diff_html_kb": round(len(page) / 1024, 1),
            "top": (doc["explanation"] or [{}])[0].get("kind"), "headline": doc["headline"]}


def cli(store: Store, run: str, a: str, b: str, out: Path, repeat: int) -> dict[str, Any]:
    """`mldiag diff RUN/A RUN/B` as a fresh process."""
    walls, cpus, peaks = [], [], []
    env = {**os.environ, "MLDIAG_HOME": str(store.home)}
    for _ in range(repeat):
        cpu0 = _children_cpu()
        with PeakTreeRss() as rss:
            start = time.perf_counter()
            subprocess.run([str(MLDIAG), "diff", f"{run}/{a}", f"{run}/{b}", "--out", str(out),
                            "-q"], check=True, capture_output=True, env=env)
            walls.append(time.perf_counter() - start)
        cpus.append(_children_cpu() - cpu0)
        peaks.append(rss.peak)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mldiag.cli.main"], check=True)
    imports = time.perf_counter() - start
    return {"wall_s": round(statistics.median(walls), 3),
            "cpu_s": round(statistics.median(cpus), 3),
            "peak_rss_mb": round(max(peaks) / 1024**2), "import_only_s": round(imports, 3)}


def xprof(store: Store, run: str, a: str, b: str) -> dict[str, Any]:
    """xprof's diff_sessions on the two raw profiles (converted again)."""
    from mldiag.analysis.diff.xprof import xprof_diff

    sessions = [resolve_session(store.bucket / run / "plugins" / "profile" / s) for s in (a, b)]
    start = time.perf_counter()
    result, why = xprof_diff(sessions[0], sessions[1], timeout_s=3600)
    return {"wall_s": round(time.perf_counter() - start, 2),
            "kernels": len((result or {}).get("kernel_diffs") or []), "error": why}


def _module(n: int, moved: bool) -> tuple[str, dict[str, str]]:
    """HLO text of `n` chained loop fusions (each exp then add, from its own source line),
    renamed on the `moved` side, whose first fusion is also split in two there."""
    bodies, entry, sources = [], ["  p0 = f32[256]{0} parameter(0)"], {}
    prev = "p0"
    for i in range(n):
        sources[f"e{i}"] = f"model.py:{10 + 2 * i} (jit(step)/exp)"
        sources[f"a{i}"] = f"model.py:{11 + 2 * i} (jit(step)/add)"
        name = f"fusion.{i + 7 if moved else i}"
        if moved and i == 0:
            bodies.append("split_e {\n  q = f32[256]{0} parameter(0)\n"
                          "  ROOT e0 = f32[256]{0} exponential(q)\n}\n")
            bodies.append("split_a {\n  q = f32[256]{0} parameter(0)\n"
                          "  ROOT a0 = f32[256]{0} add(q, q)\n}\n")
            entry.append(f"  split.e = f32[256]{{0}} fusion({prev}), kind=kLoop, calls=split_e")
            entry.append("  split.a = f32[256]{0} fusion(split.e), kind=kLoop, calls=split_a")
            prev = "split.a"
            continue
        bodies.append(f"body{i} {{\n  q = f32[256]{{0}} parameter(0)\n"
                      f"  e{i} = f32[256]{{0}} exponential(q)\n"
                      f"  ROOT a{i} = f32[256]{{0}} add(e{i}, q)\n}}\n")
        entry.append(f"  {name} = f32[256]{{0}} fusion({prev}), kind=kLoop, calls=body{i}")
        prev = name
    entry[-1] = "  ROOT " + entry[-1].lstrip()
    return ("HloModule jit_step, entry_computation_layout={(f32[256]{0})->f32[256]{0}}\n\n"
            + "\n".join(bodies) + "\nENTRY main {\n" + "\n".join(entry) + "\n}\n"), sources


def pairing_cost(n: int, repeat: int) -> dict[str, Any]:
    """Digest two modules of `n` fusions and pair their ops (see the module docstring)."""
    from mldiag.analysis.collection.hlo.digest import digest
    from mldiag.analysis.diff.pairing import facts, pair

    (ta, sa), (tb, sb) = _module(n, False), _module(n, True)
    start = time.perf_counter()
    da, db = digest("jit_step(1)", ta, sa), digest("jit_step(2)", tb, sb)
    digest_ms = (time.perf_counter() - start) * 1000.0
    fa, fb = facts(da), facts(db)
    assert fa is not None and fb is not None
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        found = pair(fa, fb)
        walls.append((time.perf_counter() - start) * 1000.0)
    return {"case": f"pairing {n} ops", "digest_both_ms": round(digest_ms, 1),
            "pair_ms": round(statistics.median(walls), 1), "pairs": len(found.pairs),
            "groups": len(found.groups), "new": len(found.new), "removed": len(found.removed),
            "digest_json_kb": round(len(json.dumps(db)) / 1024, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="100", help="large session sizes in MB ('' for "
                        "none)")
    parser.add_argument("--workdir", help="profiles and the store (default: a temp dir, "
                        "removed at exit; reused when given)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--xprof", action="store_true",
                        help="also time xprof's diff_sessions on the raw profiles")
    parser.add_argument("--pair-ops", type=int, default=4000,
                        help="ops per module for the pairing benchmark (0: skip it)")
    args = parser.parse_args()
    work = workdir(args.workdir, "mldiag-diffbench-")
    work.mkdir(parents=True, exist_ok=True)
    store = Store(work / "home")
    rows: list[dict[str, Any]] = []

    def measure(label: str, run: str, a: str, b: str, extra: dict[str, Any]) -> None:
        row = {"case": label, **extra,
               "in_process": in_process(store, run, a, b, args.repeat),
               "cli": cli(store, run, a, b, work / "out" / label.replace(" ", "_"),
                          args.repeat)}
        if args.xprof:
            row["xprof_diff_sessions"] = xprof(store, run, a, b)
        rows.append(row)
        print(json.dumps(row), flush=True)

    if FIXTURES.is_dir():
        timing = {}
        for name in ("tpu_inference_2", "gpu_multi_worker"):
            xplanes = sorted((FIXTURES / name).glob("plugins/profile/*/*.xplane.pb"))
            timing[name] = store.add("fixtures", name, xplanes)
        for a, b in (("tpu_inference_2", "tpu_inference_2"),
                     ("gpu_multi_worker", "gpu_multi_worker"),
                     ("tpu_inference_2", "gpu_multi_worker")):
            measure(f"{a} vs {b}", "fixtures", a, b, {
                "recollect_s": round(timing[a]["analyze_wall_s"] + timing[b]["analyze_wall_s"],
                                     2), "xplane_mb": [timing[a]["xplane_mb"],
                                                       timing[b]["xplane_mb"]]})
    else:
        print(f"fixtures: {FIXTURES} is absent, skipped", flush=True)

    pair_rows = [pairing_cost(args.pair_ops, args.repeat)] if args.pair_ops else []
    for row in pair_rows:
        print(json.dumps(row), flush=True)

    calib: Path | None = None
    for mb in [float(s) for s in args.sizes.split(",") if s.strip()]:
        if calib is None:
            calib = generate(work / "calibration", 1000)
        steps = max(10, int(mb * 1024**2 / (calib.stat().st_size / 1000)))
        timing = {}
        for side in ("a", "b"):
            logdir = work / f"p{mb:g}MB-{side}"
            if not any(logdir.glob("plugins/profile/*/*.xplane.pb")):
                start = time.perf_counter()
                generate(logdir, steps)
                print(f"generated {logdir} in {time.perf_counter() - start:.0f} s", flush=True)
            xplanes = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
            timing[side] = store.add("large", f"{mb:g}MB-{side}", xplanes)
        measure(f"{mb:g} MB vs {mb:g} MB", "large", f"{mb:g}MB-a", f"{mb:g}MB-b", {
            "steps": steps, "xplane_mb": [timing["a"]["xplane_mb"], timing["b"]["xplane_mb"]],
            "recollect_s": round(timing["a"]["analyze_wall_s"]
                                 + timing["b"]["analyze_wall_s"], 2)})

    print(f"\n{'case':<40} {'MB':>12} {'diff ms':>8} {'cpu ms':>7} {'CLI s':>6} "
          f"{'import s':>8} {'re-collect s':>12}")
    for r in rows:
        mb = "/".join(f"{x:g}" for x in r["xplane_mb"])
        print(f"{r['case']:<40} {mb:>12} {r['in_process']['wall_ms']:>8} "
              f"{r['in_process']['cpu_ms']:>7} {r['cli']['wall_s']:>6} "
              f"{r['cli']['import_only_s']:>8} {r['recollect_s']:>12}")
    write_results(args.json, rows + pair_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
