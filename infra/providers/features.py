"""The head's services, written once for every provider: the MLflow tracking server, the head's
Prometheus and the autodown watcher, started by the base `up` after the provider's `create`, the
head the library's `teardown` saves the tracking store from (infra/app/lifecycle.py) and `invoke
mlflow --copy` copies it from, the watcher's marker read and decided for `status`. Everything
reaches the head through the provider's head object (infra/core/head.py). A provider answers small
questions instead (`Provider.head_services`: which head, which address the tracking server listens
on, where its store lives, whether the head still runs, what removes the cluster;
`Provider.listed`: is anything of the cluster still listed).

A provider whose head daemons start elsewhere (the local provider starts its own beside Ray, a
Slurm head's batch job starts them) answers only where the watcher's marker can be read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from infra.core.autodown import view as autodown_view
from infra.core.autodown.view import AutodownView
from infra.core.errors import ClusterNotRunningError, RayfleetError, UsageError
from infra.core.head import HeadAccess
from infra.core.progress import Progress, timed, warn
from infra.node.wait import WaitTimeout, until

# Each feature's own modules are imported where it is used: a cluster without it never loads them
# (tests/test_up_path.py: a local `up` reaches `ray start` without them).
if TYPE_CHECKING:
    from infra.core.capabilities import Capabilities
    from infra.core.spec import ClusterSpec
    from infra.core.state import State
    from infra.core.tracking.remote import HeadStore
    from infra.node.autodown import Config
    from infra.node.autodown_marker import Marker

#: How long `up` waits for the first marker of a watcher whose head may delete itself.
FIRST_MARKER_S = 30.0


class Answers(Protocol):
    """What these functions ask of a provider (infra/providers/base.py's `Provider`; named here by
    what it answers, so that the base can import this module)."""

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def head_services(self, state: State) -> HeadServices | None: ...

    def listed(self, state: State) -> bool | None: ...


@dataclass(frozen=True)
class Watcher:
    """The autodown watcher on a head: who runs it and with what; what removes the cluster is
    its config's action."""

    #: The head as the watcher runs there (its Python and node env).
    head: HeadAccess
    #: The node user that runs it (the one holding what the removal needs).
    user: str
    #: None when the spec has no autodown: a watcher an earlier `up` started is stopped.
    config: Config | None = None
    #: Files the removal needs on the head (home-relative path -> content, 0600), read at `up`
    #: only (a missing credential then fails `up` in one line).
    secrets: Callable[[], Mapping[str, bytes]] = dict
    #: A head that deletes itself takes its marker along: `up` keeps a copy of the first one, and
    #: a watcher is stopped only where this machine holds a marker of it.
    keeps_marker: bool = False
    #: The head's name, for the one line when the watcher has not reported.
    name: str = ""


@dataclass(frozen=True)
class HeadServices:
    """A provider's answers for its head's services (see the module docstring)."""

    #: The head as its services (tracking server, Prometheus) run there; None when they start
    #: elsewhere (local, Slurm).
    head: HeadAccess | None = None
    #: The address the tracking server listens on (the nodes reach it there).
    listen_host: str = ""
    #: Where the tracking store lives (asked only when the spec tracks); None: on the head.
    store: Callable[[], HeadStore] | None = None
    #: Whether the provider still lists the head as running (one listing), asked before
    #: `teardown` copies the tracking store from it; None: a recorded head is taken to run.
    alive: Callable[[], bool] | None = field(default=None, compare=False)
    watcher: Watcher | None = None
    #: Where the watcher's marker is read instead, given what the provider lists (False: nothing
    #: of the cluster is listed any more); None: from `watcher` on a live head.
    marker: Callable[[bool | None], str | None] | None = field(default=None, compare=False)


def start(provider: Answers, state: State, progress: Progress) -> None:
    """After `create`: the tracking server, then Prometheus, then the watcher, on the head."""
    services = provider.head_services(state)
    if services is None or services.head is None:
        return
    spec = provider.spec
    if spec.tracking == "mlflow":
        from infra.core.tracking import remote as tracking_remote

        store = services.store() if services.store else tracking_remote.HeadStore(
            tracking_remote.HEAD_STORE)
        tracking_remote.start(state, services.head, services.listen_host, store, progress)
    # After the tracking server: its start (seconds of imports) goes first.
    if spec.metrics == "prometheus":
        from infra.core.metrics import remote as metrics_remote

        metrics_remote.start(state, services.head, spec.metrics_history, progress)
    if services.watcher is not None:
        _watch(state, services.watcher, progress)


def _watch(state: State, watcher: Watcher, progress: Progress) -> None:
    """Start (or keep) the watcher; stop one an earlier `up` started when autodown is off."""
    from infra.core.autodown import remote as autodown_remote
    from infra.node import autodown

    cluster = state.cluster
    if watcher.config is None:
        if watcher.keeps_marker and autodown_view.read_marker(
                autodown_view.marker_path(cluster)) is None:
            return
        with contextlib.suppress(RayfleetError):
            autodown_remote.stop(watcher.head, watcher.user)
        if watcher.keeps_marker:
            autodown_view.forget(cluster)
        return
    secrets = dict(watcher.secrets())
    with timed(progress, f"starting the autodown watcher on the head "
               f"({watcher.config.idle_minutes:g} idle minutes)"):
        autodown_remote.install(watcher.head, watcher.config, secrets or None, user=watcher.user)
        if not watcher.keeps_marker:
            return
        try:
            until(lambda: autodown_view.cache_marker(
                cluster, autodown_remote.head_marker(watcher.head, watcher.user) or "",
                state.cluster_id), FIRST_MARKER_S, 1, "the watcher's first marker")
        except WaitTimeout:
            warn(progress, f"the autodown watcher on {watcher.name} has not reported yet; see "
                 f"~{watcher.user}/{autodown.HEAD_LOG.removeprefix('~/')} there")


def tracking_head(provider: Answers, state: State) -> tuple[HeadAccess | None, str]:
    """Before the provider's `teardown` removes anything: the head to copy the tracking store
    from, or None and why not (no head recorded, or the provider lists it no more)."""
    try:
        services = provider.head_services(state)
    except ClusterNotRunningError as exc:
        return None, str(exc).partition("; ")[0]
    if services is None or services.head is None:
        return None, "no head"
    if services.alive is not None and not services.alive():
        return None, "the head is already gone (autodown, or removed by hand)"
    return services.head, ""


def copy_tracking(provider: Answers, state: State) -> Path:
    """`invoke mlflow --copy`: the head's tracking store copied to `.rayfleet/tracking/<cluster>/`
    while the cluster runs. Only a store that lives on a machine going with the cluster has a
    copy to make; the others stay where this machine or a shared file system holds them."""
    if state.info.tracking_head_store:
        services = provider.head_services(state)
        if services is not None and services.head is not None:
            from infra.core.tracking import remote as tracking_remote

            return tracking_remote.copy_back(services.head, state)
    where = state.info.tracking_store or state.info.tracking_head_store
    raise UsageError(f"cluster {state.cluster!r} keeps its tracking data in {where or 'its store'}"
                     ", which outlives the cluster: there is nothing to copy")


# --- autodown: the report is decided here ------------------------------------------------------


def head_marker(provider: Answers, state: State, left: bool | None) -> str | None:
    """The watcher's marker as it can be read now: from a live head, or (`left` False: nothing of
    the cluster is listed) what a removed head left behind. None when it cannot be said, quietly
    (`status` must not fail on it)."""
    try:
        services = provider.head_services(state)
    except ClusterNotRunningError:
        return None  # no head recorded (yet, or any more)
    if services is None:
        return None
    if services.marker is not None:
        return services.marker(left)
    if left is False or services.watcher is None:
        return None  # a removed head leaves nothing to read
    from infra.core.autodown import remote as autodown_remote

    return autodown_remote.head_marker(services.watcher.head, services.watcher.user)


def autodown_report(provider: Answers, state: State, fetch: bool = False,
                    left: bool | None = None) -> AutodownView | None:
    """The idle watcher's countdown, or that the cluster removed itself; None when the spec has
    no autodown and this machine holds no marker of the cluster.

    `status` passes `fetch` (read the head's marker now) and `left` (what its own listing
    showed); `up` and `teardown` call it bare and the provider is asked only when the cached
    marker could mean the cluster is gone.
    """
    marker = autodown_view.cached(state.cluster, state.cluster_id)
    if marker is None and provider.spec.autodown is None:
        return None
    if fetch:
        marker = _fetched(provider, state, left) or marker
    lost = provider.capabilities.autodown_last_word_may_be_lost
    if left is None and marker is not None and _may_be_gone(marker, lost):
        left = provider.listed(state)
        if left is False and not fetch:
            marker = _fetched(provider, state, False) or marker
    minutes = provider.spec.autodown.idle_minutes if provider.spec.autodown else 0.0
    return autodown_view.decide(marker, minutes, left, lost)


def _fetched(provider: Answers, state: State,
             left: bool | None) -> Marker | None:
    text = head_marker(provider, state, left)
    return None if text is None else autodown_view.cache_marker(state.cluster, text,
                                                                state.cluster_id)


def _may_be_gone(marker: Marker, lost: bool) -> bool:
    if marker.phase in ("removing", "removed"):
        return True
    # A head that leaves its last word behind (a record, this machine's own copy) can be
    # asked any time; one that may not is presumed removed only after a countdown.
    return not lost or bool(marker.idle_since)
