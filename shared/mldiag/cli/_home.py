"""`--home`, the one flag every command that reads the local runtime takes."""

from __future__ import annotations

import argparse

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
