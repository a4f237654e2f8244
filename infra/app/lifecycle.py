"""`up` and `teardown` of one spec: the cluster's lock, the provider's verbs, the sharing gateway,
the spec and files kept as applied, and every trace removed after a teardown."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import providers
from infra.app import clusters, planning
from infra.app.progress import Progress, Step, timed, warn
from infra.core import auth, costs, drift, paths, spec, ssh, state, tunnels
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError
from infra.core.sharing import owner as sharing
from infra.core.state import State
from infra.providers import features
from infra.providers.base import Endpoint, Provider, UpOptions


@dataclass(frozen=True)
class UpResult:
    spec: spec.ClusterSpec
    endpoint: Endpoint
    #: Spec changes the running cluster keeps as they were: they need a new cluster.
    pending: list[drift.Change]
    #: One line saying what `up` applied in place to the running cluster, if anything.
    in_place: str | None
    #: The sharing gateway's address (None without sharing).
    gateway_url: str | None


@dataclass(frozen=True)
class TeardownResult:
    cluster: str
    #: False when there was nothing to tear down (no state: nothing was ever created).
    removed: bool
    #: Where the head's tracking data was kept (None without such a store).
    kept_store: str | None = None
    #: Where the metrics history was kept before the machines went (None if not kept).
    metrics_kept: Path | None = None
    #: Where the head's tracking store was copied before the machines went (None if not).
    tracking_copied: Path | None = None


def up(selected: spec.ClusterSpec, progress: Progress, keep_partial: bool = False) -> UpResult:
    """Create the cluster of `selected` (or apply the spec to the running one) and wait until Ray
    answers; on a failure what this run created is removed, unless `keep_partial`."""
    impl = providers.create(selected)
    clusters.refuse_what_the_provider_lacks(selected)
    warn(progress, sharing.privilege_warning(selected))
    if selected.metrics != "none" and not type(selected).CAPABILITIES.metrics:
        progress(Step(f"{selected.source}: metrics: {selected.metrics} is not available on the "
                      f"{selected.provider} provider yet; the cluster runs without metrics", "warn"))
    with state.locked(selected.name, selected.provider, "up") as current:
        autodown_notices(selected, impl, current, progress)
        running_before = not current.empty
        applied_spec = drift.read_applied(selected.name)
        found = drift.changes(applied_spec, selected) if running_before else []
        result = impl.plan(current)
        # After the plan's checks: a spec the target cannot run leaves no state behind.
        if auth.ensure_token(current, enabled=selected.auth == "token") is None:
            progress(Step(f"{selected.source}: auth: none — Ray's job API and dashboard on this "
                          "cluster accept anyone who can reach them; remove `auth: none` to turn "
                          "token auth on", "warn"))
        # `invoke list` finds every cluster by its state file, and its spec by this path.
        spec_file = str(Path(selected.source).resolve())
        if current.info.spec_path != spec_file:
            current.set_info(spec_path=spec_file)
        cost_range = impl.cost_range(result)
        if cost_range is not None:
            progress(Step(costs.describe_range(cost_range)))
        planning.write_rendered(selected.name, result)
        try:
            endpoint = impl.up(current, result, UpOptions(keep_partial, progress))
        except BaseException:
            _forget_if_nothing_created(current)
            raise
        gateway_url = sharing.ensure_gateway(selected, impl.head_access(current), current,
                                             cost_range.node_prices if cost_range else None,
                                             progress) \
            if selected.sharing else None
        planning.keep_applied(selected.name)
        drift.keep(selected, applied_spec, running_before)
    return UpResult(spec=selected, endpoint=endpoint, pending=[c for c in found if not c.applied],
                    in_place=drift.applied_line(found) if running_before else None,
                    gateway_url=gateway_url)


def autodown_notices(selected: spec.ClusterSpec, impl: Provider[Any, Any], current: State,
                      progress: Progress) -> None:
    """Say that the cluster removed itself (if it did), and warn when nothing will remove it."""
    if current.path.exists():
        removed_itself(selected, impl, current, progress)
    if selected.autodown_turned_off and type(selected).CAPABILITIES.autodown_default_minutes:
        progress(Step(f"{selected.source}: autodown: null — this cluster never removes itself; it "
                      f"costs money until `invoke teardown{clusters.cluster_flag(selected)}`",
                      "warn"))


def removed_itself(selected: spec.ClusterSpec, impl: Provider[Any, Any], current: State,
                   progress: Progress) -> bool:
    """Whether the cluster's autodown removed it; said through `progress` when it did."""
    try:
        report = features.autodown_report(impl, current)
    except RayfleetError:
        return False
    if report is None or not report.removed_at:
        return False
    progress(Step(f"cluster {selected.name!r} {autodown_view.describe(report)}"))
    return True


def _forget_if_nothing_created(current: State) -> None:
    """A refused first `up` leaves no trace: no state file, no token (nothing to tear down)."""
    if current.empty and not current.info.dashboard_url:
        current.delete()
        auth.token_path(current.cluster).unlink(missing_ok=True)


def teardown(selected: spec.ClusterSpec, progress: Progress) -> TeardownResult:
    """Remove every resource of the cluster, check that nothing of it is left, and forget it."""
    if not state.lock_path_of(selected.name).exists() and not state.state_path(selected.name).exists():
        # Never created here (no `up` ever took its lock): nothing to ask a provider about, no
        # credentials needed, and no lock file left behind.
        return TeardownResult(selected.name, removed=False)
    impl = providers.create(selected)
    metrics_kept = tracking_copied = None
    with state.locked(selected.name, selected.provider, "teardown") as current:
        had_state = current.path.exists()
        kept_store = current.info.tracking_store
        if had_state and removed_itself(selected, impl, current, progress):
            progress(Step("verifying that nothing of it is left, then clearing its state"))
        if had_state:  # without state nothing was recorded, so nothing was created
            from infra.app import metrics_history

            # Before any machine goes: the history lives on the head.
            metrics_kept = metrics_history.keep_before_teardown(impl, current, progress)
            if selected.sharing is not None:
                sharing.stop_gateway(selected, clusters.head_or_none(impl, current))
            tracking_copied = keep_tracking_before_teardown(impl, current, progress)
            impl.teardown(current)
        current.delete()
    shutil.rmtree(paths.applied_dir(selected.name), ignore_errors=True)
    autodown_view.marker_path(selected.name).unlink(missing_ok=True)
    # The next cluster of this name gets a fresh token and fresh machines with new host keys.
    tunnels.close(selected.name)
    for leftover in (auth.token_path(selected.name), ssh.cluster_known_hosts(selected.name)):
        leftover.unlink(missing_ok=True)
    return TeardownResult(selected.name, removed=had_state,
                          kept_store=kept_store if had_state else None, metrics_kept=metrics_kept,
                          tracking_copied=tracking_copied)


def keep_tracking_before_teardown(impl: Provider[Any, Any], current: State,
                                  progress: Progress) -> Path | None:
    """Before the provider's `teardown` removes anything, for every provider whose tracking store
    lives on a head that goes with the cluster: the store copied here (where to), or a warning
    through `progress` saying why not and what becomes of it."""
    if not current.info.tracking_head_store:
        return None
    import tarfile

    from infra.core.tracking import remote as tracking_remote

    head, gone = features.tracking_head(impl, current)
    if head is None:
        progress(Step(f"tracking data NOT copied: {gone}; {tracking_remote.lost_or_kept(current)}",
                      "warn"))
        return None
    try:
        with timed(progress, "copying the head's MLflow store to this machine"):
            return tracking_remote.copy_back(head, current)
    except (RayfleetError, OSError, tarfile.TarError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        progress(Step(f"tracking data NOT copied from the head ({reason}); "
                      f"{tracking_remote.lost_or_kept(current)}", "warn"))
        return None
