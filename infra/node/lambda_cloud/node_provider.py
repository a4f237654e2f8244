"""Ray node provider for Lambda Cloud: Ray's own autoscaler (v2) launches and removes workers.

Loaded by the head's monitor as `provider: {type: external, module:
infra.node.lambda_cloud.node_provider.LambdaNodeProvider}`. It imports only Ray (filelock is
Ray's dependency), requests and the node package, which `up` copies to the head as one zip
(infra/core/shipping.py) from the checkout that runs `up`.

What it guarantees (Ray's contract, autoscaling.md section 1):
- Identity lives on the instance: launch tags carry the cluster id, owner mark, cluster name,
  node type, Ray's immutable node tags (kind, user node type, launch hash, launch request) and a
  launch token; names are `<cluster>-<id>-<type>-<token>`. Only instances tagged with this
  cluster's id are listed, so a colleague's instance can never be scaled, adopted or removed.
- Mutable tags (Ray's node status) live in a state file on the head, locked (filelock, per
  thread and process) and replaced atomically; a lost file costs only statuses, never ownership.
- `create_node` writes the instance id to that file before it returns; a booting instance is
  listed at once, a terminated one is dropped at once (the instance list is cached between
  refreshes so the reconcile loop does not spend the API's request budget).
- Capacity is read from /instance-types before a launch, unless an idle-time read is younger
  than one launch interval (`up` trusts its plan's listing as long); only a listed "yes" is
  trusted that way (Lambda's insufficient-capacity answer checks it), a listed "no" is read again.
  Choices are tried in order, moving on at insufficient-capacity; when every choice of a type
  fails, that type is not retried for `failure_backoff_s` (no tight relaunch loop).
- Pacing (one launch per 12 s; routine requests at half the account's 1 request/s, the user's
  machine having the other half) and 429/5xx backoff are api.LambdaClient's.
- The API key is read from a 0600 file (`api_key_file`), never from this config, which Ray copies
  around and logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from filelock import FileLock
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
)

from infra.node import identity
from infra.node.files import atomic_write
from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.tags import TAG_LAUNCH, TAG_LAUNCHED_AT, TAG_NODE, valid

logger = logging.getLogger(__name__)
#: InstanceLaunchRequest.name: maxLength 64 (Lambda's OpenAPI 1.8.3).
NAME_MAX = 64

#: Statuses after which an instance is no longer a node of the cluster.
_ENDED = frozenset({"terminating", *api.GONE})
#: Ray tags that change after launch: kept in the head's state file, not on the instance.
_MUTABLE = frozenset({TAG_RAY_NODE_STATUS})


class NoCapacity(RuntimeError):
    """No choice of a node type could be launched now (the autoscaler retries later)."""


class TagStore:
    """Mutable node tags by instance id in one JSON file, safe across threads and processes
    (filelock, which Ray depends on: one OS lock per thread, so threads exclude each other too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(f"{path}.lock", mode=0o600, thread_local=True)

    def _locked(self) -> FileLock:
        return self._lock

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, dict[str, str]]) -> None:
        atomic_write(self.path, json.dumps(data, sort_keys=True), mode=0o600)

    def get(self, instance_id: str) -> dict[str, str]:
        with self._locked():
            return dict(self._read().get(instance_id, {}))

    def all(self) -> dict[str, dict[str, str]]:
        with self._locked():
            return self._read()

    def update(self, instance_id: str, tags: dict[str, str]) -> None:
        with self._locked():
            data = self._read()
            data.setdefault(instance_id, {}).update(tags)
            self._write(data)

    def remove(self, instance_ids: list[str]) -> None:
        with self._locked():
            data = self._read()
            for instance_id in instance_ids:
                data.pop(instance_id, None)
            self._write(data)


def read_key_file(path: str) -> str:
    """The API key from the head's 0600 key file; a readable-by-others file is refused."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode & 0o777
        key = file.read_text().strip()
    except OSError as exc:
        raise RuntimeError(f"cannot read the Lambda API key file {file} ({exc.strerror})") from None
    if mode & 0o077:
        raise RuntimeError(f"{file} is readable by others (mode {mode:o}); chmod 600 it")
    if not key:
        raise RuntimeError(f"{file} is empty")
    return key


class LambdaNodeProvider(NodeProvider):
    """See the module docstring. Every public method is thread-safe."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        config = provider_config
        self.cluster_id = str(config["cluster_id"])
        self.cluster = str(config.get("cluster", cluster_name))
        self.owner = str(config.get("owner", ""))
        self.region = str(config["region"])
        self.ssh_key_name = str(config["ssh_key_name"])
        self.firewall_rulesets = [str(r) for r in config.get("firewall_rulesets", [])]
        scale = float(config.get("rate_scale", 1.0))
        limits = api.Limits.scaled(scale, float(config.get("request_share", 0.5)))
        url = api.base_url(config.get("api_url"))  # else LAMBDA_API_URL, else Lambda's
        self.client = api.LambdaClient(read_key_file(str(config["api_key_file"])), url, limits)
        self.store = TagStore(Path(str(config.get("state_file", "~/.rayfleet/lambda-nodes.json")))
                              .expanduser())
        self.list_interval = float(config.get("list_interval_s", 5.0 * scale))
        self.failure_backoff = float(config.get("failure_backoff_s", 60.0 * scale))
        self._lock = threading.RLock()
        #: Our instances as last listed (plus launches not listed yet), by id.
        self._nodes: dict[str, api.Instance] = {}
        self._listed_at = 0.0
        #: Launched by us, not yet seen in a listing: listed anyway (Ray must see them at once).
        self._pending: dict[str, api.Instance] = {}
        #: Terminated by us: never listed again, whatever a stale listing says.
        self._terminated: set[str] = set()
        #: Node type -> monotonic time before which it is not launched again (all choices failed).
        self._backoff: dict[str, float] = {}
        #: Set once the launches of other processes (the head's, by `up`) have been accounted for.
        self._paced_after_others = False
        #: Lambda's instance types as last read, when (monotonic), and whether a read is under way
        #: in the background. While idle, Ray's loop keeps this younger than one launch interval,
        #: so that a scale-up from idle launches without first waiting a request interval for a
        #: read (issue 38: 1 s of every first worker).
        self._types: dict[str, api.InstanceType] = {}
        self._types_at = float("-inf")
        self._types_reading = False
        self._launching = 0

    # --- listing --------------------------------------------------------------------------------

    @property
    def capacity_read_at(self) -> float:
        """When (monotonic) the instance types were last read; -inf before the first read."""
        return self._types_at

    def refresh(self, force: bool = False) -> None:
        """List our instances again, unless the last listing is younger than the interval
        (`force`: list now)."""
        with self._lock:
            # While an instance of ours boots, look as often as our share of the budget allows:
            # the autoscaler starts setting it up the moment it is listed active.
            booting = any(n.status == "booting" for i, n in self._nodes.items()
                          if i not in self._terminated)
            interval = self.client.limits.routine_interval if booting else self.list_interval
            if not force and time.monotonic() - self._listed_at < interval:
                return
        # Ray's loop calls this, and must not wait on the pacer (a demand it would see meanwhile
        # waits too: 1.6 s behind an idle capacity read on the bench, issue 50). A listing whose
        # turn is not near is left to a later loop, the last one answering until then.
        if not force and self._listed_at and \
                self.client.routine_wait() > self.client.limits.request_interval / 4:
            return
        listed = self.client.instances()  # outside the lock: pacing may sleep
        with self._lock:
            self._listed_at = time.monotonic()
            nodes = {i.id: i for i in listed if i.tags.get(identity.TAG_CLUSTER) == self.cluster_id}
            for instance_id, inst in list(self._pending.items()):
                if instance_id in nodes:
                    del self._pending[instance_id]
                else:
                    nodes[instance_id] = inst
            self._nodes = nodes

    def _live(self) -> dict[str, api.Instance]:
        return {i: n for i, n in self._nodes.items() if n.status not in _ENDED and i not in self._terminated}

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        self.refresh()
        with self._lock:
            live = self._live()
        self._read_capacity_while_idle(live)
        return [i for i in live if all(self.node_tags(i).get(k) == v for k, v in tag_filters.items())]

    def _get(self, node_id: str) -> api.Instance | None:
        with self._lock:
            inst = self._nodes.get(node_id)
            if inst is not None or node_id in self._terminated:
                return inst
        self.refresh()  # an id we do not know: look again, but not more often than the cache
        with self._lock:
            return self._nodes.get(node_id)

    def is_running(self, node_id: str) -> bool:
        inst = self._get(node_id)
        return inst is not None and inst.status == "active" and node_id not in self._terminated

    def is_terminated(self, node_id: str) -> bool:
        inst = self._get(node_id)
        return inst is None or inst.status in _ENDED or node_id in self._terminated

    def node_tags(self, node_id: str) -> dict[str, str]:
        inst = self._get(node_id)
        tags = {k: v for k, v in (inst.tags if inst else {}).items() if k.startswith("ray-")}
        if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            tags.setdefault(TAG_RAY_NODE_STATUS, STATUS_UP_TO_DATE)  # `up` set the head up
        tags.update(self.store.get(node_id))
        return tags

    def external_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        inst = self._get(node_id)
        return inst.ip if inst else None

    def internal_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        inst = self._get(node_id)
        return inst.private_ip if inst else None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        self.store.update(node_id, {k: str(v) for k, v in tags.items()})

    # --- capacity -------------------------------------------------------------------------------

    def _read_capacity_while_idle(self, live: dict[str, api.Instance]) -> None:
        """Called from Ray's loop: while nothing of ours boots or launches, keep a capacity
        listing younger than one launch interval, read in the background (Ray's loop must not
        wait on the pacer). Half an interval apart: at real rates one request per 6 s, which with
        the idle listings (one per `list_interval_s`) stays within the head's share."""
        with self._lock:
            idle = not self._launching and all(n.status != "booting" for n in live.values())
            due = time.monotonic() - self._types_at >= self.client.limits.launch_interval / 2
            if not (idle and due) or self._types_reading:
                return
            self._types_reading = True
        threading.Thread(target=self._read_capacity_in_background, name="rayfleet-lambda-capacity",
                         daemon=True).start()

    def _read_capacity_in_background(self) -> None:
        try:
            self._read_capacity(prompt=False)
        except api.LambdaError as exc:
            logger.info("rayfleet Lambda provider: idle capacity read failed: %s", exc)
        finally:
            with self._lock:
                self._types_reading = False

    def _read_capacity(self, prompt: bool) -> dict[str, api.InstanceType]:
        """Lambda's instance types now, kept as the latest read (`prompt`: on a launch's way)."""
        at = time.monotonic()
        types = self.client.instance_types(prompt=prompt)
        with self._lock:
            if at > self._types_at:
                self._types, self._types_at = types, at
        return types

    def _capacity(self) -> tuple[dict[str, api.InstanceType], bool]:
        """Lambda's instance types for a launch, and whether they were read just now: the idle
        read if it will still be younger than one launch interval (counted from when it was
        sent) when the launch may go, else a read now at Lambda's own limit. A launch that waits
        out the interval after another one reads again, as it always did: while it waits."""
        limit = self.client.limits.launch_interval - self.client.launch_wait()
        with self._lock:
            if time.monotonic() - self._types_at < limit:
                return self._types, False
        return self._read_capacity(prompt=True), True

    # --- launching ------------------------------------------------------------------------------

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, Any]:
        created: dict[str, Any] = {}
        for _ in range(count):
            inst = self._launch_one(node_config, tags)
            created[inst.id] = inst
        return created

    def _launch_one(self, node_config: dict[str, Any], tags: dict[str, str]) -> api.Instance:
        node_type = str(tags.get("ray-user-node-type") or node_config.get("type_name") or "worker")
        with self._lock:
            until = self._backoff.get(node_type, 0.0)
        if time.monotonic() < until:
            raise NoCapacity(f"{node_type}: no capacity at the last try; next try in "
                             f"{until - time.monotonic():.0f}s")
        with self._lock:
            self._launching += 1
        try:
            return self._launch_a_choice(node_type, node_config, tags)
        finally:
            with self._lock:
                self._launching -= 1

    def _launch_a_choice(self, node_type: str, node_config: dict[str, Any],
                         tags: dict[str, str]) -> api.Instance:
        self._pace_after_other_launches()
        choices = [c for c in node_config.get("choices", []) if c.get("region") == self.region]
        types, read_now = self._capacity()
        tried = []
        for choice in choices:
            info = types.get(choice["instance_type"])
            if (info is None or self.region not in info.regions_with_capacity) and not read_now:
                # A "no" as old as a launch interval may be stale, and nothing would check it.
                types, read_now = self._read_capacity(prompt=True), True
                info = types.get(choice["instance_type"])
            if info is None or self.region not in info.regions_with_capacity:
                tried.append(f"{choice['instance_type']}@{self.region}: no capacity listed")
                continue
            try:
                return self._launch(node_type, choice["instance_type"], info, tags)
            except api.InsufficientCapacity:
                tried.append(f"{choice['instance_type']}@{self.region}: refused "
                             "(insufficient-capacity)")
            except (api.Unavailable, api.LaunchOutcomeUnknown):
                raise  # transient: Ray's next loop may try again at once
            except api.LambdaError as exc:
                # Refused for good (invalid parameters, quota, account, key): the same request
                # would be refused again, so this type waits out the backoff like no capacity.
                tried.append(f"{choice['instance_type']}@{self.region}: refused ({exc.code}): "
                             f"{exc}")
                break
        with self._lock:
            self._backoff[node_type] = time.monotonic() + self.failure_backoff
        message = f"{node_type}: " + ("; ".join(tried) or f"no choice in {self.region}")
        logger.warning("rayfleet Lambda provider: cannot launch %s", message)
        raise NoCapacity(message)

    def _pace_after_other_launches(self) -> None:
        """Keep Lambda's launch interval after the newest launch of this cluster that another
        process made (the head, which `up` launched from the user's machine): its launch tag says
        when. Waiting a whole interval from this process's start instead would delay the first
        worker of a cluster whose head came up minutes ago."""
        if self._paced_after_others:
            return
        self.refresh(force=not self._listed_at)
        with self._lock:
            stamps = [int(n.tags[TAG_LAUNCHED_AT]) for n in self._nodes.values()
                      if n.tags.get(TAG_LAUNCHED_AT, "").isdigit()]
            self._paced_after_others = True
        if stamps:
            # +1 s: the tag has whole seconds. The tag was stamped before that launch was sent:
            # it reached Lambda later by its sending and `transit` (what the pacer allows its own
            # requests); one later still can meet a 429, which is waited out (no second instance).
            limits = self.client.limits
            wait = (max(stamps) + 1 + limits.launch_interval * (1 + limits.margin) + limits.transit
                    - time.time())
            if wait > 0:
                self.client.defer_launches(wait)

    def _launch(self, node_type: str, instance_type: str, info: api.InstanceType,
                ray_tags: dict[str, str]) -> api.Instance:
        token = secrets.token_hex(4)
        # Lambda caps `name` at 64 characters; the `<cluster>-<id>-` prefix (ownership at a
        # glance) and the token stay whole, the type gives way.
        prefix = f"{self.cluster}-{self.cluster_id}-"
        room = max(0, NAME_MAX - len(prefix) - len(token) - 1)
        type_part = re.sub(r"[^a-z0-9-]", "-", node_type.lower())[:room].strip("-") or "w"
        name = f"{prefix}{type_part}-{token}"[:NAME_MAX]
        launch_tags = {identity.TAG_CLUSTER: self.cluster_id, identity.TAG_OWNER: self.owner,
                       identity.TAG_NAME: self.cluster, TAG_NODE: node_type, TAG_LAUNCH: token,
                       TAG_LAUNCHED_AT: str(int(time.time()))}
        mutable = {}
        for key, value in ray_tags.items():
            if key in _MUTABLE or not valid(key, str(value)):
                mutable[key] = str(value)
            else:
                launch_tags[key] = str(value)
        try:
            instance_id = self.client.launch(
                region=self.region, instance_type=instance_type, ssh_key_name=self.ssh_key_name,
                name=name, tags=launch_tags, firewall_rulesets=self.firewall_rulesets)
        except api.LaunchOutcomeUnknown:
            logger.warning("rayfleet Lambda provider: launch of %s: answer lost; looking for it", name)
            found = self.client.find_tagged(TAG_LAUNCH, token)
            if found is None:
                raise
            instance_id = found.id
        # Recorded before returning: a monitor that dies now still leaves the id on the head, and
        # the tags on the instance tell teardown it is ours.
        self.store.update(instance_id, mutable)
        inst = api.Instance(instance_id, name, "booting", None, None, instance_type, self.region,
                            info.price_cents_per_hour, tags=launch_tags,
                            firewall_rulesets=tuple(self.firewall_rulesets))
        with self._lock:
            self._pending[instance_id] = inst
            self._nodes[instance_id] = inst
        logger.info("rayfleet Lambda provider: launched %s (%s, %s)", name, instance_id, instance_type)
        return inst

    # --- terminating ----------------------------------------------------------------------------

    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        return self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> dict[str, Any] | None:
        if not node_ids:
            return None
        with self._lock:
            self._terminated.update(node_ids)
        try:
            self.client.terminate(list(node_ids))
        except api.NotFound:  # one is gone already: the batch is refused as a whole
            for node_id in node_ids:
                with contextlib.suppress(api.NotFound):
                    self.client.terminate([node_id])
        self.store.remove(list(node_ids))
        logger.info("rayfleet Lambda provider: terminated %s", ", ".join(node_ids))
        return None
