"""This machine's side of queued TPU slices (`queued_slices:`): queue the requests at `up`, put the
joiner on the head, show the requests in `status`, delete them at `teardown`.

Each request is recorded in state (`Queued`, by its id) before the call that creates it. The head's
joiner (joiner.py) may queue replacements that state does not list, so `status` and `teardown`
list every zone the slices may use and take what carries the cluster id (queued.ours); teardown
deletes with `force` (the TPU nodes go with their request) and ends only when the API lists none.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shlex
from typing import TYPE_CHECKING, Any

from infra.core import auth, paths, ui, versions
from infra.core.errors import RayfleetError
from infra.core.head import HeadAccess
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node.files import atomic_write
from infra.node.gcp_tpu import joiner, queued
from infra.node.gcp_tpu.api import Gcp, GcpError
from infra.providers.gcp_tpu import config, users
from infra.providers.gcp_tpu.records import Queued

if TYPE_CHECKING:
    from infra.core.state import State
    from infra.providers.gcp_tpu.spec import Spec

#: How long teardown waits for the API to list no request of the cluster.
TEARDOWN_TIMEOUT_S = 900
#: Where `status` keeps the last marker read from the head.
MARKER_FILE = "queued-marker.json"


def slice_requests(spec: Spec, cluster_id: str, owner: str, public_key: str) -> list[queued.SliceRequest]:
    """One SliceRequest per `queued_slices:` entry, with the cluster's labels and SSH key."""
    _, tpu_network = config._networks(spec)
    found = []
    for name, s in spec.queued_slices.items():
        shape = s.slice
        found.append(queued.SliceRequest(
            name=name, accelerator_type=shape.accelerator_type,
            config=(shape.generation.config_type, shape.topology) if shape.topology else None,
            runtime_version=s.runtime, hosts=shape.hosts, chips_per_host=shape.chips_per_host,
            cpus=s.cpus or shape.host_cpus, provisioning=s.provisioning,
            zones=spec.slice_zones(name), count=s.count, reservation=s.reservation,
            valid_until_hours=s.valid_until_hours,
            # Not Ray's cluster label: Ray's provider must never take these nodes for its own.
            labels={**config.node_labels(spec, cluster_id, owner), "rayfleet-queued-slice": name},
            network_config=tpu_network, ssh_keys=f"{spec.ssh_user}:{public_key}"))
    return found


def queue_all(api: Gcp, state: State, requests: list[queued.SliceRequest],
              poll_interval: float) -> None:
    """Queue every slice not requested yet: recorded in state, then created (in its first zone)."""
    for request in requests:
        for index in range(request.count):
            known = [r for r in state.resources(Queued)
                     if r.attrs.slice == request.name and r.attrs.index == index]
            if known:
                continue  # requested by an earlier `up`; the head's joiner replaces lost ones
            zone = request.zones[0]
            qr_id = queued.request_id(state.cluster_id, request.name, index, 0)
            state.add(qr_id, Queued(project=api.project, zone=zone, slice=request.name,
                                    index=index))
            try:
                operation = queued.create(api, zone, qr_id,
                                          queued.body(request, api.project, zone, qr_id))
            except GcpError as exc:
                if exc.status != 409:  # ALREADY_EXISTS: an interrupted earlier `up` made it
                    raise
                continue
            ui.wait_for(_finished(api, operation, f"queueing {qr_id}"),
                        f"queued TPU request {qr_id} ({request.accelerator_type}, "
                        f"{request.provisioning}) in {zone}", timeout=300, interval=poll_interval)


def _finished(api: Gcp, operation: dict[str, Any], what: str) -> Any:
    def check(step: ui.Step) -> bool | None:
        return True if api.poll(operation, what) is not None else None

    return check


def install_joiner(head: HeadAccess, spec: Spec, state: State,
                   requests: list[queued.SliceRequest], head_address: str) -> None:
    """Start (or keep) the head's joiner for this cluster's slices, as the autoscaler's user
    (users.DAEMON_USER): the joiner queues slices with the VM's service account, which only that
    user reaches (guard.sh), and sets hosts up with that user's copies of the cluster's key, the
    installer and the Ray token; its config, marker and log are in that user's home."""
    install = versions.install_args(spec.node_env.tpu_env, backend=spec.node_env.backend)
    mlflow = spec.tracking == "mlflow"
    settings = joiner.Config(
        cluster=spec.name, cluster_id=state.cluster_id, project=spec.project,
        head_address=head_address, ssh_user=spec.ssh_user,
        # Ray copies the cluster's private key to the head for reaching workers.
        ssh_key="~/ray_bootstrap_key.pem",
        token_path=auth.NODE_TOKEN_PATH if auth.token_file(state) else None,
        install_command=(f"bash ~/rayfleet/setup/install.sh {shlex.join(install)} "
                         '--prefix "$HOME/rayfleet/env"'),
        marker=joiner.HEAD_MARKER, poll_s=5,
        # The autoscaled TPU hosts' start commands: Ray as Ray's user, the metadata server guarded.
        start_commands=users.worker_start(bool(auth.token_file(state)), mlflow),
        # `tracking: mlflow`: where the head's server is, and the head's copy of its password.
        tracking_url=tracking_remote.node_url(head_address.rsplit(":", 1)[0]) if mlflow else None,
        tracking_user=tracking.USERNAME if mlflow else None,
        tracking_password_path=tracking_remote.NODE_PASSWORD_PATH if mlflow else None,
        slices=[{**r.__dict__, "config": list(r.config) if r.config else None}
                for r in requests])
    with ui.step(f"starting the queued-slice joiner on the head ({len(requests)} slice type(s))"):
        # A joiner from an earlier `up` would keep its old config: restart it (its marker stays).
        stop_joiner(head)
        head.ensure_daemon("infra.node.gcp_tpu.joiner", joiner.HEAD_CONFIG,
                                    settings.to_json() + "\n", log=joiner.HEAD_LOG,
                                    user=users.DAEMON_USER)


def stop_joiner(head: HeadAccess) -> None:
    """`head`: the head as its daemons run there (the provider's `_daemon_head`)."""
    with contextlib.suppress(RayfleetError):
        head.stop_daemon(joiner.HEAD_CONFIG, users.DAEMON_USER)


def read_marker(head: HeadAccess | None, cluster: str) -> dict[str, Any]:
    """The head's marker (cached here for when the head cannot answer); {} when none."""
    cache = paths.home() / "gcp-tpu" / cluster / MARKER_FILE
    if head is not None:
        text = head.read(joiner.HEAD_MARKER, users.DAEMON_USER)
        if text:
            atomic_write(cache, text)
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


#: What GCP's autodown action (autodown.py) imports on the head for queued slices.
def autodown_args(spec: Spec, state: State) -> dict[str, Any]:
    """What the head's autodown action needs for the cluster's queued slices: the zones their
    requests may be in, and the joiner to stop first (it would re-queue what is being deleted)."""
    if not spec.queued_slices and not state.resources(Queued):
        return {}
    return {"queued_zones": zones_of(spec, state), "stop_first": [f"{joiner.HEAD_CONFIG}.pid"]}


def zones_of(spec: Spec, state: State) -> list[str]:
    """Every zone a request of this cluster may be in: the slices' and the recorded ones."""
    found: list[str] = []
    for name in spec.queued_slices:
        found += [z for z in spec.slice_zones(name) if z not in found]
    for record in state.resources(Queued):
        zone = str(record.attrs.zone)
        if zone not in found:
            found.append(zone)
    return found


def status_rows(api: Gcp, spec: Spec, state: State,
                marker: dict[str, Any]) -> tuple[list[dict[str, str]], list[str]]:
    """A row per request (state, since when, zone) and warnings for lost ones."""
    rows: list[dict[str, str]] = []
    warnings: list[str] = []
    seen = marker.get("requests") or {}
    for zone in zones_of(spec, state):
        for resource in queued.listed(api, zone, state.cluster_id):
            qr_id, current = queued.short(resource), queued.state_of(resource)
            record = seen.get(qr_id) or {}
            since = (record.get("since") if record.get("state") == current
                     else None) or str(resource.get("createTime", ""))
            node = ((resource.get("tpu") or {}).get("nodeSpec") or [{}])[0].get("node") or {}
            tier = "spot" if "spot" in resource else (
                "reserved" if resource.get("reservationName") else "standard")
            rows.append({"kind": "queued TPU request", "name": qr_id,
                         "role": str(node.get("labels", {}).get("rayfleet-queued-slice", "")),
                         "type": f"{node.get('acceleratorType', '?')}, {tier}",
                         "status": f"{current} since {_short_time(since)} in {zone}",
                         "ip": ", ".join(record.get("joined") or []),
                         "state": current, "since": since, "zone": zone})
            if current in queued.LOST:
                replaced = record.get("replaced_by")
                then = (f"re-queued as {replaced}" if replaced else
                        "not re-queued (only spot slices are)" if replaced == "" else
                        "the head's joiner re-queues spot slices")
                warnings.append(f"queued TPU request {qr_id} is {current} in {zone}; {then}")
    if marker.get("error"):
        warnings.append(f"the head's queued-slice joiner reports: {marker['error']}")
    return rows, warnings


def _short_time(text: str) -> str:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        return text or "?"


def teardown(api: Gcp, spec: Spec, state: State) -> None:
    """Delete every request of the cluster (force: their TPU nodes too) in every zone they may be
    in, until the API lists none; only then forget them."""
    zones = zones_of(spec, state)
    if not zones:
        return
    pending: dict[str, dict[str, Any]] = {}

    def check(step: ui.Step) -> bool | None:
        for name, operation in list(pending.items()):
            with contextlib.suppress(GcpError):  # an operation Google dropped: listed again below
                if api.poll(operation, f"deleting {name}") is None:
                    continue
            del pending[name]
        left = [r for zone in zones for r in queued.listed(api, zone, state.cluster_id)]
        if not left:
            return True
        for resource in left:
            name = queued.short(resource)
            if name not in pending and queued.state_of(resource) != "DELETING":
                started = queued.delete(api, str(resource["name"]))
                if started is not None:
                    pending[name] = started
        step.detail(f"{len(left)} left: {', '.join(sorted(queued.short(r) for r in left)[:4])}")
        return None

    ui.wait_for(check, f"no queued TPU request of {state.cluster_id} left in {', '.join(zones)}",
                timeout=TEARDOWN_TIMEOUT_S, interval=api.options.poll_interval)
    for record in state.resources(Queued):
        state.remove(Queued, record.id)
