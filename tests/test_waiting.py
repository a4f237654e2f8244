"""The tests' one wait (tests/waiting.py): it returns what came, names what never came, stops at
once on an error, and reads the autodown watcher's marker by its check time."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest

from tests.waiting import read_json, wait_until, wait_while, watcher_checked


def test_wait_until_returns_the_first_answer_as_rayfleet_s_own_wait_does() -> None:
    # The one meaning (infra/node/wait.py): None and False are "not yet"; 0 and [] are answers.
    answers = iter([None, False, 0, "found"])
    assert wait_until(lambda: next(answers), "an answer", timeout=5, interval=0.01) == 0
    answers = iter([None, [], "found"])
    assert wait_until(lambda: next(answers), "an answer", timeout=5, interval=0.01) == []
    answers = iter([None, False, "found"])
    assert wait_until(lambda: next(answers), "an answer", timeout=5, interval=0.01) == "found"


def test_wait_until_names_what_never_came() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.2 s waiting for the moon"):
        wait_until(lambda: None, "the moon", timeout=0.2, interval=0.05)


def test_an_error_in_the_check_ends_the_wait_at_once() -> None:
    calls = itertools.count()

    def check() -> None:
        next(calls)
        raise AssertionError("the process died")

    with pytest.raises(AssertionError, match="the process died"):
        wait_until(check, "anything", timeout=30, interval=0.01)
    assert next(calls) == 1


def test_wait_while_returns_once_the_check_is_falsy() -> None:
    left = iter([3, 2, 0])
    wait_while(lambda: next(left), "the countdown", timeout=5, interval=0.01)
    with pytest.raises(AssertionError, match="the stuck thing"):
        wait_while(lambda: True, "the stuck thing", timeout=0.1, interval=0.02)


def _iso(when: dt.datetime) -> str:
    return when.isoformat(timespec="seconds")


def test_watcher_checked_waits_for_a_check_one_idle_period_later(tmp_path: Path) -> None:
    marker = tmp_path / "marker.json"
    assert read_json(marker) is None  # not written yet
    now = dt.datetime.now(dt.timezone.utc)
    marker.write_text(f'{{"checked_at": "{_iso(now - dt.timedelta(seconds=5))}"}}')
    # A check made before the idle period ended does not count: the wait runs out.
    with pytest.raises(AssertionError, match="the autodown watcher's first check after"):
        watcher_checked(lambda: read_json(marker), idle_minutes=0.01, timeout=0.5, interval=0.05)
    # One made after it does.
    later = _iso(now + dt.timedelta(minutes=1))
    marker.write_text(f'{{"checked_at": "{later}", "detail": "1 job(s) running"}}')
    found = watcher_checked(lambda: read_json(marker), idle_minutes=0.01, since=now,
                            timeout=5, interval=0.05)
    assert found["detail"] == "1 job(s) running"
