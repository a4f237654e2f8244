"""The local provider's autodown action: stop exactly this cluster's processes (see infra/autodown.py).

Kept apart from local.py so that the watcher imports only small core modules (no pydantic): it finds
the processes the same way `teardown` does, by the cluster's private temp dir and GCS port, and never
signals itself (its own command line names its config file inside that temp dir).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from infra import rayproc

#: The watcher's config inside the cluster's temp dir: teardown's process markers then find the
#: watcher too, so `invoke teardown` stops it with the rest of the cluster.
CONFIG_FILE = "rayfleet-autodown.json"


def markers(temp_dir: str, port_base: int) -> list[str | re.Pattern[str]]:
    return [temp_dir, rayproc.gcs_marker(port_base)]


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    """Stop the cluster's Ray processes (SIGTERM, short grace, SIGKILL), never the watcher itself."""
    found = markers(str(args["temp_dir"]), int(args["port_base"]))
    me = os.getpid()
    for _ in range(3):
        pids = [p for p in rayproc.cluster_processes(found) if p != me]
        if not pids:
            return
        log(f"stopping {len(pids)} Ray processes")
        left = rayproc.terminate(pids, grace=1.0)
        if left:
            raise RuntimeError(f"processes {left} survived SIGKILL")
    left = [p for p in rayproc.cluster_processes(found) if p != me]
    if left:
        raise RuntimeError(f"processes {left} are still running")
