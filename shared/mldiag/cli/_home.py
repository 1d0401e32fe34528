"""`--home`, the one flag every command that reads the local runtime takes."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

HOME_HELP = ("the local runtime's directory: its state.db and bucket/ "
             "(default: $MLDIAG_HOME or .mldiag)")


def add_home(parser: argparse.ArgumentParser, *, repeated: bool = False) -> None:
    """Add `--home` to `parser`.

    `repeated` is for a verb's parser whose command already took `--home`: the flag is
    accepted after the verb as well, is left out of the verb's help, and, when not given
    there, leaves the value given before the verb in place.
    """
    if repeated:
        parser.add_argument("--home", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    else:
        parser.add_argument("--home", help=HOME_HELP)


CONSOLE_FILE = "console.json"


def record_console(home: Path, url: str) -> Path:
    """Note the URL the console of `mldiag up` is bound to in `home`, for the CLI commands
    that print console links (`share create`): under `--port N` or `--port 0` the default
    port is not the console's."""
    path = home / CONSOLE_FILE
    tmp = path.with_name(f".{CONSOLE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    tmp.replace(path)
    return path


def forget_console(home: Path) -> None:
    """Remove this process's note of its console (another process's note stays)."""
    path = home / CONSOLE_FILE
    if _recorded(path).get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def running_console_url(home: Path) -> str:
    """The URL of the console that `mldiag up` serves on `home`; "" when none runs (no
    note, or the process that wrote it has gone)."""
    note = _recorded(home / CONSOLE_FILE)
    pid, url = note.get("pid"), note.get("url")
    if not isinstance(pid, int) or not isinstance(url, str) or not url.startswith("http"):
        return ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except PermissionError:
        pass  # alive, another user's
    return url.rstrip("/")


def _recorded(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
