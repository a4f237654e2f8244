"""One error tree for everything rayfleet reports to a user.

Every error carries the exit code the CLI leaves with, and its message is a single line that says
what is wrong and how to fix it. Provider modules subclass `ProviderError`; typed fields on those
subclasses (not message text) drive decisions such as "capacity missing, try the next choice".
"""

from __future__ import annotations


class RayfleetError(Exception):
    """Base of every error shown to the user as one line (no traceback)."""

    exit_code: int = 1


class UsageError(RayfleetError):
    """Bad input: a spec, an option or a file the user named. Nothing was created."""

    exit_code = 2


class SpecError(UsageError):
    """A cluster spec failed validation."""


class StateLockedError(RayfleetError):
    """Another rayfleet run holds the cluster's lock."""


class StateError(RayfleetError):
    """The state file is unreadable or of an unknown version."""


class ProviderError(RayfleetError):
    """A provider could not do what was asked; subclasses add typed fields."""


class ClusterNotRunningError(RayfleetError):
    """A command needs a running cluster and there is none."""


class JobError(RayfleetError):
    """A job could not be submitted, followed or stopped."""
