"""The `lambda` provider's instances at `up`: the SSH key, the recorded rulesets, adopting what an
interrupted run launched, terminating what the spec no longer wants, launching what is missing,
and waiting until every instance is active and accepts SSH. provider.py holds the verb.
"""

from __future__ import annotations

from collections.abc import Callable

from infra.core import ssh, ui
from infra.core.state import State
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import autoscale, firewall, fleet, launching
from infra.providers.lambda_cloud.planning import Capacity
from infra.providers.lambda_cloud.records import Instance
from infra.providers.lambda_cloud.spec import Spec


def provision(client: api.LambdaClient, spec: Spec, state: State, slots: list[fleet.Slot],
              run: str, capacity: Capacity | None, target: Callable[[str], ssh.SshTarget]
              ) -> dict[str, api.Instance]:
    """Instances only: key, reconcile, launch what is missing, wait for active + SSH; the
    instances by slot key (`head`, `worker-<i>`). `capacity`: the plan's listing, used for the
    first launch while it is fresh."""
    state.save()  # the cluster id is on disk before anything carries it
    key_name, _ = fleet.ensure_ssh_key(client, spec, state)
    firewall.sync_recorded(client, state, spec.ssh_source_ranges, firewall.gateway_of(spec))
    live = _reconcile(client, state, {s.key for s in slots}, run, spec.autoscaling)
    regions = {i.region for i in live.values()}
    if spec.file_system and not regions:
        regions = {file_system_region(client, spec)}
    missing = [s for s in slots if s.key not in live]
    if missing:
        types = capacity.fresh(client.limits.launch_interval) if capacity else None
        launcher = launching.Launcher(
            client, spec, state, key_name, run, types,
            rulesets=lambda region: [firewall.ensure(client, state, region,
                                                     spec.ssh_source_ranges,
                                                     firewall.gateway_of(spec))],
            extra_tags=(lambda slot: autoscale.head_tags(spec)) if spec.autoscaling else None)
        launcher.launch(missing, next(iter(regions)) if regions else None)
    nodes = fleet.wait_ready(client, state, lambda i: target(str(i.ip)), spec.boot_timeout_s)
    by_key = {}
    for inst in nodes.values():
        resource = state.update(Instance, inst.id, ip=inst.ip, private_ip=inst.private_ip,
                                status=inst.status)
        by_key[fleet.slot_key(inst.name, resource.attrs) or inst.name] = inst
    return by_key


def _reconcile(client: api.LambdaClient, state: State, wanted: set[str], run: str,
               autoscaling: bool) -> dict[str, api.Instance]:
    """The live instances by slot, after adopting this cluster's orphans and terminating what
    no slot wants (gone from the spec, duplicates, failed)."""
    listed = fleet.adopt_orphans(client, state, run, skip_autoscaled=autoscaling)
    attrs = {r.id: r.attrs for r in state.resources(Instance)}
    live: dict[str, api.Instance] = {}
    drop = []
    for inst in sorted(listed, key=lambda i: i.status != "active"):
        if inst.status in api.GONE:
            continue
        key = fleet.slot_key(inst.name, attrs.get(inst.id)) or ""
        if key not in wanted or key in live or inst.status in api.FAILED:
            why = ("not in the spec any more" if key not in wanted else
                   "a duplicate" if key in live else inst.status)
            ui.info(f"terminating {inst.name} ({inst.id}): {why}")
            drop.append(inst.id)
        else:
            live[key] = inst
    fleet.terminate(client, state, drop)
    return live


def file_system_region(client: api.LambdaClient, spec: Spec) -> str:
    """A file system lives in one region, which then is the cluster's."""
    name = spec.file_system
    found = next((f for f in client.file_systems() if f.name == name), None)
    if found is None:
        raise fleet.LambdaProvisionError(
            f"{spec.source}: file_system: no file system named {name!r} in the account; "
            "create it in the Lambda console or remove the key")
    if not any(c.region == found.region for c in spec.head.choices):
        raise fleet.LambdaProvisionError(
            f"{spec.source}: file_system: {name!r} is in {found.region} but no head "
            f"choice is; add a choice in {found.region}")
    return found.region
