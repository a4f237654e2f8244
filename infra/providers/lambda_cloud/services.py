"""Lambda's answers about its head's services (infra/providers/features.py starts, reads and
stops them once for every provider): the watcher's config and what removes the cluster, where the
tracking store lives. infra/node/autodown.py is the watcher, infra/node/lambda_cloud/autodown.py
its action; see NOTES.md "MLflow tracking".

The head already holds the API key for its autoscaler (autoscale.py, a 0600 file of the
autoscaler's user); fixed-size clusters get the same file the same way (SFTP, 0600, handed to that
user). The watcher runs as that user too. Nothing secret is in the watcher's config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.core import privilege
from infra.core.tracking import remote as tracking_remote
from infra.node import autodown
from infra.node.lambda_cloud import api

# The API key on the head (0600): the same file the autoscaler's node provider reads.
from infra.providers.lambda_cloud.autoscale import HEAD_API_KEY_FILE

if TYPE_CHECKING:
    from infra.providers.lambda_cloud.spec import Spec

#: The Python next to the `ray` the head runs: it has requests (Ray depends on it).
HEAD_PYTHON = '$(dirname "$(command -v ray)")/python'
#: The watcher's action (infra/node/lambda_cloud/autodown.py).
ACTION = "infra.node.lambda_cloud.autodown:remove"
#: Who runs the watcher (and its supervisor): the autoscaler's user, who alone holds the API key
#: that removing the cluster needs (issue 29; NOTES.md, "Two users on every node"). Its config,
#: marker, log and key live in that user's 0700 home.
WATCHER_USER = privilege.SCALER_USER


def watcher_config(cluster: str, cluster_id: str, idle_minutes: float, head_id: str,
                   dashboard_port: int, token_path: str | None, api_url: str | None,
                   rate_scale: float) -> autodown.Config:
    """The head's watcher config: Ray on the head's loopback, this action, no secret inside."""
    return autodown.Config(
        cluster=cluster, cluster_id=cluster_id, idle_minutes=idle_minutes,
        dashboard_url=f"http://127.0.0.1:{dashboard_port}", marker=autodown.HEAD_MARKER,
        action=ACTION,
        action_args={"api_key_file": f"~/{HEAD_API_KEY_FILE}", "api_url": api_url, "rate_scale": rate_scale,
                     "cluster_id": cluster_id, "head_instance_id": head_id},
        token_path=token_path)


def watcher_secrets() -> dict[str, bytes]:
    """The API key the removal needs, for the watcher's user on the head; one line without it."""
    key = api.read_api_key()
    if not key:
        raise api.MissingApiKey("no Lambda API key to give the head for autodown")
    return {HEAD_API_KEY_FILE: key.encode()}


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
