"""Errors that callers can act on: each carries a one-line, user-facing reason.

Every exception mldiag raises derives from `MldiagError`, and each says in its docstring
whether it is transient (trying again later may succeed: a stage lets it propagate, so the
message is redelivered) or permanent (the same input fails again: it is recorded, with its
reason, and acknowledged). Callers tell errors apart by type, never by name.
"""


class MldiagError(Exception):
    """Base class for errors mldiag reports to users as one line; its subclasses say whether
    they are transient or permanent."""


class PermanentFailure(MldiagError):
    """A stage failed for a reason retrying cannot fix: the session is marked FAILED.

    Permanent, by definition.
    """


class ProfileUnreadable(PermanentFailure):
    """The input is missing, empty, truncated, too large or not an XSpace.

    A permanent error: retrying the same input cannot succeed.
    """


class PoisonMessage(MldiagError):
    """A message that can never be processed (bad JSON, wrong schema, unknown run).

    Permanent: dead-lettered with its reason at once; retrying cannot help.
    """

