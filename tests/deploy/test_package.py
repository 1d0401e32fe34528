"""scripts/package_functions: what Cloud Build receives for one function, and that it imports."""

from __future__ import annotations

import filecmp
import hashlib
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "package_functions"
FUNCTION = "collect"


def package(out: Path, *names: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *names], check=True,
                   capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    package(out, FUNCTION)
    return out


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_package_holds_the_function_the_library_and_pinned_requirements(packaged: Path) -> None:
    folder = packaged / FUNCTION
    assert sorted(p.name for p in folder.iterdir()) == ["main.py", "mldiag", "requirements.txt"]
    source = REPO / "functions" / FUNCTION / "main.py"
    assert (folder / "main.py").read_text() == source.read_text()
    library = filecmp.dircmp(REPO / "shared" / "mldiag", folder / "mldiag",
                             ignore=["__pycache__"])
    assert not library.left_only and not library.right_only and not library.diff_files
    assert not list(folder.rglob("__pycache__"))

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gcp"],
              *project["optional-dependencies"]["functions"]]
    lines = [line for line in (folder / "requirements.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert sorted({_name(r) for r in wanted}) == sorted(_name(r) for r in lines)
    # Pinned to what the tests ran against (.venv), so a deploy builds what was tested.
    assert all("==" in line for line in lines), lines


def test_zip_is_the_folder_and_reproducible(packaged: Path, tmp_path: Path) -> None:
    folder, zip_path = packaged / FUNCTION, packaged / f"{FUNCTION}.zip"
    with zipfile.ZipFile(zip_path) as zf:
        names = sorted(zf.namelist())
        assert names == sorted(p.relative_to(folder).as_posix()
                               for p in folder.rglob("*") if p.is_file())
        assert zf.read("main.py") == (folder / "main.py").read_bytes()
    # Same inputs, same bytes: terraform names the object by its hash and redeploys only
    # functions whose package changed.
    package(tmp_path, FUNCTION)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest()
              for p in (zip_path, tmp_path / f"{FUNCTION}.zip")]
    assert digest[0] == digest[1]


def test_unknown_function_is_refused(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no function 'nope'" in result.stderr


@pytest.mark.slow
def test_packaged_function_imports_in_a_clean_venv(packaged: Path, tmp_path: Path) -> None:
    """Install requirements.txt as Cloud Build would, into a venv that sees nothing of ours.

    40-60 s on 2 cores (jax, xprof and the Google Cloud clients from the package index).
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-r", str(packaged / FUNCTION / "requirements.txt")],
                   check=True, env=env, timeout=600)
    probe = (
        "import sys, main, mldiag, xprof, jax\n"
        f"assert callable(main.{FUNCTION})\n"
        "assert not sys.flags.no_site and 'site-packages' not in mldiag.__file__\n"
        "print(mldiag.__file__)\n")
    result = subprocess.run([str(python), "-c", probe], cwd=packaged / FUNCTION, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(packaged / FUNCTION)
