"""A gcp-tpu head: what `up` records of the VM `ray up` made, and how rayfleet reaches it: our
own SSH (the cluster's key, the head's host key pinned on first contact) and the head interface
on top of it, as `invoke ssh|exec` and the head's daemons (the watcher, the joiner, run as the
autoscaler's user) see the head. Ray's own SSH (`ray up`/`down`, the head's updaters) keeps Ray's
options (see NOTES.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

from infra.core import auth, paths, ssh, ui
from infra.core.errors import ClusterNotRunningError
from infra.core.head_ssh import SshHead
from infra.core.state import Resource, State
from infra.node.gcp_tpu.api import GcpError
from infra.providers.gcp_tpu import config, services, users, view
from infra.providers.gcp_tpu.records import Cluster
from infra.providers.gcp_tpu.spec import Spec


def target(spec: Spec, cluster: Resource[Cluster], ssh_port: int) -> ssh.SshTarget:
    """Our SSH login to the recorded head; raises when `up` has not recorded one yet."""
    if not cluster.attrs.head_ip:
        raise ClusterNotRunningError(f"cluster {cluster.id!r} has no head recorded yet; "
                                     "`invoke up` finishes it")
    return ssh.SshTarget(host=cluster.attrs.head_ip, user=cluster.attrs.ssh_user or spec.ssh_user,
                         key_path=paths.keys_dir(spec.name) / ssh.KEY_NAME, port=ssh_port,
                         known_hosts=ssh.cluster_known_hosts(spec.name),
                         host_key_policy="accept-new")


def reachable(spec: Spec, state: State) -> Resource[Cluster]:
    """The recorded cluster with a head, when this machine still has the key to reach it."""
    cluster = next((c for c in state.resources(Cluster) if c.attrs.head_ip), None)
    if cluster is None:
        raise ClusterNotRunningError(
            f"gcp-tpu cluster {spec.name!r} has no head yet; start it with `invoke up "
            "--provider=gcp-tpu` (or --cluster)")
    key = paths.keys_dir(spec.name) / ssh.KEY_NAME
    if not key.exists():
        raise ClusterNotRunningError(f"the cluster's SSH key {key} is missing; run `invoke "
                                     "up` again to restore access, or `invoke teardown`")
    return cluster


def head(spec: Spec, state: State | None, cluster: Resource[Cluster], ssh_port: int) -> SshHead:
    """The head as a person's commands reach it (Ray's variables and the token file set)."""
    login = target(spec, cluster, ssh_port)
    # `ray start --head` without --ray-client-server-port opens Ray's default, 10001.
    return SshHead(target=login, where=str(login),
                   env=auth.head_env(state, config.NODE_TOKEN_PATH) if state else {},
                   dashboard_port=cluster.attrs.dashboard_port or spec.dashboard.port,
                   client_port=10001,
                   python=services.HEAD_PYTHON)


def daemon_head(spec: Spec, cluster: Resource[Cluster], ssh_port: int) -> SshHead:
    """The head as its daemons run there (the watcher, the joiner, as the autoscaler's
    user): the node env's Python, activated."""
    return dataclasses.replace(head(spec, None, cluster, ssh_port), python=users.PYTHON,
                               activate=users.ACTIVATE)


def record(spec: Spec, state: State, vm: dict[str, Any], gcs_port: int) -> tuple[str, str, str]:
    """The head VM `ray up` made, recorded in state with how its dashboard is reached: (external
    IP, internal IP, the dashboard's direct URL or "" when only a tunnel reaches it)."""
    external, internal = view.ips(vm)
    if not external:
        raise GcpError(f"gcp-tpu: head {vm['name']} has no external IP; rayfleet reaches "
                       "it over SSH, so its network interface needs an access config")
    state.update(Cluster, spec.name, head=vm["name"], head_ip=external,
                 head_internal_ip=internal)
    ranges = spec.dashboard.allowed_source_ranges
    direct = f"http://{external}:{spec.dashboard.port}" if ranges else ""
    access = (f"{direct} from {', '.join(ranges)}, or an SSH tunnel" if ranges
              else "SSH tunnel only")
    state.set_info(address=f"{internal}:{gcs_port}", head=vm["name"], head_ip=external,
                   dashboard_url=direct or f"http://127.0.0.1:{spec.dashboard.port} on the head",
                   dashboard_access=access)
    ui.info(f"head {vm['name']}: external IP {external}, internal IP {internal}; "
            f"dashboard: {access}")
    return external, internal, direct
