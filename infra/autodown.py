"""Whole-cluster autodown, enforced by the cluster itself: a watcher that runs beside the Ray head.

Ray's autoscaler removes idle *workers*, never the head, so a forgotten cluster bills until someone
remembers it. The watcher asks Ray on the head, every few seconds, whether anything is going on:

- a job (Ray's job API) pending or running, or a driver / Ray Client session connected (drivers
  are listed there too, as `DRIVER` jobs, while they live);
- a task not yet finished or failed (pending ones included: they are what the autoscaler scales for);
- an actor that is not dead (a detached actor serves someone even without a driver).

When none of these has been seen for `idle_minutes`, it runs the provider's removal action (a
function named in its config, e.g. `infra.providers.local_autodown:remove`): the workers go first,
then the head itself. Everything it sees and does goes into a small JSON marker, which `invoke
status` reads for its countdown and the next `status`/`up`/`teardown` for "removed itself at ...".
If Ray does not answer at all, that counts as idle: a head whose Ray is gone can run nothing.

Runs as `python -m infra.autodown --config FILE` with only Ray, requests and our small core modules
importable (the head of a remote cluster has nothing more); it never connects to Ray as a driver,
which would keep the cluster busy itself.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: File names, relative to RAYFLEET_HOME on the laptop (`marker_path`) or given in the config.
MARKER_DIR = "autodown"

_ACTIVE_JOB = {"PENDING", "RUNNING"}
_DONE_TASK = ("FINISHED", "FAILED")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Config:
    """What the provider's `up` writes for the watcher (a 0600 JSON file; never a secret inside:
    the token and API keys are named by path)."""

    cluster: str
    cluster_id: str
    idle_minutes: float
    #: The head's dashboard as seen from where the watcher runs (loopback on the head).
    dashboard_url: str
    #: Where the marker goes (written atomically at every check).
    marker: str
    #: "module:function" called as function(args, log) to remove the cluster.
    action: str
    #: Arguments for the action (paths, ids, zone); no secrets, only paths to them.
    action_args: dict[str, Any] = field(default_factory=dict)
    #: The cluster's Ray token file; None when the cluster runs without auth.
    token_path: str | None = None
    #: Seconds between checks; None picks one from idle_minutes (1-30 s).
    poll_s: float | None = None

    @classmethod
    def load(cls, path: Path) -> Config:
        data = json.loads(path.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def interval(self) -> float:
        if self.poll_s:
            return self.poll_s
        return min(30.0, max(1.0, self.idle_minutes * 60 / 20))


def write_config(path: Path, config: Config) -> None:
    """Write the watcher's config, 0600 (it names the token file)."""
    from infra.state import atomic_write

    atomic_write(path, json.dumps(config.__dict__, indent=2) + "\n", mode=0o600)


def marker_path(cluster: str) -> Path:
    """Where this machine keeps a cluster's watcher marker (written by a local watcher directly,
    cached here by remote providers from what they read on the head)."""
    from infra import paths

    return paths.home() / MARKER_DIR / f"{cluster}.json"


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _headers(token_path: str | None) -> dict[str, str]:
    if not token_path:
        return {}
    token = Path(token_path).expanduser().read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def _state_api(session: Any, url: str, resource: str, exclude: tuple[str, ...]) -> int:
    """How many `resource` entries (tasks, actors) are in a state other than `exclude`."""
    params: list[tuple[str, str]] = [("limit", "100"), ("detail", "false")]
    for value in exclude:
        params += [("filter_keys", "state"), ("filter_predicates", "!="), ("filter_values", value)]
    answer = session.get(f"{url}/api/v0/{resource}", params=params, timeout=10)
    answer.raise_for_status()
    # `total` counts before filtering; the entries left after the filter are what matters.
    return len(answer.json()["data"]["result"]["result"])


def busy_reasons(url: str, token_path: str | None, session: Any = None) -> list[str]:
    """What keeps the cluster busy now, read from Ray's job and state APIs; [] means idle.

    Raises on any failure to ask (the caller decides what an unanswering Ray means).
    """
    import requests

    session = session or requests.Session()
    session.headers.update(_headers(token_path))
    reasons = []
    answer = session.get(f"{url}/api/jobs/", timeout=10)
    answer.raise_for_status()
    jobs = [j for j in answer.json() if str(j.get("status")) in _ACTIVE_JOB]
    submitted = [j for j in jobs if j.get("type") == "SUBMISSION"]
    drivers = [j for j in jobs if j.get("type") != "SUBMISSION"]
    if submitted:
        reasons.append(f"{len(submitted)} job(s) pending or running")
    if drivers:
        reasons.append(f"{len(drivers)} driver(s) or Ray Client session(s) connected")
    tasks = _state_api(session, url, "tasks", _DONE_TASK)
    if tasks:
        reasons.append(f"{tasks} task(s) pending or running")
    actors = _state_api(session, url, "actors", ("DEAD",))
    if actors:
        reasons.append(f"{actors} actor(s) alive or pending")
    # A deployed Serve application waits for requests that Ray cannot see coming: busy. (Its
    # actors keep the cluster busy already; this names why. Asked only then: the endpoint makes
    # the dashboard connect to Ray.)
    # An answer that fails or is slow changes nothing: the actors count as busy already.
    if actors:
        with contextlib.suppress(Exception):
            serving = session.get(f"{url}/api/serve/applications/", timeout=10)
            apps = serving.json().get("applications") if serving.status_code == 200 else None
            if apps:
                reasons.append(f"serving {len(apps)} Serve application(s)")
    return reasons


class Watcher:
    """The idle clock and the marker; `step` is one check, `run` loops until removal."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic,
                 check: Callable[[], list[str]] | None = None) -> None:
        self.config = config
        self._clock = clock
        self._check = check or (lambda: busy_reasons(config.dashboard_url, config.token_path))
        self._idle_since: float | None = None
        self._idle_since_iso: str | None = None
        self.marker: dict[str, Any] = {
            "cluster": config.cluster, "cluster_id": config.cluster_id,
            "idle_minutes": config.idle_minutes, "started_at": now_iso(), "pid": os.getpid(),
            "phase": "watching", "idle_since": None, "idle_s": 0.0, "detail": "",
            "checked_at": None, "removed_at": None, "error": None,
            "interval_s": config.interval(),
        }

    def _write(self) -> None:
        path = Path(self.config.marker).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.marker, indent=2) + "\n")
        os.replace(tmp, path)

    def step(self) -> bool:
        """Check once; True when the cluster has been idle for the whole period."""
        try:
            reasons = self._check()
            detail = "; ".join(reasons) if reasons else "idle"
        except Exception as exc:  # Ray not answering: nothing can run there, so it is idle time
            reasons = []
            detail = f"Ray not answering ({type(exc).__name__})"
        now = self._clock()
        if reasons:
            self._idle_since, self._idle_since_iso = None, None
        elif self._idle_since is None:
            self._idle_since, self._idle_since_iso = now, now_iso()
        idle_s = 0.0 if self._idle_since is None else now - self._idle_since
        self.marker.update(checked_at=now_iso(), detail=detail, idle_s=round(idle_s, 1),
                           idle_since=self._idle_since_iso)
        self._write()
        return self._idle_since is not None and idle_s >= self.config.idle_minutes * 60

    def remove(self) -> None:
        """Run the provider's removal action; the marker says what happened."""
        self.marker.update(phase="removing", removing_at=now_iso())
        self._write()
        module, _, function = self.config.action.partition(":")
        action = getattr(importlib.import_module(module), function)
        try:
            action(self.config.action_args, log)
        except Exception as exc:
            self.marker.update(phase="failed", error=f"{type(exc).__name__}: {exc}"[:300])
            self._write()
            raise
        self.marker.update(phase="removed", removed_at=now_iso())
        self._write()

    def run(self) -> None:
        log(f"watching {self.config.cluster} ({self.config.dashboard_url}): removal after "
            f"{self.config.idle_minutes:g} idle minutes, a check every {self.config.interval():g}s")
        while not self.step():
            time.sleep(self.config.interval())
        log(f"idle for {self.config.idle_minutes:g} minutes: removing the cluster")
        self.remove()
        log("removed")


def log(message: str) -> None:
    print(f"{now_iso()} autodown: {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.autodown", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="the watcher's JSON config")
    args = parser.parse_args(argv)
    path = args.config.expanduser()
    # The pid file lets `autodown_remote.start_command` (a second `up`) see that a watcher already runs.
    Path(f"{path}.pid").write_text(f"{os.getpid()}\n")
    Watcher(Config.load(path)).run()
    return 0


# --- remote heads: where the watcher's files live there, and how `up` starts it -------------------

#: On a remote head, relative to the login user's home (0700 folder, as the token's).
HEAD_CONFIG = "~/.rayfleet/autodown.json"
HEAD_MARKER = "~/.rayfleet/autodown-marker.json"
HEAD_LOG = "~/.rayfleet/autodown.log"


def cache_marker(cluster: str, text: str) -> None:
    """Keep what a provider read from its head's marker, for `status` after the head is gone."""
    try:
        data = json.loads(text)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    from infra.state import atomic_write

    atomic_write(marker_path(cluster), json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())


# --- the laptop's side: what `status`, `up` and `teardown` make of a marker -----------------------

#: A watcher silent for longer than this (or five of its intervals) is reported as silent.
SILENT_AFTER_S = 120.0


def view(marker: dict[str, Any] | None, idle_minutes: float, now: dt.datetime | None = None) -> Any:
    """An `AutodownView` from a watcher's marker (None: no marker seen yet; `now` for tests)."""
    from infra.providers.base import AutodownView

    if marker is None:
        return AutodownView(idle_minutes, detail="no report from the watcher yet")
    # A head that ends its own job or VM may not live to write "removed": "removing" and its time
    # count once the provider no longer lists the cluster (the caller checks that).
    removed = (marker.get("removed_at") or marker.get("removing_at")
               if marker.get("phase") in ("removed", "removing") else None)
    detail = str(marker.get("detail") or "")
    if marker.get("phase") == "failed":
        detail = f"removal FAILED: {marker.get('error')}"
    elif marker.get("phase") == "removing":
        detail = "removing the cluster now"
    idle = marker.get("idle_s") if marker.get("idle_since") else None
    return AutodownView(float(marker.get("idle_minutes") or idle_minutes),
                        float(idle) if idle is not None else None, removed, detail,
                        _silent_since(marker, now))


def _silent_since(marker: dict[str, Any], now: dt.datetime | None) -> str | None:
    """The last check's time when a watching watcher has missed several checks since."""
    checked = marker.get("checked_at")
    if marker.get("phase") != "watching" or not checked:
        return None
    try:
        when = dt.datetime.fromisoformat(str(checked))
    except ValueError:
        return None
    # A few missed checks, and never less than two minutes: a busy head can be slow to answer.
    allowed = max(SILENT_AFTER_S, 5 * float(marker.get("interval_s") or 30))
    now = now or dt.datetime.now(dt.timezone.utc)
    return str(checked) if (now - when).total_seconds() > allowed else None


def gone_view(report: Any, marker: dict[str, Any] | None) -> Any:
    """For a cluster whose machines are all gone (the caller checked with the provider): an
    `AutodownView` saying it removed itself, when the last marker this machine saw from its head
    was this cluster's watcher; else None (last seen busy: something else removed it). The time is
    the marker's own, or (a head deleting itself cannot report it) when the idle period it last
    reported ran out."""
    if report is None or marker is None:
        return None
    if report.removed_at:
        return report
    since = marker.get("idle_since")
    if not since:
        return None
    from dataclasses import replace

    ended = dt.datetime.fromisoformat(str(since)) + dt.timedelta(minutes=report.idle_minutes)
    # Silent it is, of course: its head is gone.
    return replace(report, removed_at=ended.isoformat(timespec="seconds"),
                   detail="time from its last report", silent_since=None)


def describe(view: Any) -> str:
    """One line for `status`: the countdown, or the self-removal."""
    minutes = f"{view.idle_minutes:g}"
    if view.removed_at:
        return f"removed itself after {minutes} idle minutes at {local_time(view.removed_at)}"
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
