"""`mldiag.analysis` is the analysis engine's front door: nothing outside the package imports
its sub-packages (collection, judgement, report, diff, the engine), and every name the door
lists resolves to what it says."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mldiag
import mldiag.analysis as analysis

PACKAGE = Path(mldiag.__file__).parent


def _outside_imports() -> list[str]:
    """`file:line module` for each import of an analysis submodule outside the package
    (`TYPE_CHECKING` blocks included: a type is an import too)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "analysis") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {n}" for n in names
                      if n.startswith("mldiag.analysis.")]
    return found


def test_nothing_outside_imports_an_analysis_submodule() -> None:
    assert _outside_imports() == []


def test_the_check_sees_a_submodule_import() -> None:
    # The check above can fail: a module that reaches past the door is named.
    sneaky = PACKAGE / "_front_door_probe.py"
    sneaky.write_text("from mldiag.analysis.judgement.triage import triage\n")
    try:
        assert _outside_imports() == [
            "_front_door_probe.py:1 mldiag.analysis.judgement.triage"]
    finally:
        sneaky.unlink()


def test_every_name_of_the_door_resolves_to_its_module() -> None:
    exports = analysis._EXPORTS
    assert list(exports) == sorted(exports)
    assert analysis.__all__ == sorted(exports)
    for name, (module, attribute) in exports.items():
        target = importlib.import_module(f"mldiag.analysis.{module}")
        expected = target if attribute is None else getattr(target, attribute)
        assert getattr(analysis, name) is expected, name


def test_the_types_mypy_reads_are_the_doors_names() -> None:
    # The lazy table and the TYPE_CHECKING imports list the same names from the same places
    # (the one is what runs, the other what mypy checks callers against).
    tree = ast.parse(Path(analysis.__file__).read_text())
    typed = {}
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            for node in ast.walk(block):
                if isinstance(node, ast.ImportFrom):
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        typed[a.asname or a.name] = full.removeprefix("mldiag.analysis.")
    lazy = {name: f"{module}.{attribute}" if attribute else module
            for name, (module, attribute) in analysis._EXPORTS.items()}
    assert typed == lazy


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        analysis.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("mldiag.analysis.no_such_name resolved")
