"""The laptop's view of a cluster's idle watcher (infra/node/autodown.py): its marker, cached here,
and what `status`, `up` and `teardown` make of it.

Core layer: imports nothing of the providers. Providers answer two small questions (the head's
marker, whether anything of the cluster is left) in `infra.providers.base.Provider`; the decision
"busy / idle N of M / silent / removed itself" is made here, once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.node.autodown_marker import Marker
from infra.node.files import atomic_write
from infra.node.wire import WireError

#: Under RAYFLEET_HOME: the markers this machine holds, one per cluster.
MARKER_DIR = "autodown"


@dataclass(frozen=True)
class AutodownView:
    """The cluster's own idle watcher as this machine sees it (see infra/node/autodown.py)."""

    #: The spec's setting: the cluster removes itself after this many idle minutes.
    idle_minutes: float
    #: How long Ray has been idle now, by the watcher's last report; None when busy or unknown.
    idle_s: float | None = None
    #: When the cluster removed itself (ISO 8601, UTC), from the marker it left; None if it has not.
    removed_at: str | None = None
    #: One line on what the watcher saw or did last (e.g. "2 jobs running"), for `status`.
    detail: str = ""
    #: The watcher's last check (ISO 8601) when that is too long ago for a watcher that still runs
    #: (it died, or its head is unreachable): its countdown is then no longer true.
    silent_since: str | None = None
    #: Whether the watcher (or its supervisor, which starts it again) runs, as the head said when
    #: its marker was read (process identity, infra/node/supervise.py); None when not asked.
    watcher_running: bool | None = None


def marker_path(cluster: str) -> Path:
    """Where this machine keeps a cluster's watcher marker (written by a local watcher directly,
    cached here by remote providers from what they read on the head)."""
    return paths.home() / MARKER_DIR / f"{cluster}.json"


def read_marker(path: Path) -> Marker | None:
    try:
        return _parsed(path.read_text())
    except OSError:
        return None


def cache_marker(cluster: str, text: str, cluster_id: str | None = None) -> Marker | None:
    """Keep what a provider read from its head's marker, for `status` after the head is gone; the
    marker kept, or None when `text` is no marker (or, with `cluster_id`, another cluster's: never
    taken, even at our path). Keys this version does not know are kept (infra/node/wire.py)."""
    marker = _parsed(text)
    if marker is None:
        return None
    if cluster_id is not None and marker.cluster_id != cluster_id:
        return None
    atomic_write(marker_path(cluster), marker.to_json() + "\n")
    return marker


def with_watcher_status(text: str | None, status: dict[str, Any] | None) -> str | None:
    """A marker's text with `watcher_running` from the supervisor's status
    (`infra.node.supervise.status`, read where the watcher runs); unchanged when either is
    missing or the marker is no JSON object."""
    marker = _parsed(text) if text is not None and status is not None else None
    if marker is None or status is None:
        return text
    return replace(marker, watcher_running=bool(status.get("running"))).to_json() + "\n"


def _parsed(text: str) -> Marker | None:
    """A marker, or None for anything else (no JSON object: a torn or foreign file)."""
    try:
        return Marker.from_json(text)
    except (ValueError, WireError):
        return None


def as_marker(marker: Marker | Mapping[str, Any] | None) -> Marker | None:
    """A marker however given: typed, or the JSON object of one (tests, older callers)."""
    return Marker.from_dict(marker) if isinstance(marker, Mapping) else marker


def cached(cluster: str, cluster_id: str) -> Marker | None:
    """The marker this machine holds for the cluster, if it is this cluster's (same id: a cluster
    of the same name from before has another)."""
    marker = read_marker(marker_path(cluster))
    if marker is None or marker.cluster_id not in (None, cluster_id):
        return None
    return marker


def forget(cluster: str) -> None:
    """A new head (or autodown turned off): what the last watcher said no longer applies."""
    marker_path(cluster).unlink(missing_ok=True)


def decide(marker: Marker | Mapping[str, Any] | None, idle_minutes: float, left: bool | None,
           last_word_may_be_lost: bool) -> AutodownView | None:
    """The one decision "busy / idle N of M / silent / removed itself", from this machine's copy
    of the marker and what the provider lists of the cluster (`left`; None: not asked).

    A marker saying "removing"/"removed" counts only once nothing of the cluster is listed; while
    something is, the cluster is being removed. With `last_word_may_be_lost` (a head that deletes
    its own machine may be gone before this machine read its last marker), nothing left after a
    countdown counts as a self-removal at the end of that countdown (`gone_view`).
    """
    marker = as_marker(marker)
    if marker is None and not idle_minutes:
        return None
    report = view(marker, idle_minutes)
    if left:
        if report.removed_at:
            return replace(report, removed_at=None, detail="removing the cluster now")
        return report
    if left is False and last_word_may_be_lost:
        return gone_view(report, marker) or report
    return report


#: A watcher silent for longer than this (or five of its intervals) is reported as silent.
SILENT_AFTER_S = 120.0


def view(given: Marker | Mapping[str, Any] | None, idle_minutes: float,
         now: dt.datetime | None = None) -> AutodownView:
    """An `AutodownView` from a watcher's marker (None: no marker seen yet; `now` for tests)."""
    marker = as_marker(given)
    if marker is None:
        return AutodownView(idle_minutes, detail="no report from the watcher yet")
    # A head that ends its own job or VM may not live to write "removed": "removing" and its time
    # count once the provider no longer lists the cluster (the caller checks that).
    removed = (marker.removed_at or marker.removing_at
               if marker.phase in ("removed", "removing") else None)
    detail = str(marker.detail or "")
    if marker.phase == "failed":
        detail = f"removal FAILED: {marker.error}"
    elif marker.phase == "removing":
        detail = "removing the cluster now"
    idle = marker.idle_s if marker.idle_since else None
    running = marker.watcher_running
    return AutodownView(float(marker.idle_minutes or idle_minutes),
                        float(idle) if idle is not None else None, removed, detail,
                        _silent_since(marker, now),
                        running if isinstance(running, bool) and not removed else None)


def _silent_since(marker: Marker, now: dt.datetime | None) -> str | None:
    """The last check's time when a watching watcher has missed several checks since."""
    checked = marker.checked_at
    if marker.phase != "watching" or not checked:
        return None
    try:
        when = dt.datetime.fromisoformat(str(checked))
    except ValueError:
        return None
    # A few missed checks, and never less than two minutes: a busy head can be slow to answer.
    allowed = max(SILENT_AFTER_S, 5 * float(marker.interval_s or 30))
    now = now or dt.datetime.now(dt.timezone.utc)
    return str(checked) if (now - when).total_seconds() > allowed else None


def gone_view(report: AutodownView | None,
              given: Marker | Mapping[str, Any] | None) -> AutodownView | None:
    """For a cluster whose machines are all gone (the caller checked with the provider): an
    `AutodownView` saying it removed itself, when the last marker this machine saw from its head
    was this cluster's watcher; else None (last seen busy: something else removed it). The time is
    the marker's own, or (a head deleting itself cannot report it) when the idle period it last
    reported ran out."""
    marker = as_marker(given)
    if report is None or marker is None:
        return None
    if report.removed_at:
        return report
    since = marker.idle_since
    if not since:
        return None
    ended = dt.datetime.fromisoformat(str(since)) + dt.timedelta(minutes=report.idle_minutes)
    # Silent it is, of course: its head is gone.
    return replace(report, removed_at=ended.isoformat(timespec="seconds"),
                   detail="time from its last report", silent_since=None)


def describe(view: AutodownView) -> str:
    """One line for `status`: the countdown, or the self-removal."""
    minutes = f"{view.idle_minutes:g}"
    if view.removed_at:
        return f"removed itself after {minutes} idle minutes at {local_time(view.removed_at)}"
    if view.watcher_running is False:
        return (f"autodown: watcher not running: the cluster will not remove itself after "
                f"{minutes} idle minutes; `invoke up` starts the watcher again")
    if view.silent_since:
        return (f"autodown: no report from the cluster's watcher since "
                f"{local_time(view.silent_since)} (it stopped, or its head is unreachable): the "
                f"cluster may not remove itself; `invoke up` starts the watcher again")
    if view.idle_s is not None:
        idle = view.idle_s / 60
        shown = f"{idle:.0f}" if view.idle_minutes >= 5 else f"{idle:.1f}"
        return f"autodown: idle {shown} of {minutes} min ({view.detail})"
    return f"autodown: busy ({view.detail}); removes itself after {minutes} idle minutes"


def local_time(iso: str) -> str:
    """HH:MM in this machine's time zone (the date too when it is not today)."""
    try:
        when = dt.datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return iso
    if when.date() == dt.datetime.now().astimezone().date():
        return when.strftime("%H:%M")
    return when.strftime("%Y-%m-%d %H:%M")
