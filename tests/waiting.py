"""The one wait of the test suite: poll a check until it holds, or fail naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 180,
               interval: float = 1.0) -> T:
    """`check()` once it returns something truthy; an AssertionError naming `what` after `timeout`
    seconds (the check runs at least once)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
