"""The one wait of the test suite: poll a check until it holds, or fail naming what never came.

Every test that waits for something to happen (a port to answer, a process to go, a node to join,
a watcher's marker to appear) waits here, on the state it means, never for a fixed time. Built on
tenacity, as the laptop's own waits are (the nodes keep their stdlib `infra.node.retry`).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import tenacity

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 180,
               interval: float = 1.0) -> T:
    """`check()` once it returns something truthy; an AssertionError naming `what` after `timeout`
    seconds (the check runs at least once). An exception `check` raises (e.g. an assertion
    that a process is still alive) ends the wait at once."""

    def give_up(_: tenacity.RetryCallState) -> NoReturn:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")

    retrying: tenacity.Retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout), wait=tenacity.wait_fixed(interval),
        retry=tenacity.retry_if_result(lambda found: not found),
        retry_error_callback=give_up, sleep=time.sleep, reraise=True)
    found: T = retrying(check)
    return found


def wait_while(check: Callable[[], object], what: str, timeout: float = 180,
               interval: float = 1.0) -> None:
    """Return once `check()` is falsy (e.g. a process still alive, a file still there); an
    AssertionError naming `what` after `timeout` seconds."""
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
