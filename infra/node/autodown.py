"""Whole-cluster autodown, enforced by the cluster itself: a watcher that runs beside the Ray head.

Ray's autoscaler removes idle *workers*, never the head, so a forgotten cluster bills until someone
remembers it. The watcher asks Ray on the head, every few seconds, whether anything is going on:

- a job (Ray's job API) pending or running, or a driver / Ray Client session connected (drivers
  are listed there too, as `DRIVER` jobs, while they live);
- a task not yet finished or failed (pending ones included: they are what the autoscaler scales for);
- an actor that is not dead (a detached actor serves someone even without a driver).

When none of these has been seen for `idle_minutes`, it runs the provider's removal action (a
function named in its config, e.g. `infra.node.local.autodown:remove`): the workers go first,
then the head itself. Everything it sees and does goes into a small JSON marker, which `invoke
status` reads for its countdown and the next `status`/`up`/`teardown` for "removed itself at ...".
If Ray does not answer at all, that counts as idle: a head whose Ray is gone can run nothing.

Runs as `python -m infra.node.autodown --config FILE` with only Ray, requests and this package
importable (the head of a remote cluster has nothing more); it never connects to Ray as a driver,
which would keep the cluster busy itself. The laptop's side (the marker's cached copy and what
`status` makes of it) is infra/core/autodown/view.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.node.autodown_marker import Marker
from infra.node.files import atomic_write
from infra.node.wire import VERSION, Wire, WireError

#: On a remote head, relative to the login user's home (0700 folder, as the token's): the
#: watcher's config (its pid file beside it), marker and log.
HEAD_CONFIG = "~/.rayfleet/autodown.json"
HEAD_MARKER = "~/.rayfleet/autodown-marker.json"
HEAD_LOG = "~/.rayfleet/autodown.log"

_ACTIVE_JOB = {"PENDING", "RUNNING"}
_DONE_TASK = ("FINISHED", "FAILED")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Config(Wire):
    """What the provider's `up` writes for the watcher (a 0600 JSON file; never a secret inside:
    the token and API keys are named by path)."""

    KIND = "the autodown watcher's config"

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
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Config:
        return cls.from_json(path.read_text())

    def interval(self) -> float:
        if self.poll_s:
            return self.poll_s
        return min(30.0, max(1.0, self.idle_minutes * 60 / 20))


def config_text(config: Config) -> str:
    """The config file's whole text (what `write_config` writes, what a head's copy is compared
    with)."""
    return config.to_json() + "\n"


def write_config(path: Path, config: Config) -> None:
    """Write the watcher's config, 0600 (it names the token file)."""
    atomic_write(path, config_text(config), mode=0o600)


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
        self._resume()
        self.marker = Marker(
            cluster=config.cluster, cluster_id=config.cluster_id,
            idle_minutes=config.idle_minutes, started_at=now_iso(), pid=os.getpid(),
            phase="watching", idle_since=self._idle_since_iso, idle_s=0.0, detail="",
            interval_s=config.interval())

    def _resume(self) -> None:
        """Take the countdown over from this cluster's marker, when a watcher before this one
        (killed, crashed, restarted by its supervisor) was counting: a restart must not buy the
        cluster another idle period. The marker's wall-clock start maps onto this clock."""
        try:
            old = Marker.from_json(Path(self.config.marker).expanduser().read_text())
            since = dt.datetime.fromisoformat(str(old.idle_since)) if old.idle_since else None
        except (OSError, ValueError, TypeError, WireError):
            return
        if since is None or old.cluster_id != self.config.cluster_id:
            return
        ago = max(0.0, (dt.datetime.now(dt.timezone.utc) - since).total_seconds())
        self._idle_since, self._idle_since_iso = self._clock() - ago, str(old.idle_since)
        log(f"resuming the countdown: idle since {self._idle_since_iso}")

    def _write(self) -> None:
        atomic_write(Path(self.config.marker).expanduser(), self.marker.to_json() + "\n")

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
        self.marker = replace(self.marker, checked_at=now_iso(), detail=detail,
                              idle_s=round(idle_s, 1), idle_since=self._idle_since_iso)
        self._write()
        return self._idle_since is not None and idle_s >= self.config.idle_minutes * 60

    def remove(self) -> None:
        """Run the provider's removal action; the marker says what happened."""
        self.marker = replace(self.marker, phase="removing", removing_at=now_iso())
        self._write()
        module, _, function = self.config.action.partition(":")
        action = getattr(importlib.import_module(module), function)
        try:
            action(self.config.action_args, log)
        except Exception as exc:
            self.marker = replace(self.marker, phase="failed",
                                  error=f"{type(exc).__name__}: {exc}"[:300])
            self._write()
            raise
        self.marker = replace(self.marker, phase="removed", removed_at=now_iso())
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
    parser = argparse.ArgumentParser(prog="python -m infra.node.autodown",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="the watcher's JSON config")
    args = parser.parse_args(argv)
    # Run under infra/node/supervise.py, which keeps the pid file and starts it again if it dies.
    Watcher(Config.load(args.config.expanduser())).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
