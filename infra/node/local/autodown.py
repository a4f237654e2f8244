"""The local provider's autodown action: stop exactly this cluster's processes (see
infra/node/autodown.py), with the same `stop` that `invoke teardown` uses.

It finds the processes the same way `teardown` does, by the cluster's private temp dir and GCS
port, and never signals itself (its own command line names its config file inside that temp dir).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

from infra.node import rayproc

#: The watcher's config inside the cluster's temp dir: teardown's process markers then find the
#: watcher too, so `invoke teardown` stops it with the rest of the cluster.
CONFIG_FILE = "rayfleet-autodown.json"
#: The watcher's action.
ACTION = "infra.node.local.autodown:remove"


class StopError(RuntimeError):
    """Processes of the cluster that could not (or must not) be stopped."""

    def __init__(self, pids: list[int], why: str) -> None:
        super().__init__(f"processes {pids} {why}")
        self.pids, self.why = pids, why


def markers(temp_dir: str, port_base: int) -> list[str | re.Pattern[str]]:
    return [temp_dir, rayproc.gcs_marker(port_base)]


def stop(found: list[str | re.Pattern[str]],
         step: Callable[[int], AbstractContextManager[Any]] = lambda _: contextlib.nullcontext(),
         spare: Collection[int] = ()) -> None:
    """Stop every process matching `found` (SIGTERM, short grace, SIGKILL), except `spare`.

    Several rounds: after a crashed `up`, a still-running `ray start` may spawn more processes
    while the first ones are being stopped. The cluster goes away as a whole, so the GCS need not
    wait for raylets to drain (it ignores SIGTERM for several seconds). Processes of another user
    are never signalled (StopError "belong to another user"). `step(n)` wraps each round.
    """
    for _ in range(3):
        pids = [p for p in rayproc.cluster_processes(found) if p not in spare]
        if not pids:
            return
        foreign = rayproc.not_ours(pids)
        if foreign:
            raise StopError(foreign, "belong to another user")
        with step(len(pids)):
            left = rayproc.terminate(pids, grace=1.0)
        if left:
            raise StopError(left, "survived SIGKILL")
    left = [p for p in rayproc.cluster_processes(found) if p not in spare]
    if left:
        raise StopError(left, "are still running")


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    """Stop the cluster's Ray processes, never the watcher itself nor its supervisor (whose
    command line names the watcher's config too): the supervisor ends when the watcher, done,
    exits 0."""

    def step(count: int) -> AbstractContextManager[None]:
        log(f"stopping {count} Ray processes")
        return contextlib.nullcontext()

    stop(markers(str(args["temp_dir"]), int(args["port_base"])), step,
         spare=(os.getpid(), os.getppid()))
