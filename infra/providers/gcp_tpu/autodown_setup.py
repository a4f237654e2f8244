"""This machine's side of GCP autodown: put the watcher on the head at `up`, read its marker at
`status`, and tell a cluster that removed itself from one that is still there (infra/autodown.py).

The head needs no key from us: the removal action (autodown.py) uses the VM's own service account
through the metadata server, the credentials Ray's autoscaler beside it already uses to create and
delete workers. The watcher's config names the cluster's labels, zone and head, nothing secret; it
reaches Ray on the head's loopback with the token file Ray's file_mounts put there.

A head that deletes its own VM takes its marker with it, so this machine keeps a copy of the last
one it read: right after `up` starts the watcher, and at every `status`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infra import auth, autodown, autodown_remote, ui
from infra.errors import RayfleetError
from infra.providers.gcp_tpu import autodown as action
from infra.providers.gcp_tpu import config, slices

if TYPE_CHECKING:
    from infra import ssh
    from infra.providers.base import AutodownView, ProviderStatus
    from infra.providers.gcp_tpu.api import Gcp
    from infra.providers.gcp_tpu.spec import Spec
    from infra.state import Resource, State

#: The Python of the head's rayfleet env (the node installer's prefix): it has Ray, requests and
#: Google's client library (installed there for the autoscaler).
HEAD_PYTHON = "$HOME/rayfleet/env/bin/python"
#: How long `up` waits for the watcher's first marker, to keep a copy of it.
FIRST_MARKER_S = 30.0


def watcher_config(spec: Spec, state: State, cluster: Resource) -> autodown.Config:
    """The head's watcher config: Ray on the head's loopback, the label sweep of teardown as the
    removal action, the head's own VM last; no secret inside."""
    assert spec.autodown is not None
    label_id = str(cluster.attrs.get("label_id", cluster.id))
    return autodown.Config(
        cluster=spec.name, cluster_id=state.cluster_id, idle_minutes=spec.autodown.idle_minutes,
        dashboard_url=f"http://127.0.0.1:{spec.dashboard.port}", marker=autodown.HEAD_MARKER,
        action=action.ACTION,
        action_args={"project": str(cluster.attrs["project"]), "zone": str(cluster.attrs["zone"]),
                     "labels": config.sweep_labels(label_id, cluster.id),
                     "head_name": str(cluster.attrs["head"]),
                     **slices.autodown_args(spec, state)},
        token_path=config.NODE_TOKEN_PATH if auth.token_file(state) else None)


def install(spec: Spec, state: State, cluster: Resource, target: ssh.SshTarget) -> None:
    """Start (or keep) the head's watcher and keep a copy of its first marker; stop the one an
    earlier `up` started (this machine holds its marker) when the spec turned autodown off."""
    if spec.autodown is None:
        if marker(spec.name) is not None:
            with contextlib.suppress(RayfleetError):
                autodown_remote.stop(target)
            autodown.marker_path(spec.name).unlink(missing_ok=True)
        return
    with ui.step(f"starting the autodown watcher on the head ({spec.autodown.idle_minutes:g} "
                 "idle minutes)"):
        autodown_remote.install(target, watcher_config(spec, state, cluster), action.FILES,
                                python=HEAD_PYTHON)
        deadline = time.monotonic() + FIRST_MARKER_S
        while not autodown_remote.read_marker(target, spec.name):
            if time.monotonic() > deadline:
                ui.warn(f"the autodown watcher on {cluster.attrs['head']} has not reported yet; "
                        f"see ~/{autodown.HEAD_LOG.removeprefix('~/')} there")
                break
            time.sleep(1)


def marker(cluster: str) -> dict[str, Any] | None:
    return autodown.read_marker(autodown.marker_path(cluster))


def nodes_left(api: Gcp, cluster: Resource) -> int:
    """VMs and TPU nodes the APIs list with the cluster's labels (TPU VMs' own instances go with
    their TPU node, as in teardown's sweep)."""
    labels = config.sweep_labels(str(cluster.attrs.get("label_id", cluster.id)), cluster.id)
    zone = str(cluster.attrs["zone"])
    vms = [i for i in api.instances(zone, labels) if "tpu_cores" not in (i.get("labels") or {})]
    return len(vms) + len(api.tpu_nodes(zone, labels))


def add_report(status: ProviderStatus, spec: Spec, state: State, clusters: list[Resource],
               cached: Callable[[], AutodownView | None],
               target: Callable[[Resource], ssh.SshTarget]) -> ProviderStatus:
    """`status` with the watcher's countdown (its marker fetched from a running head first; quietly,
    status must not fail on it), or, when `status` lists no VM or TPU of the cluster any more and
    the last marker showed it counting down, that it removed itself. `cached` reads this
    machine's copy of the marker."""
    if not clusters or (spec.autodown is None and marker(state.cluster) is None):
        return status
    if status.running:
        autodown_remote.read_marker(target(clusters[0]), state.cluster)
    view = cached()
    listed = [r for r in status.rows if r.get("kind") != "firewall rule"]
    gone = None if listed else autodown.gone_view(view, marker(state.cluster))
    if gone is None:
        return dataclasses.replace(status, autodown=view)
    where = f"{clusters[0].attrs['project']}/{clusters[0].attrs['zone']}"
    return dataclasses.replace(
        status, state="removed itself", autodown=gone,
        summary=f"no VM or TPU of the cluster is left in {where}: it {autodown.describe(gone)}; "
                "`invoke teardown` verifies and clears its state")


def report(view: AutodownView | None, state: State, clusters: list[Resource],
           api: Callable[[], Gcp]) -> AutodownView | None:
    """`view` (this machine's copy of the marker), or, when the APIs list no VM or TPU of the
    recorded cluster while that copy showed the watcher counting down, a view saying it removed
    itself (autodown.gone_view). Asks the APIs only when that could be the case."""
    last = marker(state.cluster)
    if view is None or view.removed_at or last is None or not clusters:
        return view
    client = api()
    if any(nodes_left(client, cluster) for cluster in clusters):
        return view
    gone: AutodownView | None = autodown.gone_view(view, last)
    return gone or view
