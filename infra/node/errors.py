"""The base of rayfleet's error tree (the rest is in infra/core/errors.py, on the laptop).

Every error carries the exit code the CLI leaves with, and its message is a single line that says
what is wrong and how to fix it. They live here, in the node package, because head-side modules
(the cloud APIs, Slurm's queue parser, the atomic write) raise them too.
"""

from __future__ import annotations


class RayfleetError(Exception):
    """Base of every error shown to the user as one line (no traceback)."""

    exit_code: int = 1


class UsageError(RayfleetError):
    """Bad input: a spec, an option or a file the user named. Nothing was created."""

    exit_code = 2


class ProviderError(RayfleetError):
    """A provider could not do what was asked; subclasses add typed fields."""


class WriteError(RayfleetError):
    """A file could not be written (disk full, permission denied, read-only file system)."""
