"""The stages package: its modules import one way, and every stage the registry routes to is
`stages.<its name>`, as the Cloud Functions and the deployment name it."""

from __future__ import annotations

import ast
from pathlib import Path

from mldiag import stages

PACKAGE = Path(stages.__file__).parent


def _sibling_imports(path: Path) -> set[str]:
    """The stage modules that `path` imports when it runs (a `TYPE_CHECKING` block aside)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("mldiag.stages."):
                found.add(node.module.split(".")[2])
            elif node.module == "mldiag.stages":
                found.update(a.name for a in node.names if (PACKAGE / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names
                         if a.name.startswith("mldiag.stages."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle in `graph` (module -> modules it imports), or [] if there is none."""
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return []
        for imported in sorted(graph.get(module, ())):
            found = walk(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        found = walk(module, [])
        if found:
            return found
    return []


def test_the_stage_modules_import_one_way() -> None:
    graph = {p.stem: _sibling_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert graph["services"] == set(), "services is the leaf every stage module imports"
    assert _circle(graph) == []
    # The check itself finds a circle when there is one.
    circle = _circle({**graph, "services": {"registry"}})
    assert circle[0] == circle[-1] and {"services", "registry"} <= set(circle)


def test_every_routed_stage_is_reachable_by_its_name() -> None:
    for handler in stages.HANDLERS.values():
        assert handler.__name__ in stages.__all__
        assert getattr(stages, handler.__name__) is handler
    assert {"Services", "handle", "dispatch", "sweep", "requeue_stuck",
            "dead_lettered"} <= set(stages.__all__)
