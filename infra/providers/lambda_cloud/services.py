"""This machine's side of Lambda autodown: the watcher's config, putting it on the head at `up`,
reading its marker at `status` (infra/node/autodown.py is the watcher,
infra/node/lambda_cloud/autodown.py its action; what the marker means is decided in
infra/providers/base.py).

The head already holds the API key for its autoscaler (autoscale.py, a 0600 file of the
autoscaler's user); fixed-size clusters get the same file the same way (SFTP, 0600, handed to that
user). The watcher runs as that user too. Nothing secret is in the watcher's config.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from infra.core import auth, privilege, ui
from infra.core.autodown import remote as autodown_remote
from infra.core.errors import RayfleetError
from infra.core.head_ssh import SshHead, ssh_head
from infra.node import autodown
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import raycluster

# The API key on the head (0600): the same file the autoscaler's node provider reads.
from infra.providers.lambda_cloud.autoscale import HEAD_API_KEY_FILE

if TYPE_CHECKING:
    from infra.core import ssh
    from infra.core.state import State
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


def install(spec: Spec, state: State, target: ssh.SshTarget, head_id: str,
            client: api.LambdaClient) -> None:
    """Start (or keep) the head's watcher; stop it when the spec turned autodown off."""
    if spec.autodown is None:
        with contextlib.suppress(RayfleetError):
            autodown_remote.stop(_head(spec, target), WATCHER_USER)
        return
    key = api.read_api_key()
    if not key:
        raise api.MissingApiKey("no Lambda API key to give the head for autodown")
    token = auth.NODE_TOKEN_PATH if auth.token_file(state) else None
    config = watcher_config(spec.name, state.cluster_id, spec.autodown.idle_minutes,
                                   head_id, raycluster.DASHBOARD_PORT, token, None,
                                   client.limits.scale)
    with ui.step(f"starting the autodown watcher on the head ({spec.autodown.idle_minutes:g} "
                 "idle minutes)"):
        autodown_remote.install(_head(spec, target), config, {HEAD_API_KEY_FILE: key.encode()},
                                user=WATCHER_USER)


def marker(spec: Spec, target: ssh.SshTarget) -> str | None:
    """The watcher's marker and whether it runs, read as the user it runs as (`status`)."""
    return autodown_remote.head_marker(_head(spec, target), WATCHER_USER)


def _head(spec: Spec, target: ssh.SshTarget) -> SshHead:
    """The head as its daemons run there: Ray's Python, the node env activated."""
    return ssh_head(target, HEAD_PYTHON, raycluster.activate(spec))
