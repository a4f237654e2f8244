"""This machine's side of GCP autodown: put the watcher on the head at `up`, read its marker at
`status` (infra/node/autodown.py is the watcher, infra/node/gcp_tpu/autodown.py its action; what
the marker means is decided in infra/providers/base.py).

The head needs no key from us: the removal action (autodown.py) uses the VM's own service account
through the metadata server, the credentials Ray's autoscaler beside it already uses to create and
delete workers. So the watcher (and its supervisor) runs as the autoscaler's user, the only one
besides root that the metadata server answers (issue 29; NOTES.md, "What a job can reach"), with
its config, marker and log in that user's 0700 home. The config names the cluster's labels, zone
and head, nothing secret; the watcher reaches Ray on the head's loopback with that user's copy of
the Ray token.

A head that deletes its own VM takes its marker with it, so this machine keeps a copy of the last
one it read: right after `up` starts the watcher, and at every `status`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from infra.core import auth, privilege, ui
from infra.core.autodown import remote as autodown_remote
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError
from infra.core.head_ssh import SshHead, ssh_head
from infra.node import autodown
from infra.node.wait import WaitTimeout, until
from infra.providers.gcp_tpu import config, slices, users

if TYPE_CHECKING:
    from infra.core import ssh
    from infra.core.state import Resource, State
    from infra.node.gcp_tpu.api import Gcp
    from infra.providers.gcp_tpu.records import Cluster
    from infra.providers.gcp_tpu.spec import Spec

#: The head's node env's Python as the SSH user reaches it: for what runs as that user (the
#: tracking server, the head's Prometheus), not the watcher (users.PYTHON, as its user).
HEAD_PYTHON = "$HOME/rayfleet/env/bin/python"
#: How long `up` waits for the watcher's first marker, to keep a copy of it.
FIRST_MARKER_S = 30.0
#: The watcher's action (infra/node/gcp_tpu/autodown.py).
ACTION = "infra.node.gcp_tpu.autodown:stop_ray_then_remove"


def watcher_config(spec: Spec, state: State, cluster: Resource[Cluster]) -> autodown.Config:
    """The head's watcher config: Ray on the head's loopback, the label sweep of teardown as the
    removal action, the head's own VM last; no secret inside."""
    assert spec.autodown is not None
    label_id = (cluster.attrs.label_id or cluster.id)
    return autodown.Config(
        cluster=spec.name, cluster_id=state.cluster_id, idle_minutes=spec.autodown.idle_minutes,
        dashboard_url=f"http://127.0.0.1:{spec.dashboard.port}", marker=autodown.HEAD_MARKER,
        action=ACTION,
        action_args={"project": cluster.attrs.project, "zone": cluster.attrs.zone,
                     "labels": config.sweep_labels(label_id, cluster.id),
                     "head_name": cluster.attrs.head,
                     # Ray's autoscaler, which would replace what is being deleted: its
                     # supervisor's pid file (both the watcher's user's own processes, which it
                     # can stop; Ray's are another user's).
                     "monitor_pidfile": f"~/{privilege.MONITOR_PID}",
                     **slices.autodown_args(spec, state)},
        token_path=config.NODE_TOKEN_PATH if auth.token_file(state) else None)


def install(spec: Spec, state: State, cluster: Resource[Cluster], target: ssh.SshTarget) -> None:
    """Start (or keep) the head's watcher and keep a copy of its first marker; stop the one an
    earlier `up` started (this machine holds its marker) when the spec turned autodown off."""
    if spec.autodown is None:
        if autodown_view.read_marker(autodown_view.marker_path(spec.name)) is not None:
            with contextlib.suppress(RayfleetError):
                autodown_remote.stop(_head(target), users.DAEMON_USER)
            autodown_view.forget(spec.name)
        return
    with ui.step(f"starting the autodown watcher on the head ({spec.autodown.idle_minutes:g} "
                 "idle minutes)"):
        autodown_remote.install(_head(target), watcher_config(spec, state, cluster),
                                user=users.DAEMON_USER)
        try:
            until(lambda: autodown_view.cache_marker(spec.name, marker(target) or "",
                                                     state.cluster_id),
                  FIRST_MARKER_S, 1, "the watcher's first marker")
        except WaitTimeout:
            ui.warn(f"the autodown watcher on {cluster.attrs.head} has not reported yet; "
                    f"see ~{users.DAEMON_USER}/{autodown.HEAD_LOG.removeprefix('~/')} there")


def marker(target: ssh.SshTarget) -> str | None:
    """The watcher's marker and whether it runs, read as the user it runs as (`status`)."""
    return autodown_remote.head_marker(_head(target), users.DAEMON_USER)


def _head(target: ssh.SshTarget) -> SshHead:
    """The head as its daemons run there: the node env's Python, activated."""
    return ssh_head(target, users.PYTHON, users.ACTIVATE)


def nodes_left(api: Gcp, cluster: Resource[Cluster]) -> int:
    """VMs and TPU nodes the APIs list with the cluster's labels (TPU VMs' own instances go with
    their TPU node, as in teardown's sweep)."""
    labels = config.sweep_labels((cluster.attrs.label_id or cluster.id), cluster.id)
    zone = cluster.attrs.zone
    vms = [i for i in api.instances(zone, labels) if "tpu_cores" not in (i.get("labels") or {})]
    return len(vms) + len(api.tpu_nodes(zone, labels))
