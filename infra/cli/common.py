"""What the verbs share: the spec and provider a command acts on, the flag that names it again in a
hint and its state when it must be running (the library's, infra/app/clusters.py), the renderer of
the library's progress, and the one table printer."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from infra import providers
from infra.app.clusters import cluster_flag as cluster_flag
from infra.app.clusters import running as running
from infra.app.progress import Step
from infra.cli import loading
from infra.core import spec, ui
from infra.providers.base import Provider


def select(provider: str | None, cluster: str | None) -> tuple[spec.ClusterSpec, Provider[Any, Any]]:
    selected = loading.resolve(provider, cluster)
    return selected, providers.create(selected)


class Shown:
    """The library's progress on stderr, as rayfleet has always shown it: a line of progress, a
    warning, a timed step with a spinner (a ✓ or ✗ line with its duration off a terminal)."""

    def __init__(self) -> None:
        self._open: list[AbstractContextManager[Any]] = []

    def __call__(self, step: Step) -> None:
        if step.kind == "info":
            ui.info(step.text)
        elif step.kind == "warn":
            ui.warn(step.text)
        elif step.kind == "begin":
            timed = ui.step(step.text)
            timed.__enter__()
            self._open.append(timed)
        elif self._open:
            failure = RuntimeError(step.text) if step.kind == "failed" else None
            # A failed step's ✗ line: the library re-raises the error itself.
            self._open.pop().__exit__(type(failure) if failure else None, failure, None)


def table(title: str, rows: list[dict[str, str]]) -> None:
    if not rows:
        return
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0]:
        # In a narrow terminal a long cell (an entrypoint, a URL) folds onto more lines: never "…".
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in rows[0]))
    ui.out(table)
