"""This machine's side of Lambda autodown: put the watcher on the head at `up`, read its marker at
`status`, and tell a cluster that removed itself from one that was lost (see infra/autodown.py).

The head already holds the API key for its autoscaler (autoscale.py, a 0600 file); fixed-size
clusters get the same file the same way (SFTP, 0600). Nothing secret is in the watcher's config.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from infra import auth, autodown, autodown_remote, ui
from infra.errors import RayfleetError
from infra.providers.lambda_cloud import api, raycluster
from infra.providers.lambda_cloud import autodown as action

if TYPE_CHECKING:
    from infra import ssh
    from infra.providers.base import AutodownView
    from infra.providers.lambda_cloud.spec import Spec
    from infra.state import State


def install(spec: Spec, state: State, target: ssh.SshTarget, head_id: str,
            client: api.LambdaClient) -> None:
    """Start (or keep) the head's watcher; stop it when the spec turned autodown off."""
    if spec.autodown is None:
        with contextlib.suppress(RayfleetError):
            autodown_remote.stop(target)
        return
    key = api.read_api_key()
    if not key:
        raise api.MissingApiKey("no Lambda API key to give the head for autodown")
    token = auth.NODE_TOKEN_PATH if auth.token_file(state) else None
    config = action.watcher_config(spec.name, state.cluster_id, spec.autodown.idle_minutes,
                                   head_id, raycluster.DASHBOARD_PORT, token, None,
                                   client.limits.scale)
    with ui.step(f"starting the autodown watcher on the head ({spec.autodown.idle_minutes:g} "
                 "idle minutes)"):
        autodown_remote.install(target, config, action.FILES, {action.KEY_FILE: key.encode()},
                                python=action.HEAD_PYTHON, activate=raycluster.activate(spec))


def refresh(target: ssh.SshTarget, cluster: str) -> None:
    """Fetch the head's marker into this machine's cache (quietly: status must not fail on it)."""
    autodown_remote.read_marker(target, cluster)


def gone_view(report: AutodownView | None, marker: dict[str, Any] | None) -> AutodownView | None:
    """For a cluster whose instances are all gone: see `autodown.gone_view`."""
    view: AutodownView | None = autodown.gone_view(report, marker)
    return view


def marker(cluster: str) -> dict[str, Any] | None:
    return autodown.read_marker(autodown.marker_path(cluster))
