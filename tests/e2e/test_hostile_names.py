"""Profile-derived strings are escaped in summary.html, end to end, from a real profile."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mldiag.analysis.engine import analyze

pytestmark = pytest.mark.slow

HOSTILE = '<img src=x onerror="alert(1)">'

WORKLOAD = textwrap.dedent(f'''
    import sys, time
    import jax, jax.numpy as jnp

    def stall():
        time.sleep(0.02)

    # The Python tracer records the code object's name: make it an HTML payload.
    stall.__code__ = stall.__code__.replace(co_name={HOSTILE!r})

    step = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((128, 128))
    step(x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(6):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                stall()
                step(x).block_until_ready()
''')


def test_hostile_host_function_name_is_escaped(tmp_path: Path):
    script = tmp_path / "hostile.py"
    script.write_text(WORKLOAD)
    subprocess.run([sys.executable, str(script), str(tmp_path / "logdir")], check=True,
                   capture_output=True, timeout=300)
    result = analyze(tmp_path / "logdir", tmp_path / "out")
    finding = result.analysis["findings"][0]
    assert finding["category"] == "host_bound"
    assert HOSTILE in finding["what"]  # the culprit is named, verbatim, in analysis.json
    html = result.summary_html.read_text()
    assert HOSTILE not in html
    # Jinja2's autoescape writes a double quote as &#34;
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html
    assert "<img" not in html and "<script" not in html
