"""rayfleet's one wait and one retry, for laptop code, node code and tests alike.

Standard library only, so it runs on any head (infra/node ships there in a zip). `ui.wait_for` adds
the laptop's progress display on top; tests/waiting.py adds the tests' AssertionError.

`until` asks a check until it answers. The one meaning of an answer, everywhere: `None` is "not
yet", and so is `False` (a check that is a condition, such as `lambda: not nodes()`); anything
else is the answer and is returned, `0`, `[]` and `""` included. A check whose "not yet" is an
empty list says so: `lambda: found() or None`.

`retry` calls again after an error it was told is passing (a busy slurmctld, a rate limit, a 500
from a slow-starting service), with pauses that may grow, within a number of calls or a patience.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from infra.node.errors import RayfleetError

T = TypeVar("T")


class WaitTimeout(RayfleetError):
    """What a wait was for did not come in time."""


def _answered(found: object) -> bool:
    """Whether a check's result is an answer (see the module's docstring) rather than "not yet"."""
    return found is not None and found is not False


def until(check: Callable[[], T | None], timeout: float, interval: float, what: str = "", *,
          hint: str = "", on_timeout: Callable[[], BaseException] | None = None,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """`check()` every `interval` seconds until it answers (returned). Once `timeout` seconds have
    passed without an answer, `on_timeout()` is raised, or else WaitTimeout("timed out after Ns
    waiting for <what>; <hint>"). `check` runs at least once; an error it raises ends the wait at
    once (a resource that failed is not worth waiting for)."""
    deadline = clock() + timeout
    while True:
        found = check()
        if _answered(found):
            assert found is not None  # for the type checker: `_answered` excludes None
            return found
        if clock() >= deadline:
            if on_timeout is not None:
                raise on_timeout()
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}"
                              + (f"; {hint}" if hint else ""))
        # Never sleep past the deadline: the last check comes at it, not an interval after.
        sleep(max(0.0, min(interval, deadline - clock())))


async def until_async(check: Callable[[], Awaitable[T | None]], timeout: float, interval: float,
                      what: str = "") -> T:
    """`until` for code on an event loop (the gateway's): `check()` is awaited and the pauses are
    asyncio's, so the loop serves others meanwhile; the same answers, the same WaitTimeout."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if _answered(found):
            assert found is not None  # for the type checker: `_answered` excludes None
            return found
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def retry(call: Callable[[], T], retry_on: tuple[type[BaseException], ...], attempts: int | None = None,
          backoff: Callable[[int], float] = lambda attempt: float(2 ** attempt),
          sleep: Callable[[float], None] = time.sleep, patience: float | None = None,
          passing: Callable[[BaseException], bool] = lambda _: True,
          on_retry: Callable[[BaseException], None] | None = None,
          clock: Callable[[], float] = time.monotonic) -> T:
    """`call()`, again after an error of `retry_on` that `passing` accepts, pausing
    `backoff(attempt)` seconds (attempt 0, 1, ...): at most `attempts` calls in all, and no pause
    that would end past `patience` seconds from the first call. `on_retry` hears of each error that
    is tried again (to tell the user). The last error is raised as it was."""
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
            if on_retry is not None:
                on_retry(exc)
            sleep(pause)
