"""How the library reports progress without printing: each step is a `Step` handed to the caller's
callback (infra/cli/common.py renders them on stderr; a script may collect or ignore them). In the
core layer so that what the use cases (infra/app/) call there reports through the same callback;
infra/app/progress.py is its name for the library's callers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

#: info: a line of progress or advice; warn: a warning; begin/done/failed: a timed step's start
#: and end (the CLI shows a spinner between them and the duration after).
Kind = Literal["info", "warn", "begin", "done", "failed"]


@dataclass(frozen=True)
class Step:
    text: str
    kind: Kind = "info"


Progress = Callable[[Step], None]


def warn(progress: Progress, text: str | None) -> None:
    """`text` as a warning, when there is one."""
    if text:
        progress(Step(text, "warn"))


def ignore(step: Step) -> None:
    """A progress callback for callers that want only the result."""


@contextmanager
def timed(progress: Progress, what: str) -> Iterator[None]:
    """`what` as one timed step: begin, then done, or failed if the block raised (it re-raises)."""
    progress(Step(what, "begin"))
    try:
        yield
    except BaseException:
        progress(Step(what, "failed"))
        raise
    progress(Step(what, "done"))
