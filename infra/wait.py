"""The laptop's one wait/retry loop, on tenacity (the nodes have `infra.node.retry`, stdlib only).

`until` polls a check until it returns something; `retry` calls again after an error it was told
is passing. Both check at least once and keep going until `timeout` seconds have passed since the
first call, then raise what the caller says (its own wording, naming what did not happen).
`ui.wait_for` is `until` with progress on the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

import tenacity

T = TypeVar("T")


def until(check: Callable[[], T | None], timeout: float, interval: float,
          on_timeout: Callable[[], BaseException],
          sleep: Callable[[float], None] = time.sleep) -> T:
    """`check()` every `interval` seconds until it returns something other than None (returned);
    `on_timeout()` is raised once `timeout` seconds have passed without. An error `check`
    raises ends the wait at once (a resource that failed is not worth waiting for)."""

    def give_up(_: tenacity.RetryCallState) -> NoReturn:
        raise on_timeout()

    retrying: tenacity.Retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout), wait=tenacity.wait_fixed(interval),
        retry=tenacity.retry_if_result(lambda found: found is None),
        retry_error_callback=give_up, sleep=sleep, reraise=True)
    found = retrying(check)
    assert found is not None  # `retry_if_result` retries None; `give_up` raises
    return found


def retry(call: Callable[[], T], retry_on: tuple[type[BaseException], ...], timeout: float,
          interval: float, *, attempts: int | None = None, increment: float = 0.0,
          passing: Callable[[BaseException], bool] = lambda _: True,
          on_retry: Callable[[BaseException], None] | None = None,
          sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, again while it raises one of `retry_on` that `passing` accepts, pausing
    `interval` seconds (`increment` more after each try), until `timeout` seconds have passed
    or `attempts` calls were made: then its last error is raised as it was. `on_retry` hears of
    each error that is tried again (to tell the user)."""
    stop: tenacity.stop.stop_base = tenacity.stop_after_delay(timeout)
    if attempts is not None:
        stop = stop | tenacity.stop_after_attempt(attempts)

    def told(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            error = state.outcome.exception()
            if error is not None:
                on_retry(error)

    retrying: tenacity.Retrying = tenacity.Retrying(
        stop=stop, wait=tenacity.wait_incrementing(start=interval, increment=increment),
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, retry_on) and passing(exc)),
        before_sleep=told, sleep=sleep, reraise=True)
    return retrying(call)
