"""The one wait and the one retry (infra/node/wait.py), used by laptop code, node code and tests
alike; no deadline loop written by hand besides them. Pauses go through the injectable `sleep`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import ui
from infra.node import wait

ROOT = Path(__file__).resolve().parents[1]


class Boom(Exception):
    pass


class FakeClock:
    """A clock that only moves when `sleep` is called: the pauses a wait took, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_until_returns_the_first_answer_pausing_between_checks() -> None:
    answers: list[str | None] = [None, None, "ready"]
    pauses: list[float] = []
    assert wait.until(lambda: answers.pop(0), 60, 0.25, on_timeout=lambda: Boom("late"),
                      sleep=pauses.append) == "ready"
    assert answers == [] and pauses == [0.25, 0.25]
    # Falsy answers other than None and False are answers (a count of 0, an empty list).
    assert wait.until(lambda: 0, 60, 1, on_timeout=lambda: Boom("late")) == 0
    assert wait.until(lambda: [], 60, 1, on_timeout=lambda: Boom("late")) == []


def test_a_condition_that_does_not_hold_yet_is_not_an_answer() -> None:
    answers = iter([False, None, False, True])
    assert wait.until(lambda: next(answers), 60, 0, sleep=lambda _: None) is True


def test_until_raises_the_callers_error_once_the_time_is_up_and_checks_at_least_once() -> None:
    calls: list[int] = []

    def never() -> None:
        calls.append(1)

    with pytest.raises(Boom, match=r"^no answer$"):
        wait.until(never, 0, 0.01, on_timeout=lambda: Boom("no answer"))
    assert calls == [1]
    calls.clear()
    with pytest.raises(Boom):
        wait.until(never, 0.05, 0.01, on_timeout=lambda: Boom("no answer"))
    assert len(calls) >= 2


def test_until_names_what_never_came_by_default() -> None:
    with pytest.raises(wait.WaitTimeout, match=r"^timed out after 0s waiting for the moon; look up$"):
        wait.until(lambda: None, 0, 0.01, "the moon", hint="look up")


def test_until_never_sleeps_past_its_deadline() -> None:
    clock = FakeClock()
    with pytest.raises(wait.WaitTimeout):
        wait.until(lambda: None, 2.5, 1.0, "x", clock=clock, sleep=clock.sleep)
    assert clock.pauses == [1.0, 1.0, 0.5]


def test_an_error_in_the_check_ends_the_wait_at_once() -> None:
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise ValueError("instance unhealthy")

    with pytest.raises(ValueError, match="unhealthy"):
        wait.until(failing, 60, 0.01, on_timeout=lambda: Boom("late"))
    assert calls == [1]


def test_retry_pauses_longer_each_time_tells_each_retry_and_raises_the_last_error() -> None:
    errors = [Boom("500 one"), Boom("500 two"), Boom("500 three"), Boom("never reached")]
    pauses: list[float] = []
    told: list[str] = []

    def call() -> str:
        raise errors.pop(0)

    with pytest.raises(Boom, match="500 three"):
        wait.retry(call, (Boom,), attempts=3, backoff=lambda attempt: 2.0 + 3.0 * attempt,
                   sleep=pauses.append, on_retry=lambda exc: told.append(str(exc)))
    assert pauses == [2.0, 5.0] and told == ["500 one", "500 two"]
    assert [str(e) for e in errors] == ["never reached"]


def test_retry_stops_at_an_error_it_was_not_told_is_passing() -> None:
    errors = [Boom("500"), Boom("400 bad request"), Boom("500")]

    def call() -> str:
        raise errors.pop(0)

    with pytest.raises(Boom, match="400"):
        wait.retry(call, (Boom,), backoff=lambda _: 0.0, passing=lambda exc: "500" in str(exc),
                   sleep=lambda _: None)
    assert len(errors) == 1
    # Another type is never retried.
    with pytest.raises(KeyError):
        wait.retry(lambda: {}["x"], (Boom,), backoff=lambda _: 0.0)


def test_retry_returns_once_the_call_succeeds() -> None:
    answers: list[Exception | str] = [Boom("busy"), "done"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait.retry(call, (Boom,), backoff=lambda _: 0.0, sleep=lambda _: None) == "done"


def test_wait_for_shows_the_step_and_times_out_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(wait.WaitTimeout) as caught:
        ui.wait_for(lambda step: None, "the head to answer", timeout=0, interval=0.01,
                    hint="see `invoke status`")
    assert str(caught.value) == "timed out after 0s waiting for the head to answer; see `invoke status`"
    assert "the head to answer" in capsys.readouterr().err
    assert ui.wait_for(lambda step: "up", "the head to answer", timeout=1) == "up"
    # The laptop's wait means what the nodes' means: 0 is an answer, False is not yet.
    assert ui.wait_for(lambda step: 0, "a count", timeout=1) == 0


def test_retry_gives_up_before_a_pause_past_its_patience() -> None:
    clock = FakeClock()

    def call() -> str:
        raise Boom("busy")

    with pytest.raises(Boom):
        wait.retry(call, (Boom,), patience=10, backoff=lambda n: float(2 ** n),
                   sleep=clock.sleep, clock=clock)
    assert clock.pauses == [1.0, 2.0, 4.0]  # the next (8 s) would end past 10 s
    clock.pauses.clear()
    with pytest.raises(Boom):
        wait.retry(call, (Boom,), attempts=2, sleep=clock.sleep)
    assert clock.pauses == [1.0]
    with pytest.raises(Boom):
        wait.retry(call, (Boom,), passing=lambda _: False, sleep=clock.sleep)
    assert clock.pauses == [1.0]


# --- no wait written by hand ------------------------------------------------------------------------

#: Loops that still pause and watch a clock (or a bounded count) themselves, each for its reason.
#: (file, function): why it is not `wait.until`.
KNOWN_LOOPS = {
    ("infra/node/wait.py", "until"): "the one wait itself",
    ("infra/node/wait.py", "retry"): "the one retry itself",
    ("infra/node/wait.py", "until_async"): "the one wait itself, on an event loop",
    # Job scripts: they run on a cluster's nodes, where nothing of rayfleet is importable.
    ("tests/data/lambda_gpu_job.py", "<module>"): "a job script run where rayfleet is not",
    ("tests/data/privilege_probe.py", "tracking"): "a job script run where rayfleet is not",
}


def _loop_waits(tree: ast.AST, function: str = "<module>") -> Iterator[tuple[str, int]]:
    """(innermost enclosing function, line) of each loop that sleeps and watches a clock or a
    deadline, or (a `for`) sleeps until it breaks out: a wait written by hand."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _loop_waits(node, node.name)
            continue
        if isinstance(node, (ast.While, ast.For, ast.AsyncFor)):
            # One walk of the loop for all four questions (four walks were most of this scan).
            inside = list(ast.walk(node))
            called = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "")
                      for c in inside if isinstance(c, ast.Call)}
            named = {n.id for n in inside if isinstance(n, ast.Name)} | {
                n.attr for n in inside if isinstance(n, ast.Attribute)}
            clocked = bool(called & {"monotonic", "time", "perf_counter"}) or any(
                "deadline" in name.lower() for name in named)
            exits = any(isinstance(n, (ast.Return, ast.Break)) for n in inside)
            if "sleep" in called and (clocked or (not isinstance(node, ast.While) and exits)):
                yield function, node.lineno
                continue
        yield from _loop_waits(node, function)


def hand_waits(root: Path) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for path in sorted([*(root / "infra").rglob("*.py"), *(root / "tests").rglob("*.py")]):
        source = path.read_text()
        if "sleep" not in source:
            continue  # no loop here can call a sleep: not parsed (most files; ~1.5 CPU-s)
        for function, line in _loop_waits(ast.parse(source)):
            found.setdefault((str(path.relative_to(root)), function), line)
    return found


def test_no_new_wait_written_by_hand() -> None:
    found = hand_waits(ROOT)
    new = sorted(f"{path}:{line} ({function})" for (path, function), line in found.items()
                 if (path, function) not in KNOWN_LOOPS)
    assert new == [], f"use infra.node.wait.until (tests: tests/waiting.py) instead of: {new}"
    # The list holds no loop that is gone (it shrinks as they go).
    assert sorted(set(KNOWN_LOOPS) - set(found)) == []


def test_the_scan_finds_a_deadline_loop(tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "infra" / "x.py").write_text(
        "import time\n"
        "def ready(check):\n"
        "    deadline = time.monotonic() + 5\n"
        "    while not check():\n"
        "        if time.monotonic() > deadline:\n"
        "            raise TimeoutError\n"
        "        time.sleep(0.1)\n"
        "def gone(pid):\n"
        "    for _ in range(50):\n"
        "        if not alive(pid):\n"
        "            return True\n"
        "        time.sleep(0.1)\n"
        "def forever():\n"
        "    while True:\n"
        "        tick()\n"
        "        time.sleep(5)\n")
    assert hand_waits(tmp_path) == {("infra/x.py", "ready"): 4, ("infra/x.py", "gone"): 9}
