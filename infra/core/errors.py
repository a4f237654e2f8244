"""One error tree for everything rayfleet reports to a user.

Every error carries the exit code the CLI leaves with, and its message is a single line that says
what is wrong and how to fix it. Provider modules subclass `ProviderError`; typed fields on those
subclasses (not message text) drive decisions such as "capacity missing, try the next choice".
"""

from __future__ import annotations

# The base classes live in the node package: head-side code raises them too.
from infra.node.errors import ProviderError, RayfleetError, UsageError, WriteError

__all__ = ["ClusterNotRunningError", "JobError", "ProviderError", "RayfleetError", "SpecError",
           "StateError", "StateLockedError", "UsageError", "WriteError"]


class SpecError(UsageError):
    """A cluster spec failed validation."""


class StateLockedError(RayfleetError):
    """Another rayfleet run holds the cluster's lock."""


class StateError(RayfleetError):
    """The state file is unreadable or of an unknown version."""


class ClusterNotRunningError(RayfleetError):
    """A command needs a running cluster and there is none."""


class JobError(RayfleetError):
    """A job could not be submitted, followed or stopped."""
