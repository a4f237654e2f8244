"""GCP's side of `invoke sweep` (infra/cli/sweep.py): Compute VMs and TPU nodes labelled with a cluster id.

Labels `rayfleet-cluster` / `rayfleet-owner` (infra/node/identity.py) mark what rayfleet created. GCP has
no account-wide listing that is cheap to ask, so the sweep looks where this checkout could have
created something: every project and zone named by a gcp-tpu spec in `clusters/` or recorded in a
state file here, with that spec's credentials. Prices are estimates from prices.py.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from infra.core import paths
from infra.core.errors import ProviderError, RayfleetError
from infra.node import identity, wait
from infra.node.gcp_tpu.api import ApiOptions, Gcp, GcpError, find_credentials
from infra.providers.base import Marked
from infra.providers.base import Sweeper as BaseSweeper
from infra.providers.gcp_tpu import prices

PROVIDER = "gcp-tpu"


def _places() -> set[tuple[str, str, str | None]]:
    """(project, zone, credentials file) of every gcp-tpu spec and state of this checkout."""
    from infra.core import spec as spec_mod
    from infra.core.state import State
    from infra.providers.gcp_tpu.records import Cluster, Queued
    from infra.providers.gcp_tpu.spec import Spec

    places = set()
    for path in sorted(paths.clusters_dir().glob("*.yaml")):
        with contextlib.suppress(RayfleetError, OSError):
            raw = spec_mod.read_spec(path)
            if isinstance(raw, dict) and raw.get("provider") == PROVIDER:
                data = spec_mod.parse_spec(path, raw, [PROVIDER], lambda _: Spec).model_dump()
                places.add((str(data["project"]), str(data["zone"]), data.get("credentials_file")))
                for queued_slice in (data.get("queued_slices") or {}).values():
                    for zone in queued_slice.get("zones") or data.get("zones") or []:
                        places.add((str(data["project"]), str(zone), data.get("credentials_file")))
    for path in sorted(paths.state_dir().glob("*.json")):
        with contextlib.suppress(RayfleetError):
            current = State.load(path)
            if current is None or current.provider != PROVIDER:
                continue
            for cluster in current.resources(Cluster):
                places.add((cluster.attrs.project, cluster.attrs.zone,
                            cluster.attrs.credentials_file))
            for request in current.resources(Queued):
                if request.attrs.project:
                    places.add((request.attrs.project, request.attrs.zone, None))
    return places


class Sweeper(BaseSweeper):
    provider: ClassVar[str] = PROVIDER
    timeout_s: ClassVar[float] = 60.0
    wait_s: ClassVar[float] = 600.0

    def __init__(self, options: ApiOptions | None = None) -> None:
        self._options = options or ApiOptions.from_env()
        self._apis: dict[tuple[str, str | None], Gcp] = {}
        self._zones: dict[tuple[str, str | None], set[str]] = {}

    def credentials(self) -> str | None:
        sources = []
        for project, zone, key_file in sorted(_places(), key=str):
            try:
                found = find_credentials(key_file, "the spec")
            except GcpError:
                continue
            self._apis.setdefault((project, key_file), Gcp(project, found, self._options))
            self._zones.setdefault((project, key_file), set()).add(zone)
            sources.append(f"{found.source} for {project}")
        return "; ".join(sorted(set(sources))) or None

    def marked(self) -> list[Marked]:
        found: dict[str, Marked] = {}
        for key, api in self._apis.items():
            for zone in sorted(self._zones[key]):
                for item in (self._instances(api, zone) + self._tpu_nodes(api, zone)
                             + self._queued(api, zone)):
                    found[item.id] = item
        return list(found.values())

    @staticmethod
    def _labels(resource: dict[str, Any]) -> tuple[str, str, str]:
        labels = resource.get("labels") or {}
        return (str(labels.get(identity.TAG_CLUSTER, "")), str(labels.get(identity.TAG_OWNER, "")),
                str(labels.get(identity.TAG_NAME, "")))

    def _instances(self, api: Gcp, zone: str) -> list[Marked]:
        items = []
        for vm in api.instances_labelled(zone, identity.TAG_CLUSTER):
            cluster_id, owner, name = self._labels(vm)
            labels = vm.get("labels") or {}
            if not identity.is_cluster_id(cluster_id) or "tpu_cores" in labels:
                continue  # not ours; or a TPU VM's own instance (its TPU node is listed instead)
            scheduling = vm.get("scheduling") or {}
            kind = "spot" if scheduling.get("provisioningModel") == "SPOT" else (
                "preemptible" if scheduling.get("preemptible") else "standard")
            items.append(Marked(
                PROVIDER, "Compute VM", f"{api.project}/{zone}/instances/{vm['name']}", vm["name"],
                cluster_id, owner, name, str(vm.get("status", "")), zone,
                prices.machine_hourly(str(vm.get("machineType", "")), kind)
                if vm.get("status") != "TERMINATED" else 0.0,
                {"project": api.project, "zone": zone, "kind": "instance"}))
        return items

    def _tpu_nodes(self, api: Gcp, zone: str) -> list[Marked]:
        items = []
        for node in api.tpu_nodes(zone, {}):  # whoever's: the labels are checked below
            cluster_id, owner, name = self._labels(node)
            if not identity.is_cluster_id(cluster_id) or "rayfleet-queued-slice" in (
                    node.get("labels") or {}):
                continue  # not ours; or a queued slice's node (listed, and deleted, by request)
            scheduling = node.get("schedulingConfig") or {}
            kind = "spot" if scheduling.get("spot") else (
                "preemptible" if scheduling.get("preemptible") else "standard")
            short = str(node["name"]).rsplit("/", 1)[-1]
            items.append(Marked(
                PROVIDER, f"TPU node ({node.get('acceleratorType', '?')})", str(node["name"]),
                short, cluster_id, owner, name, str(node.get("state", "")), zone,
                prices.tpu_hourly(str(node.get("acceleratorType", "")), None, kind),
                {"project": api.project, "zone": zone, "kind": "tpu"}))
        return items

    def _queued(self, api: Gcp, zone: str) -> list[Marked]:
        """Queued TPU requests whose id and node labels carry a cluster id (queued.py)."""
        from infra.node.gcp_tpu import queued

        items = []
        for resource in api.queued_resources(zone):
            parsed = queued.parse_id(queued.short(resource))
            if parsed is None or not queued.ours(resource, parsed[0]):
                continue
            node = ((resource.get("tpu") or {}).get("nodeSpec") or [{}])[0].get("node") or {}
            _, owner, name = self._labels(node)
            accelerator = str(node.get("acceleratorType", "?"))
            state = queued.state_of(resource)
            kind = "spot" if "spot" in resource else "standard"
            items.append(Marked(
                PROVIDER, f"queued TPU request ({accelerator})", str(resource["name"]),
                queued.short(resource), parsed[0], owner, name, state, zone,
                prices.tpu_hourly(accelerator, None, kind) if state in queued.BILLED else 0.0,
                {"project": api.project, "zone": zone, "kind": "queued"}))
        return items

    def delete(self, items: list[Marked]) -> None:
        started = []
        for item in items:
            api = next(a for (project, _), a in self._apis.items() if project == item.attrs["project"])
            if item.attrs["kind"] == "queued":
                from infra.node.gcp_tpu import queued

                operation = queued.delete(api, item.id)  # force: its nodes go with it
            elif item.attrs["kind"] == "tpu":
                operation = api.delete_tpu_node(item.id)
            else:
                operation = api.delete_instance(item.attrs["zone"], item.name)
            started.append((api, item, operation))
        pending = [(api, item, operation) for api, item, operation in started
                   if operation is not None]  # None: already gone

        def all_deleted() -> bool | None:
            pending[:] = [(api, item, operation) for api, item, operation in pending
                          if api.poll(operation, f"deleting {item.name}") is None]
            return True if not pending else None

        if pending:
            wait.until(all_deleted, self.wait_s, pending[0][0].options.poll_interval,
                       on_timeout=lambda: ProviderError(f"{pending[0][1].name} is still being deleted after "
                                             f"{self.wait_s:g}s; run `invoke sweep --delete` again"))
