"""Lambda instances of one cluster: naming, tags, SSH key, adoption, waits, termination (the launch
with fallbacks: launching.py).

Ownership is decided by the cluster id (infra/node/identity.py) and nothing else: an instance is ours
when its id is in the state file or when it carries the launch tag `rayfleet-cluster=<our id>`
(a run killed between the API's answer and the state write leaves such an instance; `up` adopts
it, `teardown` terminates it). Names carry the id too, for people reading the console, but a name
is never proof: a colleague's `lambda-head` made from the same example spec is at most mentioned.
Every id is written to state the moment the API returns it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.core import ssh, ui
from infra.core.errors import ProviderError
from infra.core.state import State
from infra.node import identity, wait
from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.tags import TAG_LAUNCH, TAG_LAUNCHED_AT, TAG_NODE
from infra.providers.lambda_cloud.records import Instance, SshKey

if TYPE_CHECKING:
    from infra.providers.lambda_cloud.spec import Choice, Spec

__all__ = ["TAG_LAUNCH", "TAG_LAUNCHED_AT", "TAG_NODE"]  # launch-tag keys live in tags.py


class LambdaProvisionError(ProviderError):
    """The cluster could not be completed; `attempts` says which choice failed how."""

    def __init__(self, message: str, attempts: list[str] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


class InstanceFailed(ProviderError):
    """An instance turned unhealthy, terminated or vanished while we waited for it."""


@dataclass(frozen=True)
class Slot:
    """One node of a fixed-size cluster: its key (`head`, `worker-<i>`) and instance name."""

    name: str
    role: str  # "head" or "worker"
    index: int  # 0 for the head, 1.. for workers

    @property
    def key(self) -> str:
        return "head" if self.role == "head" else f"worker-{self.index}"


def base_name(cluster: str, cluster_id: str) -> str:
    """`<cluster>-<id>`: every instance name of this cluster starts with it (<= 40 characters)."""
    return f"{cluster}-{cluster_id}"


def slots(cluster: str, workers: int, cluster_id: str) -> list[Slot]:
    base = base_name(cluster, cluster_id)
    return [Slot(f"{base}-head", "head", 0),
            *(Slot(f"{base}-worker-{i}", "worker", i) for i in range(1, workers + 1))]


_SLOT_SUFFIX = re.compile(r"-(head|worker-[1-9][0-9]*)$")


def slot_key(name: str, attrs: Instance | None = None) -> str | None:
    """Which slot an instance fills: recorded at launch, else read from its name (states
    written before cluster ids recorded names like `<cluster>-worker-2` only)."""
    if attrs and attrs.slot:
        return attrs.slot
    match = _SLOT_SUFFIX.search(name)
    return match.group(1) if match else None


def lookalike_pattern(cluster: str) -> re.Pattern[str]:
    """Names a cluster of this name would use, with or without an id: only for mentioning."""
    return re.compile(rf"^{re.escape(cluster)}-(?:[0-9a-f]{{8}}-)?(?:head|worker-[0-9]+)")


def identity_tags(state: State, node: str) -> dict[str, str]:
    """The tags every instance of this cluster is launched with."""
    return {identity.TAG_CLUSTER: state.cluster_id, identity.TAG_OWNER: state.owner,
            identity.TAG_NAME: state.cluster, TAG_NODE: node,
            TAG_LAUNCHED_AT: str(int(time.time()))}


def is_ours(inst: api.Instance, cluster_id: str) -> bool:
    return inst.tags.get(identity.TAG_CLUSTER) == cluster_id


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# --- SSH key ----------------------------------------------------------------------------------------


def generated_key_name(cluster: str, cluster_id: str, public_key: str) -> str:
    """Cluster-scoped (name and id) and tied to our local key: a clash means it is the same key."""
    blob = public_key.split()[1].encode()
    return f"rayfleet-{cluster}-{cluster_id}-{hashlib.sha256(blob).hexdigest()[:8]}"


def ensure_ssh_key(client: api.LambdaClient, spec: Spec, state: State) -> tuple[str, Path]:
    """The key name instances launch with and the private key file that logs into them."""
    if spec.ssh_key_name:
        if spec.ssh_key_name not in {k.name for k in client.ssh_keys()}:
            raise LambdaProvisionError(
                f"{spec.source}: ssh_key_name: no SSH key named {spec.ssh_key_name!r} in the "
                "account; register it in the Lambda console or remove the key to let rayfleet "
                "generate one")
        path = spec.private_key_path()
        assert path is not None  # the spec validator requires both
        return spec.ssh_key_name, path
    pair = ssh.ensure_keypair(spec.name)
    name = generated_key_name(spec.name, state.cluster_id, pair.public_key)
    for resource in state.resources(SshKey):
        if resource.attrs.name == name:
            return name, pair.private_path
    try:
        key = client.add_ssh_key(name, pair.public_key)
    except api.InvalidParameters:
        # Most likely the name exists: an earlier run registered it and lost the answer.
        existing = next((k for k in client.ssh_keys() if k.name == name), None)
        if existing is None:
            raise
        key = existing
        if key.public_key.split()[:2] != pair.public_key.split()[:2]:
            raise LambdaProvisionError(
                f"SSH key {name!r} in the account is not {pair.private_path}.pub; delete it in "
                "the Lambda console and run again") from None
    state.add(key.id, SshKey(name=key.name, registered=True))
    return name, pair.private_path


def delete_ssh_keys(client: api.LambdaClient, spec: Spec, state: State) -> None:
    """Delete the key(s) we registered: those in state, and our deterministic name if present."""
    names = {r.attrs.name for r in state.resources(SshKey)}
    public = ssh.ensure_keypair(spec.name).public_key if _local_key_exists(spec) else None
    if public and not spec.ssh_key_name:
        names.add(generated_key_name(spec.name, state.cluster_id, public))
    if not names:
        return
    for key in client.ssh_keys():
        if key.name in names:
            with contextlib.suppress(api.NotFound, api.InvalidParameters):  # already gone
                client.delete_ssh_key(key.id)
            ui.info(f"deleted SSH key {key.name} from the account")
    for resource in state.resources(SshKey):
        state.remove(SshKey, resource.id)


def _local_key_exists(spec: Spec) -> bool:
    from infra.core import paths

    return (paths.keys_dir(spec.name) / ssh.KEY_NAME).exists()


# --- reconciling ------------------------------------------------------------------------------------


def record(state: State, instance_id: str, slot_name: str, choice: Choice | None, price: int,
           run: str, role: str | None = None, slot: str | None = None) -> None:
    state.add(instance_id, Instance(
        name=slot_name, launched_at=now_iso(), run=run, price_cents_per_hour=price, role=role,
        slot=slot, **({"instance_type": choice.instance_type, "region": choice.region}
                      if choice is not None else {})))


def ours(state: State, listed: Iterable[api.Instance]) -> tuple[
        dict[str, api.Instance], list[api.Instance], list[api.Instance]]:
    """(instances in state by id, orphans: tagged with our cluster id but not in state,
    look-alikes: named like this cluster but without our id, never touched), excluding gone."""
    known = {r.id for r in state.resources(Instance)}
    pattern = lookalike_pattern(state.cluster)
    tracked, orphans, lookalikes = {}, [], []
    for inst in listed:
        if inst.id in known:
            tracked[inst.id] = inst
        elif inst.status in api.GONE:
            continue
        elif is_ours(inst, state.cluster_id):
            orphans.append(inst)
        elif pattern.match(inst.name):
            lookalikes.append(inst)
    return tracked, orphans, lookalikes


#: Look-alikes already named in this process: `teardown` lists the account's instances again
#: at each step and poll (the same colleague's instance was named ten times in one teardown).
_MENTIONED: set[str] = set()


def mention_lookalikes(lookalikes: list[api.Instance]) -> None:
    """Say once per command that an instance named like this cluster is not ours."""
    for inst in lookalikes:
        if inst.id in _MENTIONED:
            continue
        _MENTIONED.add(inst.id)
        ui.info(f"{inst.name} ({inst.id}) is named like this cluster but is not ours (no "
                f"{identity.TAG_CLUSTER} tag of this cluster): left alone")


def autoscaled(inst: api.Instance) -> bool:
    """A worker the head's autoscaler launched (it manages it; `up` leaves it alone)."""
    return inst.tags.get("ray-node-type") == "worker"


def adopt_orphans(client: api.LambdaClient, state: State, run: str,
                  skip_autoscaled: bool = False) -> list[api.Instance]:
    """Write instances tagged with our cluster id into state (so a crash from here on still
    knows them); return every live instance of ours. `skip_autoscaled` leaves the autoscaler's
    workers out (`up`); teardown takes them all."""
    listed = client.instances()
    tracked, orphans, lookalikes = ours(state, listed)
    if skip_autoscaled:
        orphans = [i for i in orphans if not autoscaled(i)]
    mention_lookalikes(lookalikes)
    for inst in orphans:
        ui.warn(f"found {inst.name} ({inst.id}, {inst.status}) of this cluster (tagged with its "
                "id) from an interrupted run or the autoscaler; adopting it")
        state.add(inst.id, Instance(name=inst.name, instance_type=inst.type_name,
                                    region=inst.region,
                                    price_cents_per_hour=inst.price_cents_per_hour,
                                    launched_at=tag_time(inst), run="adopted",
                                    slot=inst.tags.get(TAG_NODE)))
    for resource in state.resources(Instance):
        if resource.id not in tracked and resource.id not in {o.id for o in orphans}:
            _forget_if_gone(client, state, resource.id)
    return [i for i in listed if state.find(Instance, i.id)
            and not (skip_autoscaled and autoscaled(i))]


def tag_time(inst: api.Instance) -> str | None:
    raw = inst.tags.get(TAG_LAUNCHED_AT, "")
    if not raw.isdigit():
        return None
    return dt.datetime.fromtimestamp(int(raw), dt.timezone.utc).isoformat(timespec="seconds")


def _forget_if_gone(client: api.LambdaClient, state: State, instance_id: str) -> bool:
    try:
        status = client.instance(instance_id).status
    except api.NotFound:
        status = "terminated"
    if status in api.GONE:
        state.remove(Instance, instance_id)
        return True
    return False


# --- waiting ----------------------------------------------------------------------------------------


def wait_ready(client: api.LambdaClient, state: State, targets: Callable[[api.Instance], ssh.SshTarget],
               timeout: float) -> dict[str, api.Instance]:
    """Wait until every instance in state is active with an IP and accepts SSH; by name.

    Polls one `GET /instances` per round (all nodes at once) and probes SSH in parallel. An
    instance that turns unhealthy, terminated or vanishes ends the wait with its name and status.
    """
    from concurrent.futures import ThreadPoolExecutor

    wanted = {r.id: r.attrs.name for r in state.resources(Instance)}
    ready: dict[str, api.Instance] = {}
    reasons: dict[str, str] = {}

    def check(step: ui.Step) -> dict[str, api.Instance] | None:
        listed = {i.id: i for i in client.instances()}
        probe: list[api.Instance] = []
        for instance_id, name in wanted.items():
            inst = listed.get(instance_id)
            if inst is None:
                if _forget_if_gone(client, state, instance_id):
                    raise InstanceFailed(f"{name} ({instance_id}) vanished from the account while "
                                         "booting; run `invoke up` again to replace it")
                reasons[name] = "not listed yet"
            elif inst.status in api.FAILED:
                raise InstanceFailed(f"{name} ({instance_id}) is {inst.status} instead of active; "
                                     "run `invoke up` again to replace it, or `invoke teardown`")
            elif inst.status != "active" or not inst.ip:
                reasons[name] = inst.status if inst.status != "active" else "active, no IP yet"
            elif name not in ready:
                probe.append(inst)
        if probe:
            with ThreadPoolExecutor(max_workers=min(8, len(probe))) as pool:
                results = list(pool.map(lambda i: ssh.probe(targets(i), timeout=5), probe))
            for inst, reason in zip(probe, results, strict=True):
                if reason is None:
                    ready[inst.name] = inst
                else:
                    reasons[inst.name] = "active, SSH not answering yet"
        pending = sorted(n for n in wanted.values() if n not in ready)
        waiting = ", ".join(f"{n}: {reasons.get(n, '?')}" for n in pending)
        step.detail(f"{len(ready)}/{len(wanted)} ready" + (f"; {waiting}" if waiting else ""))
        return dict(ready) if not pending else None

    return ui.wait_for(check, f"{len(wanted)} instance(s) to be active and accept SSH",
                       timeout=timeout, interval=0.0,
                       hint="see `invoke status`; the instances stay in state for `invoke teardown`")


# --- terminating ------------------------------------------------------------------------------------


def terminate(client: api.LambdaClient, state: State, ids: list[str], timeout: float = 600) -> None:
    """Terminate exactly `ids` (all in state), wait until the API reports each gone, and remove
    each from state as it goes."""
    if not ids:
        return
    listed = {i.id: i for i in client.instances()}
    for instance_id in ids:
        if instance_id not in listed:
            _forget_if_gone(client, state, instance_id)
    live = [i for i in ids if i in listed and listed[i].status not in ("terminating", *api.GONE)]
    if live:
        try:
            client.terminate(live)
        except api.NotFound:
            for instance_id in live:  # one vanished meanwhile; the batch is refused as a whole
                with contextlib.suppress(api.NotFound):
                    client.terminate([instance_id])
    pending = {i for i in ids if state.find(Instance, i)}

    def check(step: ui.Step) -> bool | None:
        now = {i.id: i for i in client.instances()}
        for instance_id in sorted(pending):
            inst = now.get(instance_id)
            gone = _forget_if_gone(client, state, instance_id) if inst is None \
                else inst.status in api.GONE
            if gone:
                state.remove(Instance, instance_id)
                pending.discard(instance_id)
            elif inst is not None and inst.status not in ("terminating", *api.GONE):
                with contextlib.suppress(api.NotFound):  # the call was lost, or it was restarted
                    client.terminate([instance_id])
        step.detail(f"{len(ids) - len(pending)}/{len(ids)} terminated")
        return True if not pending else None

    ui.wait_for(check, f"Lambda to report {len(ids)} instance(s) terminated", timeout=timeout,
                interval=0.0, hint="run `invoke teardown` again")


def terminate_until_quiet(client: api.LambdaClient, state: State, autoscaling: bool) -> None:
    """Terminate whatever carries the cluster's id, again and again; with an autoscaler, until
    a listing a launch interval and a half after the last one shows none (a launch in flight
    when the head died may still appear)."""
    quiet_since: float | None = None

    def quiet() -> bool | None:
        nonlocal quiet_since
        adopt_orphans(client, state, "teardown")
        left = [r.id for r in state.resources(Instance)]
        if left:
            terminate(client, state, left)
            quiet_since = None
            return None
        if not autoscaling:
            return True
        if quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= client.limits.launch_interval * 1.5:
            return True
        return None

    # No deadline: every round either terminates something or counts toward the quiet period.
    wait.until(quiet, math.inf, client.limits.routine_interval, "every instance gone")
