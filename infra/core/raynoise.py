"""Keeping Ray's own chatter out of rayfleet's output, and in a log file instead.

Submitting a job makes Ray's client library log every packaging step ("Ignoring upload to cluster
for these files", working_dir.py warnings, "WebSocket closed for job ..."), and a job's log stream
carries lines a user cannot act on (absl's `mutex.cc ... RAW: Lock blocking` debug lines) and
colour codes that mean nothing in a file or a pipe. Ray's Python loggers go to the cluster's
`ray-client.log` for the length of a command; stream lines that are noise go there too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Lines of a job's log stream that are Ray's internals, not the job's output.
NOISE = re.compile(r"\[mutex\.cc\s*:\s*\d+\] RAW:")
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

_file: logging.FileHandler | None = None


@contextmanager
def to_log(path: Path) -> Iterator[None]:
    """Send Ray's Python log records to `path` (appended) instead of the terminal for the block."""
    global _file
    import ray  # noqa: F401  (Ray attaches its terminal handler to the "ray" logger on import)

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ray")
    saved, saved_propagate = logger.handlers[:], logger.propagate
    logger.handlers = [handler]
    logger.propagate = False
    _file = handler
    try:
        yield
    finally:
        _file = None
        logger.handlers = saved
        logger.propagate = saved_propagate
        handler.close()


class LineFilter:
    """Feed a log stream chunk by chunk; get back what to print: whole lines only (a noise line may
    arrive in two chunks), noise dropped (into the log file when one is open), colour codes
    removed unless the output is a terminal."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour
        self._partial = ""

    def feed(self, chunk: str) -> str:
        text = self._partial + chunk
        complete, _, self._partial = text.rpartition("\n")
        return self._lines(complete + "\n") if complete or text.startswith("\n") else ""

    def flush(self) -> str:
        rest, self._partial = self._partial, ""
        return self._lines(rest) if rest else ""

    def _lines(self, text: str) -> str:
        kept = []
        for line in text.splitlines(keepends=True):
            if NOISE.search(line):
                if _file is not None and _file.stream is not None:
                    _file.stream.write(ANSI.sub("", line))
                continue
            kept.append(line if self.colour else ANSI.sub("", line))
        return "".join(kept)
