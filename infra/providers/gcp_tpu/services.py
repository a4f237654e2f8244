"""GCP's answers about its head's services (infra/providers/features.py starts, reads and stops
them once for every provider): what removes the cluster (the watcher's action and its
arguments), and what of the cluster the APIs still list. infra/node/autodown.py is the watcher,
infra/node/gcp_tpu/autodown.py its action; the tracking store lives on the head (this provider
has no durable storage in its spec yet; NOTES.md "MLflow tracking").

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

from typing import TYPE_CHECKING

from infra.core import auth, privilege
from infra.core.tracking import remote as tracking_remote
from infra.node import autodown
from infra.providers.features import HeadServices, Watcher
from infra.providers.gcp_tpu import config, slices, users

if TYPE_CHECKING:
    from collections.abc import Callable

    from infra.core.head import HeadAccess
    from infra.core.state import Resource, State
    from infra.node.gcp_tpu.api import Gcp
    from infra.providers.gcp_tpu.records import Cluster
    from infra.providers.gcp_tpu.spec import Spec

#: The head's node env's Python as the SSH user reaches it: for what runs as that user (the
#: tracking server, the head's Prometheus), not the watcher (users.PYTHON, as its user).
HEAD_PYTHON = "$HOME/rayfleet/env/bin/python"
#: The watcher's action (infra/node/gcp_tpu/autodown.py).
ACTION = "infra.node.gcp_tpu.autodown:stop_ray_then_remove"


def plan_note(spec: Spec) -> str:
    return tracking_remote.plan_note(spec.name, "internal")


def head_services(spec: Spec, state: State, cluster: Resource[Cluster], head: HeadAccess,
                  daemon_head: HeadAccess, alive: Callable[[], bool]) -> HeadServices:
    """The tracking server on the head's internal address (the nodes reach it there; no firewall
    rule opens it), its store on the head; the watcher as the autoscaler's user (`daemon_head`),
    removing the cluster with the VM's own service account, the head's VM last. `alive`: whether
    the APIs still list the cluster's nodes."""
    watcher = watcher_config(spec, state, cluster) if spec.autodown else None
    return HeadServices(head=head, listen_host=str(cluster.attrs.head_internal_ip or ""),
                        alive=alive,
                        watcher=Watcher(daemon_head, users.DAEMON_USER, watcher,
                                        keeps_marker=True, name=str(cluster.attrs.head or "")))


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


def nodes_left(api: Gcp, cluster: Resource[Cluster]) -> int:
    """VMs and TPU nodes the APIs list with the cluster's labels (TPU VMs' own instances go with
    their TPU node, as in teardown's sweep)."""
    labels = config.sweep_labels((cluster.attrs.label_id or cluster.id), cluster.id)
    zone = cluster.attrs.zone
    vms = [i for i in api.instances(zone, labels) if "tpu_cores" not in (i.get("labels") or {})]
    return len(vms) + len(api.tpu_nodes(zone, labels))
