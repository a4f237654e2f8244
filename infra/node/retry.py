"""The one poll/retry loop of the node package (standard library only, so it runs on any head).

`poll` waits for a condition with a deadline; `retry` calls again after an error it was told is
passing (a busy slurmctld, a rate limit), with growing pauses, within a number of calls or a
patience. The laptop's counterpart is `infra/wait.py` (tenacity, which the nodes need not have).
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


def retry(call: Callable[[], T], retry_on: tuple[type[BaseException], ...], attempts: int | None = None,
          backoff: Callable[[int], float] = lambda attempt: float(2 ** attempt),
          sleep: Callable[[float], None] = time.sleep, patience: float | None = None,
          passing: Callable[[BaseException], bool] = lambda _: True,
          clock: Callable[[], float] = time.monotonic) -> T:
    """`call()`, again after an error of `retry_on` that `passing` accepts, pausing
    `backoff(attempt)` seconds: at most `attempts` calls in all, and no pause that would end
    past `patience` seconds from the first call. The last error is raised as it was."""
    if attempts is not None and attempts < 1:
        raise ValueError("attempts must be at least 1")
    deadline = None if patience is None else clock() + patience
    attempt = 0
    while True:
        try:
            return call()
        except retry_on as exc:
            pause = backoff(attempt)
            attempt += 1
            if (not passing(exc) or (attempts is not None and attempt >= attempts)
                    or (deadline is not None and clock() + pause > deadline)):
                raise
            sleep(pause)
