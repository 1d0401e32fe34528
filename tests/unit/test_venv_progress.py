"""scripts/_venv.sh says what it installs while it builds .venv (it was silent for about a
minute): one line per package pip collects, then the install, on stderr."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "_venv.sh"

PIP_OUTPUT = """\
Obtaining file:///repo
  Installing build dependencies: started
Collecting jax==0.12.0.1 (from mldiag==0.1.0)
  Using cached jax-0.12.0.1-py3-none-any.whl.metadata (13 kB)
Collecting xprof==2.24.2 (from mldiag==0.1.0)
  Downloading xprof-2.24.2-cp312-none-manylinux2014_x86_64.whl (20.1 MB)
DEPRECATION: something pip says
Installing collected packages: xprof, jax, mldiag
ERROR: pip's dependency resolver does not currently take into account ...
Successfully installed jax-0.12.0.1 mldiag-0.1.0 xprof-2.24.2
"""


def test_pip_output_becomes_one_progress_line_a_step() -> None:
    # The function alone, from the script as it is (sourcing the script would build .venv).
    body = SCRIPT.read_text()
    start = body.index("pip_progress() {")
    function = body[start:body.index("\n}\n", start) + 3]
    done = subprocess.run(["bash", "-c", function + "pip_progress"], input=PIP_OUTPUT,
                          capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "mldiag: setup: [1] jax==0.12.0.1",
        "mldiag: setup: [2] xprof==2.24.2",
        "mldiag: setup: installing 3 package(s) into .venv ...",
        "ERROR: pip's dependency resolver does not currently take into account ...",
    ]

