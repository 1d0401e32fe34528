"""mldiag's imports point one way: no module imports, at its top or inside a function, a module
that imports it back. Imports under `TYPE_CHECKING` are left out: they are the deliberate
way to name a type across such a pair (each says why in a comment).

The tests' imports too: no module under tests/ imports a test module (`test_*.py`); what
tests share lives in tests/helpers/."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import mldiag

PACKAGE = Path(mldiag.__file__).parent
TESTS = Path(__file__).resolve().parents[1]

# Circles being removed elsewhere (issue 21: the report and the diff page move to templates).
# Remove an entry once it is gone.
PENDING: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The mldiag modules `module` imports outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + [base] * bool(base))
            # `from pkg import sub` imports the module pkg.sub; `from pkg import f` uses pkg.
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = subs + [base] * (len(subs) < len(node.names))
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


def _cycles() -> list[set[str]]:
    known = _modules()
    graph = {m: set(_imported(m, p, known)) for m, p in known.items()}
    # A package's __init__ importing its own submodules is how packages work, not a circle.
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        reach[start] = seen
    groups: list[set[str]] = []
    for m in sorted(graph):
        if m in reach[m] and not any(m in g for g in groups):
            groups.append({m} | {o for o in reach[m] if m in reach[o]})
    return groups


def test_the_walk_sees_imports_inside_functions() -> None:
    known = _modules()
    # machinelearning_run imports bootstrap inside the function, for its cost.
    assert "mldiag.bootstrap" in set(_imported("mldiag.sdk.run", known["mldiag.sdk.run"], known))


def test_no_import_circles() -> None:
    found = _cycles()
    assert [c for c in found if c not in PENDING] == []
    assert [c for c in PENDING if c not in found] == [], "a pending circle is gone: remove it"


def _imports_of(prefix: str) -> dict[str, set[str]]:
    """The mldiag modules each module under `prefix` imports (inside functions included)."""
    known = _modules()
    return {m: set(_imported(m, p, known)) for m, p in known.items()
            if m == prefix or m.startswith(prefix + ".")}


def test_the_collection_imports_no_judgement_report_or_diff() -> None:
    # Collection is the bottom layer: judgement, the report and the diff read what it
    # writes; what both sides name lives in its leaves (`registry`, `passes`).
    above = ("mldiag.analysis.judgement", "mldiag.analysis.report", "mldiag.analysis.diff",
             "mldiag.analysis.engine")
    found = {m: sorted(d for d in deps if d.startswith(above))
             for m, deps in _imports_of("mldiag.analysis.collection").items()}
    assert {m: deps for m, deps in found.items() if deps} == {}


def test_the_collections_leaves_import_only_each_other() -> None:
    leaves = {"mldiag.analysis.collection.registry", "mldiag.analysis.collection.passes"}
    for leaf in leaves:
        deps = _imports_of(leaf)[leaf]
        assert deps <= leaves, (leaf, deps)


def test_judgement_still_names_what_the_leaves_hold() -> None:
    from mldiag.analysis.collection import passes, registry
    from mldiag.analysis.judgement import evidence, followups

    for name in ("PASS_PREFIX", "TIMELINE", "CUSTOM_CALLS", "ASYNC_COPIES", "KERNEL_TABLE",
                 "HLO_EXCERPT", "PASSES"):
        assert getattr(evidence, name) is getattr(passes, name)
    assert evidence.DETECTORS is registry.DETECTORS
    assert followups.HOST_PYTHON_EVENTS is passes.HOST_PYTHON_EVENTS
    assert followups.ASYNC_OVERLAP is passes.ASYNC_OVERLAP


def _test_modules_imported(source: str, package: tuple[str, ...]) -> list[str]:
    """The test modules (`tests.….test_*`) that code of `package` imports, at its top or
    inside a function, absolutely or relatively, as a module or from one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + (base,) * bool(base))
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        found += [n for n in names
                  if n.startswith("tests.") and n.rpartition(".")[2].startswith("test_")]
    return found


def test_the_walk_sees_every_way_to_import_a_test_module() -> None:
    source = ("from tests.unit.test_html import IMG\n"
              "def f():\n    from tests.unit import test_html, snapshots\n"
              "import tests.pipeline.test_stages as stages\n"
              "from .test_regression import report\n"
              "from ..helpers.wait import wait_until\n")
    assert sorted(_test_modules_imported(source, ("tests", "console"))) == [
        "tests.console.test_regression", "tests.pipeline.test_stages", "tests.unit.test_html",
        "tests.unit.test_html"]


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        package = ("tests", *path.relative_to(TESTS).parent.parts)
        imported = _test_modules_imported(path.read_text(), package)
        if imported:
            found[str(path.relative_to(TESTS.parent))] = imported
    assert found == {}, "move what they share to tests/helpers/"
