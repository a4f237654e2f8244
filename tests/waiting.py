"""The one wait of the test suite: poll a check until it holds, or fail naming what never came.

Every test that waits for something to happen (a port to answer, a process to go, a node to join,
a watcher's marker to appear) waits here, on the state it means, never for a fixed time. Built on
tenacity, as the laptop's own waits are (the nodes keep their stdlib `infra.node.retry`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

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
