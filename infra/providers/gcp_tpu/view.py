"""`invoke status` for gcp-tpu: the cluster's VMs, TPU nodes, queued requests and firewall rule as
the APIs list them now, the warnings a user must act on, and what it all costs (estimate); and
the reads `up` and `invoke check` share: the head VM by its labels, waiting on the APIs'
operations, and the readiness checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infra.core import ui
from infra.core.costs import Cost
from infra.node import identity
from infra.node.gcp_tpu.api import ApiOptions, Gcp, GcpError
from infra.providers.base import ProviderStatus, Readiness
from infra.providers.gcp_tpu import config, slices
from infra.providers.gcp_tpu.records import Cluster, Firewall, Queued

if TYPE_CHECKING:
    from infra.core.head import HeadAccess
    from infra.core.state import Resource, State
    from infra.providers.gcp_tpu.spec import Spec



def ips(instance: dict[str, Any]) -> tuple[str, str]:
    """(external, internal) address of a Compute instance; "" where there is none."""
    interface = (instance.get("networkInterfaces") or [{}])[0]
    nat = (interface.get("accessConfigs") or [{}])[0].get("natIP", "")
    return str(nat or ""), str(interface.get("networkIP", ""))


def status(spec: Spec, state: State, api: Gcp,
           daemon_head: Callable[[Resource[Cluster]], HeadAccess]) -> ProviderStatus:
    clusters, rules = state.resources(Cluster), state.resources(Firewall)
    first = (clusters or rules)[0]
    rows: list[dict[str, str]] = []
    warnings: list[str] = []
    running = False
    for cluster in clusters:
        zone = cluster.attrs.zone
        ours = config.sweep_labels((cluster.attrs.label_id or cluster.id), cluster.id)
        for i in api.instances(zone, ours):
            labels = i.get("labels", {})
            if "tpu_cores" in labels:
                continue  # a TPU VM's own Compute instance; its TPU node is listed below
            external, internal = ips(i)
            role = labels.get("ray-node-type", "?")
            running |= role == "head" and i.get("status") == "RUNNING"
            if i.get("status") == "TERMINATED":
                warnings.append(f"{i['name']} is TERMINATED but still bills its disk; "
                                "`invoke teardown` deletes it")
            rows.append({"kind": "Compute VM", "name": i["name"], "role": role,
                         "type": labels.get("ray-user-node-type", ""),
                         "status": str(i.get("status")), "ip": external or internal})
        for n in api.tpu_nodes(zone, ours):
            endpoints = n.get("networkEndpoints") or [{}]
            ip = (endpoints[0].get("accessConfig") or {}).get("externalIp") or endpoints[0].get(
                "ipAddress", "")
            if n.get("state") == "PREEMPTED":
                warnings.append(f"TPU {n['name'].rsplit('/', 1)[-1]} was preempted")
            rows.append({"kind": f"TPU VM ({n.get('acceleratorType', '?')}, "
                                 f"{len(endpoints)} host(s))",
                         "name": n["name"].rsplit("/", 1)[-1], "role": "worker",
                         "type": n.get("labels", {}).get("ray-user-node-type", ""),
                         "status": str(n.get("state")), "ip": str(ip)})
    if spec.queued_slices or state.resources(Queued):
        head = next((c for c in clusters if c.attrs.head_ip), None)
        marker = slices.read_marker(daemon_head(head) if head else None, spec.name)
        queued_rows, queued_warnings = slices.status_rows(api, spec, state, marker)
        rows += queued_rows
        warnings += queued_warnings
    for rule in rules:
        rows.append({"kind": "firewall rule", "name": rule.id, "role": "dashboard",
                     "type": f"tcp:{rule.attrs.port}",
                     "status": ", ".join(rule.attrs.ranges), "ip": ""})
    zone = clusters[0].attrs.zone if clusters else spec.zone
    nodes = sum(1 for r in rows if r["kind"] not in ("firewall rule", "queued TPU request"))
    summary = (f"{'head RUNNING' if running else 'head NOT running'}, {nodes} node(s) in "
               f"{first.attrs.project}/{zone}")
    return ProviderStatus(running, summary, rows, warnings,
                          cost=current_cost(api, spec, state, clusters))


def current_cost(api: Gcp, spec: Spec, state: State, clusters: list[Resource[Cluster]]) -> Cost:
    """What the cluster's VMs, TPU nodes and queued slices' nodes cost now (estimate), from a
    listing of their own: kept apart from `status`'s table so that each can change alone."""
    from infra.providers.gcp_tpu import prices

    vms: list[dict[str, Any]] = []
    tpus: list[dict[str, Any]] = []
    for cluster in clusters:
        labels = config.sweep_labels((cluster.attrs.label_id or cluster.id), cluster.id)
        vms += api.instances(cluster.attrs.zone, labels)
        tpus += api.tpu_nodes(cluster.attrs.zone, labels)
    if spec.queued_slices or state.resources(Queued):
        # Queued slices' nodes carry the cluster id but not Ray's cluster label.
        for zone in slices.zones_of(spec, state):
            tpus += [n for n in api.tpu_nodes(zone, {identity.TAG_CLUSTER: state.cluster_id})
                     if "rayfleet-queued-slice" in (n.get("labels") or {})]
    return prices.current_cost(vms, tpus)


def head(api: Gcp, zone: str, label_id: str, name: str) -> dict[str, Any] | None:
    labels = {**config.sweep_labels(label_id, name), "ray-node-type": "head"}
    heads = [i for i in api.instances(zone, labels)
             if i.get("status") not in ("STOPPING", "TERMINATED", "SUSPENDED")]
    return heads[0] if heads else None


def wait_operations(operations: list[dict[str, Any]], what: str, api: Gcp,
          timeout: float = 300) -> None:
    pending = list(operations)

    def check(step: ui.Step) -> bool | None:
        pending[:] = [op for op in pending if api.poll(op, what) is None]
        step.detail(f"{len(pending)} operation(s) running")
        return None if pending else True

    ui.wait_for(check, what, timeout=timeout, interval=api.options.poll_interval)


def readiness(spec: Spec, options: ApiOptions) -> list[Readiness]:
    """Credentials (read, never refreshed here), then one read of each API the cluster uses:
    the project (Compute Engine) and the zone's accelerator types (Cloud TPU)."""
    from infra.node.gcp_tpu.api import find_credentials

    try:
        found = find_credentials(spec.credentials_file, spec.source)
    except GcpError as exc:
        return [_readiness("Google credentials", exc)]
    api = Gcp(spec.project, found, options)
    rows = [Readiness("Google credentials", True, found.source)]
    for what, call in (("Compute Engine API", api.get_project),
                       ("Cloud TPU API", lambda: api.accelerator_types(spec.zone))):
        try:
            call()
        except GcpError as exc:
            rows.append(_readiness(what, exc))
            break
        rows.append(Readiness(what, True, f"answers for project {spec.project}"))
    return rows


def _readiness(what: str, exc: GcpError) -> Readiness:
    """A failed check, its message split into what is wrong and the fix it names."""
    return Readiness.failed(what, str(exc).removeprefix("gcp-tpu: "), "see the message")
