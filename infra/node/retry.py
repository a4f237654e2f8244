"""The one poll/retry loop of the node package (standard library only, so it runs on any head).

`poll` waits for a condition with a deadline; `retry` calls again after an error it was told is
passing (a busy slurmctld, a rate limit), with growing pauses. Laptop code may use it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PollTimeout(RuntimeError):
    """The condition did not hold before the deadline."""


def poll(check: Callable[[], T | None], timeout: float, interval: float, what: str,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> T:
    """`check()` until it returns something truthy (returned); PollTimeout("<what> after Ns")
    once `timeout` seconds have passed without. `check` runs at least once."""
    deadline = clock() + timeout
    while True:
        found = check()
        if found:
            return found
        if clock() > deadline:
            raise PollTimeout(f"{what} after {timeout:g}s")
        sleep(interval)


def retry(call: Callable[[], T], retry_on: tuple[type[BaseException], ...], attempts: int,
          backoff: Callable[[int], float] = lambda attempt: float(2 ** attempt),
          sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, again after an error of `retry_on` (pausing `backoff(attempt)` seconds), at most
    `attempts` times in all; the last error is raised."""
    for attempt in range(attempts):
        try:
            return call()
        except retry_on:
            if attempt == attempts - 1:
                raise
            sleep(backoff(attempt))
    raise ValueError("attempts must be at least 1")
