"""What the verbs share: the spec and provider a command acts on, the cluster's state when it must
be running, the flag that names it again in a hint, and the one table printer."""

from __future__ import annotations

from typing import Any

from infra import providers
from infra.cli import loading
from infra.core import paths, spec, state, ui
from infra.core.errors import ClusterNotRunningError
from infra.core.state import State
from infra.providers.base import Provider


def select(provider: str | None, cluster: str | None) -> tuple[spec.ClusterSpec, Provider[Any, Any]]:
    selected = loading.resolve(provider, cluster)
    return selected, providers.create(selected)


def cluster_flag(selected: spec.ClusterSpec) -> str:
    default = paths.clusters_dir() / f"{selected.provider}.yaml"
    if spec.spec_path(selected.name) == default and selected.provider == spec.DEFAULT_PROVIDER:
        return ""
    if spec.spec_path(selected.name) == default:
        return f" --provider={selected.provider}"
    return f" --cluster={selected.source}"


def running(selected: spec.ClusterSpec) -> State:
    current = state.read(selected.name)
    if current is None or current.empty:
        raise ClusterNotRunningError(
            f"cluster {selected.name!r} has no state; start it with "
            f"`invoke up{cluster_flag(selected)}`"
        )
    return current


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
