"""Every exception mldiag defines derives from MldiagError and says whether it is transient."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import mldiag
from mldiag.errors import MldiagError

PACKAGE = Path(mldiag.__file__).parent

# Classes in modules being reworked elsewhere (issue 21), by name so a move keeps the entry:
# each gets its MldiagError base and its docstring there. Remove an entry once it complies.
PENDING: set[str] = set()


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = importlib.import_module(name)
        found += [c for c in vars(module).values()
                  if inspect.isclass(c) and issubclass(c, BaseException)
                  and c.__module__ == name]
    return found


CLASSES = _exception_classes()


def _complies(cls: type[BaseException]) -> bool:
    doc = (cls.__doc__ or "").lower()
    return issubclass(cls, MldiagError) and ("transient" in doc or "permanent" in doc)


def test_the_walk_finds_the_exceptions() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"MldiagError", "ProfileUnreadable", "ContinuousError", "NotSignedIn"} <= names


@pytest.mark.parametrize("cls", [c for c in CLASSES if c.__name__ not in PENDING],
                         ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_exception_is_an_mldiag_error_that_says_if_it_is_transient(
        cls: type[BaseException]) -> None:
    assert issubclass(cls, MldiagError), f"{cls.__name__} is outside MldiagError"
    doc = (cls.__doc__ or "").lower()
    assert "transient" in doc or "permanent" in doc, (
        f"{cls.__name__}'s docstring does not say whether it is transient or permanent")


def test_pending_entries_are_still_pending() -> None:
    done = sorted(c.__name__ for c in CLASSES if c.__name__ in PENDING and _complies(c))
    assert not done, f"remove {done} from PENDING: they comply now"
