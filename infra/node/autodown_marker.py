"""The autodown watcher's marker (infra/node/autodown.py writes it at every check): its own module,
so that the laptop reads it (infra/core/autodown/view.py, on every `status` and `up`) without
loading the watcher of a cluster that runs none. Typed as every file between the laptop and a head
is (infra/node/wire.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.node.wire import VERSION, Wire


@dataclass
class Marker(Wire):
    """What the watcher saw and did last (written atomically at every check); the laptop caches
    it (infra/core/autodown/view.py) and adds `watcher_running`. Every field has a default: a
    marker is read however little of it there is (a reader makes "no report yet" of it)."""

    KIND = "the autodown watcher's marker"

    cluster: str = ""
    cluster_id: str | None = None
    idle_minutes: float | None = None
    started_at: str | None = None
    pid: int | None = None
    #: watching, removing, removed or failed.
    phase: str = ""
    #: When Ray was last seen idle after being busy (ISO 8601, UTC); None while busy.
    idle_since: str | None = None
    idle_s: float | None = None
    detail: str = ""
    checked_at: str | None = None
    removing_at: str | None = None
    removed_at: str | None = None
    error: str | None = None
    interval_s: float | None = None
    #: Set on the laptop: whether the watcher (or its supervisor) ran when the marker was read.
    watcher_running: bool | None = None
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)
