"""This machine's side of `tracking: mlflow` on Lambda: where the store goes, starting the server on
the head at `up`, and the copy before `teardown` (the mechanism is infra/core/tracking/remote.py, shared
with GCP; see NOTES.md "MLflow tracking")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.core.head_ssh import SshHead, ssh_head
from infra.core.metrics import remote as metrics_remote
from infra.core.tracking import remote as tracking_remote
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import autodown_setup, raycluster

if TYPE_CHECKING:
    from pathlib import Path

    from infra.core import ssh
    from infra.core.state import State
    from infra.providers.lambda_cloud.spec import Spec


def durable(spec: Spec) -> str:
    """The storage that outlives the cluster, in words ("" when the store goes with the head)."""
    return f"Lambda file system {spec.file_system!r}" if spec.file_system else ""


def plan_note(spec: Spec) -> str:
    return tracking_remote.plan_note(spec.name, "private", durable(spec))


def store(spec: Spec, client: api.LambdaClient) -> tracking_remote.HeadStore:
    """On the spec's file system (at the `mount_point` Lambda lists, NOTES.md), else on the head."""
    if not spec.file_system:
        return tracking_remote.HeadStore(tracking_remote.HEAD_STORE)
    found = next((f for f in client.file_systems() if f.name == spec.file_system), None)
    mount = found.mount_point if found and found.mount_point else f"/lambda/nfs/{spec.file_system}"
    return tracking_remote.HeadStore(f"{mount.rstrip('/')}/rayfleet-tracking/{spec.name}",
                                     durable(spec))


def start(spec: Spec, state: State, client: api.LambdaClient, target: ssh.SshTarget,
          head: api.Instance) -> None:
    """The tracking server on the head's private address (its public one where none is listed);
    the head's Prometheus (`metrics: prometheus`) beside it."""
    if spec.tracking == "mlflow":
        tracking_remote.start(state, _head(spec, target), raycluster.private_address(head),
                              store(spec, client))
    # After the tracking server: its start (seconds of imports) goes first.
    if spec.metrics == "prometheus":
        metrics_remote.start(state, _head(spec, target), spec.metrics_history)


def save(spec: Spec, state: State, client: api.LambdaClient, heads: list[str],
         target: ssh.SshTarget | None) -> None:
    """Before any instance goes: the head's store copied here, or one line why not. A head the API
    no longer lists as running is not asked."""
    if not state.info.tracking_head_store:
        return
    listed = {i.id: i.status for i in client.instances()}
    if target is None or not heads or all(listed.get(h) in (None, *api.GONE) for h in heads):
        tracking_remote.save_before_teardown(
            state, None, "the head is already terminated (autodown, or removed by hand)")
        return
    tracking_remote.save_before_teardown(state, _head(spec, target))


def copy_now(spec: Spec, state: State, target: ssh.SshTarget) -> Path:
    """`invoke mlflow --copy`: the head's store copied here while the cluster runs."""
    return tracking_remote.copy_back(_head(spec, target), state)


def _head(spec: Spec, target: ssh.SshTarget) -> SshHead:
    """The head as its daemons run there: Ray's Python, the node env activated."""
    return ssh_head(target, autodown_setup.HEAD_PYTHON, raycluster.activate(spec))
