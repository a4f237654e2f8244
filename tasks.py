"""`invoke` in this checkout: the tasks live in infra/cli/tasks.py, so that the `rayfleet` command finds
them from any directory; Invoke finds them here through this re-export. Add a new task there."""

from infra.cli.tasks import *  # noqa: F403
