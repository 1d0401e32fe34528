"""Errors that callers can act on: each carries a one-line, user-facing reason."""


class MldiagError(Exception):
    """Base class for errors mldiag reports to users as one line."""


class PermanentFailure(MldiagError):
    """A stage failed for a reason retrying cannot fix: the session is marked FAILED."""


class ProfileUnreadable(PermanentFailure):
    """The input is missing, empty, truncated, too large or not an XSpace.

    A permanent error: retrying the same input cannot succeed.
    """


class PoisonMessage(MldiagError):
    """A message that can never be processed (bad JSON, wrong schema, unknown run).

    Dead-lettered with its reason at once; retrying cannot help.
    """

