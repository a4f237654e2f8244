"""The one wait of the test suite: poll a check until it answers, or fail naming what never came.

Every test that waits for something to happen (a port to answer, a process to go, a node to join,
a watcher's marker to appear) waits here, on the state it means, never for a fixed time. It is
rayfleet's own wait (`infra.node.wait.until`, the same meaning of an answer: None or False is
"not yet", anything else, 0 and [] included, is the answer), failing as a test fails.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from infra.node import wait

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 180,
               interval: float = 1.0) -> T:
    """`check()`'s first answer; an AssertionError naming `what` after `timeout` seconds (the
    check runs at least once). An exception `check` raises (e.g. an assertion that a process is
    still alive) ends the wait at once."""
    return wait.until(check, timeout, interval, on_timeout=lambda: AssertionError(
        f"timed out after {timeout:g} s waiting for {what}"))


def wait_while(check: Callable[[], object], what: str, timeout: float = 180,
               interval: float = 1.0) -> None:
    """Return once the condition `check()` no longer holds (e.g. a process still alive, a file
    still there); an AssertionError naming `what` after `timeout` seconds."""
    wait_until(lambda: not check(), what, timeout=timeout, interval=interval)


def watcher_checked(marker: Callable[[], dict[str, Any] | None], idle_minutes: float,
                    since: dt.datetime | None = None, timeout: float = 300,
                    interval: float = 1.0) -> dict[str, Any]:
    """The autodown watcher's marker once it holds a check made one idle period after `since`
    (default: now), e.g. after a job was submitted.

    What "the cluster stayed while busy" means: the watcher looked after a whole idle period had
    passed and did not remove it. A fixed sleep of "twice the idle period" also passed with a
    watcher that had died or never checked. `marker` reads the marker (a local watcher's file,
    or the copy `invoke status` keeps of a head's); its `checked_at` is the head's UTC time,
    which on the test bed is this machine's clock."""
    after = (since or dt.datetime.now(dt.timezone.utc)) + dt.timedelta(minutes=idle_minutes)

    def checked() -> dict[str, Any] | None:
        found = marker()
        at = (found or {}).get("checked_at")
        return found if at and dt.datetime.fromisoformat(at) >= after else None

    return wait_until(checked, f"the autodown watcher's first check after {after:%H:%M:%S} UTC",
                      timeout=idle_minutes * 60 + timeout, interval=interval)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None while it is not there yet."""
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None
