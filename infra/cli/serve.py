"""`invoke mlflow` and `invoke serve ...`, and what `status` shows of tracking and serving.

Plain functions over `commands.connect` (a tunnel for remote clusters), like the rest of commands.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from infra.cli import access, commands, common
from infra.core import serve, state, ui
from infra.core.endpoint import Endpoint
from infra.core.errors import ClusterNotRunningError, UsageError
from infra.core.tracking import client as tracking
from infra.node import wait
from infra.providers import features

#: How long `invoke mlflow` waits for a tracking server that may still be starting.
STARTUP_GRACE_S = 30.0


def _tracking(endpoint: Endpoint) -> tuple[str, Path]:
    if endpoint.tracking_url is None or endpoint.tracking_password is None:
        raise UsageError("this cluster has no tracking server; add `tracking: mlflow` to its spec "
                         "and run `invoke up` again")
    return endpoint.tracking_url, endpoint.tracking_password


def mlflow(provider: str | None, cluster: str | None) -> None:
    with commands.connect(provider, cluster) as endpoint:
        url, password = _tracking(endpoint)
        # `up` does not wait for the server, which may still be starting right after it.
        wait.until(lambda: tracking.answering(url), STARTUP_GRACE_S, 0.5,
                   on_timeout=lambda: tracking.TrackingError(
                       f"the tracking server at {url} is not answering; `invoke up` restarts it "
                       "(its data is kept)"))
        ui.out(url, markup=False)
        ui.info(f"log in as {tracking.USERNAME!r} with the password in {password} "
                f"(e.g. `xclip -sel c < {password}`)")
        ui.info("jobs on the cluster need nothing: MLFLOW_TRACKING_URI and the login are set on "
                "every node")
        commands.hold_tunnel(endpoint)


def copy_tracking(provider: str | None, cluster: str | None) -> None:
    """A copy of a cloud head's tracking store on this machine, now (`invoke mlflow --copy`): the
    store goes with the cluster at autodown, which cannot copy to a closed laptop."""
    selected, impl = common.select(provider, cluster)
    if selected.tracking == "none":
        raise UsageError("this cluster has no tracking server; add `tracking: mlflow` to its spec "
                         "and run `invoke up` again")
    with state.locked(selected.name, selected.provider, "mlflow --copy") as current:
        if current.empty:
            raise ClusterNotRunningError(f"cluster {selected.name!r} has no state; start it with "
                                         "`invoke up`")
        with ui.step("copying the head's MLflow store to this machine"):
            path = features.copy_tracking(impl, current)
    ui.out(f"tracking data copied to {path} (runs, metrics, models, artifacts)", markup=False,
           soft_wrap=True)


def serve_deploy(provider: str | None, cluster: str | None, target: str) -> None:
    working_dir = Path.cwd()
    config = serve.load(target, working_dir)
    with commands.quiet_connect(provider, cluster) as endpoint:
        for address in serve.deploy(endpoint, config, working_dir):
            ui.out(address, markup=False)


def serve_status(provider: str | None, cluster: str | None, as_json: bool) -> None:
    import json

    with commands.connect(provider, cluster) as endpoint:
        rows = serve.status(endpoint)
    if as_json:
        ui.out(json.dumps(rows, indent=2), soft_wrap=True, markup=False)
    elif rows:
        common.table("Serve applications", rows)
    else:
        ui.out("no Serve applications")


def serve_delete(provider: str | None, cluster: str | None, name: str) -> None:
    with commands.connect(provider, cluster) as endpoint:
        serve.delete(endpoint, name)
    ui.out(f"Serve application {name!r} deleted")


def serve_url(provider: str | None, cluster: str | None, name: str | None) -> None:
    with commands.connect(provider, cluster) as endpoint:
        if endpoint.serve_url is None or endpoint.serve_bind is None:
            raise UsageError("this provider offers no HTTP endpoint for Serve from here yet")
        if endpoint.tunneled:
            # The URL goes to other programs (`python client.py "$(invoke serve-url)"`): it is
            # the local end of the cluster's detached tunnel, which outlives this command.
            port = access.forward(provider, cluster, "serve", endpoint.serve_bind[1])
            endpoint = dataclasses.replace(endpoint, serve_url=f"http://127.0.0.1:{port}")
        rows = serve.status(endpoint)
    if name is not None:
        rows = [r for r in rows if r["app"] == name]
        if not rows:
            raise UsageError(f"NAME {name}: no such Serve application")
    for row in rows:
        ui.out(row["url"], markup=False)
    if not rows:
        ui.out(endpoint.serve_url, markup=False)
