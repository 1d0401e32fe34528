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

from tests.helpers.fixtures import REPO

SCRIPT = REPO / "scripts" / "package_functions"
FUNCTION = "collect"
LOCK = REPO / "functions" / "requirements.lock"
# What a function image must never need: JAX and what it pulls in (~470 MB).
SDK_ONLY = ("jax", "jaxlib", "scipy")


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


def test_package_holds_the_function_the_library_and_locked_requirements(packaged: Path) -> None:
    folder = packaged / FUNCTION
    assert sorted(p.name for p in folder.iterdir()) == ["main.py", "mldiag", "requirements.txt"]
    source = REPO / "functions" / FUNCTION / "main.py"
    assert (folder / "main.py").read_text() == source.read_text()
    library = filecmp.dircmp(REPO / "shared" / "mldiag", folder / "mldiag",
                             ignore=["__pycache__"])
    assert not library.left_only and not library.right_only and not library.diff_files
    assert not list(folder.rglob("__pycache__"))

    # The hashed lock, as it is: Cloud Build's pip installs exactly those files.
    assert (folder / "requirements.txt").read_text() == LOCK.read_text()


def _lock_entries() -> dict[str, str]:
    """Each locked requirement's name → its whole entry (pin, hashes, `# via`)."""
    body = "\n".join(line for line in LOCK.read_text().splitlines()
                     if not line.startswith("#"))
    entries = [e for e in re.split(r"\n(?=[A-Za-z0-9])", body) if e.strip()]
    return {_name(e): e for e in entries}


def test_the_lock_pins_every_runtime_requirement_with_hashes_and_no_jax() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gcp"],
              *project["optional-dependencies"]["functions"]]
    entries = _lock_entries()
    assert {_name(r) for r in wanted} <= set(entries)
    for name, entry in entries.items():
        assert re.match(r"[A-Za-z0-9._-]+(\[[a-z0-9,_-]+\])?==\S+ \\\n", entry), entry[:200]
        assert "--hash=sha256:" in entry, name
    # JAX is the SDK's (the `sdk` extra): none of it, nor what it pulls in, in a function.
    assert not {"jax", "jaxlib", "scipy"} & set(entries)
    assert "jax" not in {_name(r) for r in wanted}
    assert [_name(r) for r in project["optional-dependencies"]["sdk"]] == ["jax"]


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


def test_every_function_imports_without_jax(tmp_path: Path) -> None:
    """Each functions/<name>/main.py loads, and builds its services, where jax, jaxlib and
    scipy cannot be imported (as in the function images)."""
    probe = f"""
import importlib.abc, importlib.util, sys
from pathlib import Path

class NoSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SDK_ONLY!r}:
            raise ImportError(f"{{name}} is not installed in a function image")
        return None

sys.meta_path.insert(0, NoSdk())
for main in sorted(Path("functions").glob("*/main.py")):
    spec = importlib.util.spec_from_file_location(f"fn_{{main.parent.name}}", main)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, main.parent.name)), main
from mldiag import entrypoints, stages
entrypoints.services()
assert not {{m.split(".")[0] for m in sys.modules}} & {set(SDK_ONLY)!r}
print("ok")
"""
    env = {**os.environ, "MLDIAG_HOME": str(tmp_path / "home"),
           "PYTHONPATH": f"{REPO / 'shared'}:{REPO}"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_nothing_outside_the_sdk_imports_jax() -> None:
    """Imports inside functions too (the lazy ones run only on some messages): only
    mldiag.sdk, which runs in the workload, may import JAX."""
    import ast

    library = REPO / "shared" / "mldiag"
    offenders = []
    for path in sorted(library.rglob("*.py")):
        if path.is_relative_to(library / "sdk"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and
                     not node.level else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in SDK_ONLY or n.startswith("mldiag.sdk")]
    assert not offenders, offenders


@pytest.mark.slow
def test_packaged_function_imports_in_a_clean_venv(packaged: Path, tmp_path: Path) -> None:
    """Install requirements.txt as Cloud Build would, into a venv that sees nothing of ours.

    30-50 s on 2 cores (xprof and the Google Cloud clients from the package index).
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-r", str(packaged / FUNCTION / "requirements.txt")],
                   check=True, env=env, timeout=600)
    probe = (
        "import importlib.util, sys, main, mldiag, xprof\n"
        f"assert callable(main.{FUNCTION})\n"
        "assert importlib.util.find_spec('jax') is None, 'jax in a function image'\n"
        "assert not sys.flags.no_site and 'site-packages' not in mldiag.__file__\n"
        "print(mldiag.__file__)\n")
    result = subprocess.run([str(python), "-c", probe], cwd=packaged / FUNCTION, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(packaged / FUNCTION)
