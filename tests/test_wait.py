"""The one wait/retry loop on each side: `infra.wait` (tenacity, laptop) and `infra.node.retry`
(standard library, nodes). Pauses are recorded through the injectable `sleep`."""

from __future__ import annotations

import pytest

from infra import ui, wait
from infra.node import retry as node_retry


class Boom(Exception):
    pass


def test_until_returns_the_first_answer_pausing_between_checks() -> None:
    answers: list[str | None] = [None, None, "ready"]
    pauses: list[float] = []
    assert wait.until(lambda: answers.pop(0), 60, 0.25, lambda: Boom("late"),
                      sleep=pauses.append) == "ready"
    assert answers == [] and pauses == [0.25, 0.25]
    # Falsy answers other than None are answers (a count of 0, an empty list).
    assert wait.until(lambda: 0, 60, 1, lambda: Boom("late")) == 0


def test_until_raises_the_callers_error_once_the_time_is_up_and_checks_at_least_once() -> None:
    calls: list[int] = []

    def never() -> None:
        calls.append(1)

    with pytest.raises(Boom, match=r"^no answer$"):
        wait.until(never, 0, 0.01, lambda: Boom("no answer"))
    assert calls == [1]
    calls.clear()
    with pytest.raises(Boom):
        wait.until(never, 0.05, 0.01, lambda: Boom("no answer"))
    assert len(calls) >= 2


def test_an_error_in_the_check_ends_the_wait_at_once() -> None:
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise ValueError("instance unhealthy")

    with pytest.raises(ValueError, match="unhealthy"):
        wait.until(failing, 60, 0.01, lambda: Boom("late"))
    assert calls == [1]


def test_retry_pauses_longer_each_time_tells_each_retry_and_raises_the_last_error() -> None:
    errors = [Boom("500 one"), Boom("500 two"), Boom("500 three"), Boom("never reached")]
    pauses: list[float] = []
    told: list[str] = []

    def call() -> str:
        raise errors.pop(0)

    with pytest.raises(Boom, match="500 three"):
        wait.retry(call, (Boom,), 60, 2.0, attempts=3, increment=3.0, sleep=pauses.append,
                   on_retry=lambda exc: told.append(str(exc)))
    assert pauses == [2.0, 5.0] and told == ["500 one", "500 two"]
    assert [str(e) for e in errors] == ["never reached"]


def test_retry_stops_at_an_error_it_was_not_told_is_passing() -> None:
    errors = [Boom("500"), Boom("400 bad request"), Boom("500")]

    def call() -> str:
        raise errors.pop(0)

    with pytest.raises(Boom, match="400"):
        wait.retry(call, (Boom,), 60, 0.0, passing=lambda exc: "500" in str(exc), sleep=lambda _: None)
    assert len(errors) == 1
    # Another type is never retried.
    with pytest.raises(KeyError):
        wait.retry(lambda: {}["x"], (Boom,), 60, 0.0)


def test_retry_returns_once_the_call_succeeds() -> None:
    answers: list[Exception | str] = [Boom("busy"), "done"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait.retry(call, (Boom,), 60, 0.0, sleep=lambda _: None) == "done"


def test_wait_for_shows_the_step_and_times_out_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ui.WaitTimeout) as caught:
        ui.wait_for(lambda step: None, "the head to answer", timeout=0, interval=0.01,
                    hint="see `invoke status`")
    assert str(caught.value) == "timed out after 0s waiting for the head to answer; see `invoke status`"
    assert "the head to answer" in capsys.readouterr().err
    assert ui.wait_for(lambda step: "up", "the head to answer", timeout=1) == "up"


def test_node_retry_gives_up_before_a_pause_past_its_patience() -> None:
    clock = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        clock[0] += seconds

    def call() -> str:
        raise Boom("busy")

    with pytest.raises(Boom):
        node_retry.retry(call, (Boom,), patience=10, backoff=lambda n: float(2 ** n),
                         sleep=sleep, clock=lambda: clock[0])
    assert pauses == [1.0, 2.0, 4.0]  # the next (8 s) would end past 10 s
    pauses.clear()
    with pytest.raises(Boom):
        node_retry.retry(call, (Boom,), attempts=2, sleep=sleep)
    assert pauses == [1.0]
    with pytest.raises(Boom):
        node_retry.retry(call, (Boom,), passing=lambda _: False, sleep=sleep)
    assert pauses == [1.0]
