"""Terminal output: results on stdout, progress on stderr.

Every wait that can last more than a couple of seconds goes through `step` or `wait_for`, so the
user always sees what rayfleet is waiting for and for how long. Off a terminal (CI, pipes) the
spinner becomes plain lines, printed when the detail changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from infra.node import wait

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")


_consoles: dict[str, Console] = {}


def _console(stream: str) -> Console:
    if stream not in _consoles:
        from rich.console import Console

        console = Console(stderr=stream == "err", highlight=False, soft_wrap=True)
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            # Off a terminal (a pipe, a file, CI) nothing wraps or cuts: rich would assume 80
            # columns and shorten table cells to "autodo…".
            console.width = 10_000
        _consoles[stream] = console
    return _consoles[stream]


def out(*objects: Any, **options: Any) -> None:
    """Print a result (stdout): tables, URLs, JSON."""
    _console("out").print(*objects, **options)


def info(message: str) -> None:
    """Print a progress or advice line (stderr)."""
    _console("err").print(message)


def warn(message: str) -> None:
    _console("err").print(f"[yellow]warning:[/yellow] {message}")


class Step:
    """A running step; `detail` changes the text shown next to it."""

    def __init__(self, what: str, live: Any) -> None:
        self.what = what
        self.started = time.monotonic()
        self._live = live
        self._detail = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def detail(self, text: str) -> None:
        if text == self._detail:
            return
        self._detail = text
        if self._live is not None:
            self._live.update(f"{self.what}: {text}")
        else:
            info(f"  {self.what}: {text}")


@contextmanager
def step(what: str) -> Iterator[Step]:
    """Show `what` with a spinner while the block runs, then a ✓ or ✗ line with the duration."""
    console = _console("err")
    if console.is_terminal:
        with console.status(what) as live:
            handle = Step(what, live)
            try:
                yield handle
            except BaseException:
                console.print(f"[red]✗[/red] {what} ({handle.elapsed:.1f}s)")
                raise
    else:
        console.print(f"… {what}")
        handle = Step(what, None)
        try:
            yield handle
        except BaseException:
            console.print(f"✗ {what} ({handle.elapsed:.1f}s)")
            raise
    console.print(f"[green]✓[/green] {what} ({handle.elapsed:.1f}s)")


def wait_for(
    check: Callable[[Step], T | None],
    what: str,
    timeout: float,
    interval: float = 0.2,
    hint: str = "",
) -> T:
    """Poll `check` until it answers (infra/node/wait.py: None or False is "not yet"), showing
    progress; WaitTimeout naming `what` (and `hint`) once `timeout` seconds have passed.

    Polling instead of fixed sleeps: a fast machine is not slowed down and a slow one does not
    fail. `check` may call `step.detail(...)` to say what it sees, and may raise to give up early
    (an instance that turned unhealthy is not worth waiting for).
    """
    with step(what) as handle:
        return wait.until(lambda: check(handle), timeout, interval, what, hint=hint)
