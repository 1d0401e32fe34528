"""PyTorch/XLA under mldiag's xprof(), on the CPU: run by scripts/verify_torch_xla in its own venv.

A tiny torch model trains on the XLA device (`PJRT_DEVICE=CPU`) in a run with
`framework=PYTORCH`; `xprof()` (the torch_xla engine: `torch_xla.debug.profiler.start_trace`)
captures three steps after the compile step. The check passes when the xplane lands in the
run's logdir (`<run>/plugins/profile/<session>/<host>.xplane.pb`), the run's target is a push
target served by torch_xla's profiler server (which a remote trace, the capture stage's
on-demand path, captures), and `mldiag analyze` reads the xplane (exit 0,
with XLA ops in its HLO op profile or step time). Prints one line per check and exits non-zero
on the first failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="mldiag-torch-xla-"))
    os.environ["MLDIAG_HOME"] = str(home)
    os.environ.setdefault("MLDIAG_HOST_NAME", "xla0")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.profiler as xp

    from mldiag.sdk import machinelearning_run, xprof
    from mldiag.sdk.custom_types.mlrun_types import Framework

    print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}, "
          f"PJRT_DEVICE={os.environ['PJRT_DEVICE']}", flush=True)
    run = machinelearning_run(name="torch-xla-check", framework=Framework.PYTORCH,
                              on_demand_xprof=True, port=9412)
    check(run.engine.name == "torch_xla", f"engine is torch_xla ({run.engine.name})")
    check(not run.target.pulls and run.target.framework == "pytorch",
          f"target is a push target of a pytorch process ({run.target.delivery}, "
          f"{run.target.framework} {run.target.framework_version}, {run.target.platform})")

    device = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def train_step(i: int) -> None:
        # torch_xla's step marker, which xprof's step trace reads (as JAX's StepTraceAnnotation).
        with xp.StepTrace("train_step", step_num=i):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()

    train_step(0)  # the compile step, outside the capture
    xm.wait_device_ops()
    start = time.time()
    with xprof(session_id="xla-steps") as prof:
        for i in range(1, 4):
            train_step(i)
        xm.wait_device_ops()
    check(prof.upload is not None, "xprof() started and stopped the torch_xla trace")
    name = prof.upload.result(timeout=120)

    # On demand: the capture stage's remote trace of torch_xla's profiler server (the target).
    import threading

    from mldiag.capture import remote

    done = threading.Event()

    def keep_training() -> None:
        i = 4
        while not done.is_set():
            train_step(i)
            xm.wait_device_ops()
            i += 1

    worker = threading.Thread(target=keep_training)
    worker.start()
    try:
        pushed = remote.remote_trace(run.target.service_addr, 1.0)
    finally:
        done.set()
        worker.join()
    check(len(pushed) > 0, f"remote trace of the torch_xla server {run.target.service_addr}: "
                           f"{len(pushed)} bytes")
    run.close()
    path = Path(home) / "bucket" / name
    if not path.is_file():
        found = sorted(Path(home).rglob("*.xplane.pb"))
        path = found[0] if found else path
    check(path.is_file() and path.stat().st_size > 0,
          f"xplane in the run's logdir: {name} ({path.stat().st_size if path.is_file() else 0}"
          f" bytes, {time.time() - start:.1f} s)")

    out = Path(tempfile.mkdtemp(prefix="mldiag-torch-xla-analysis-"))
    proc = subprocess.run([sys.executable, "-m", "mldiag.cli.main", "analyze", str(path),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n", flush=True)
    check(proc.returncode == 0, f"mldiag analyze exited {proc.returncode}")
    analysis = next(out.rglob("analysis.json"), None)
    check(analysis is not None, f"analysis.json written under {out}")
    assert analysis is not None
    data = json.loads(analysis.read_text())
    tools = {t["name"]: t["status"] for t in data.get("tools", [])}
    print(json.dumps({"status": data.get("status"), "metrics": data.get("metrics"),
                      "tools": tools}, indent=1), flush=True)
    check(tools.get("get_hlo_op_profile") == "DATA" or tools.get("get_step_trace") == "DATA"
          or tools.get("get_xprof_overview") == "DATA",
          "xprof's tools read the torch_xla trace (overview, step trace or op profile DATA)")


if __name__ == "__main__":
    main()
