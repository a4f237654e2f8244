"""This machine's side of `tracking: mlflow` on GCP: starting the server on the head at `up` and
the copy before `teardown` (the mechanism is infra/core/tracking/remote.py, shared with Lambda; see
NOTES.md "MLflow tracking"). The store lives on the head: this provider has no durable storage in
its spec yet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.core.head_ssh import SshHead, ssh_head
from infra.core.metrics import remote as metrics_remote
from infra.core.tracking import remote as tracking_remote
from infra.providers.gcp_tpu import autodown_setup

if TYPE_CHECKING:
    from pathlib import Path

    from infra.core import ssh
    from infra.core.state import Resource, State
    from infra.node.gcp_tpu.api import Gcp
    from infra.providers.gcp_tpu.records import Cluster
    from infra.providers.gcp_tpu.spec import Spec


def plan_note(spec: Spec) -> str:
    return tracking_remote.plan_note(spec.name, "internal")


def start(spec: Spec, state: State, target: ssh.SshTarget, internal_ip: str) -> None:
    """On the head's internal address: the nodes reach it there; no firewall rule opens it. The
    head's Prometheus (`metrics: prometheus`) beside it, on its loopback."""
    if spec.tracking == "mlflow":
        tracking_remote.start(state, _head(target), internal_ip,
                              tracking_remote.HeadStore(tracking_remote.HEAD_STORE))
    # After the tracking server: its start (seconds of imports) goes first.
    if spec.metrics == "prometheus":
        metrics_remote.start(state, _head(target), spec.metrics_history)


def save(state: State, api: Gcp, head: Resource[Cluster] | None, target: ssh.SshTarget | None) -> None:
    """Before any node goes: the head's store copied here, or one line why not."""
    if not state.info.tracking_head_store:
        return
    if head is None or target is None or not autodown_setup.nodes_left(api, head):
        tracking_remote.save_before_teardown(
            state, None, "the head is already gone (autodown, or removed by hand)")
        return
    tracking_remote.save_before_teardown(state, _head(target))


def copy_now(state: State, target: ssh.SshTarget) -> Path:
    """`invoke mlflow --copy`: the head's store copied here while the cluster runs."""
    return tracking_remote.copy_back(_head(target), state)


def _head(target: ssh.SshTarget) -> SshHead:
    """The head as its daemons run there: Ray's Python."""
    return ssh_head(target, autodown_setup.HEAD_PYTHON)
