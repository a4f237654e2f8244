"""A faithful local fake of the Lambda Cloud API (the endpoints rayfleet uses), for tests and benches.

Modelled on Lambda's OpenAPI description 1.8.3: the same paths, `{"data": ...}` / `{"error":
{code, message, suggestion}}` bodies, error codes and statuses, Bearer (or Basic) auth, and the
documented rate limits (one request per second, one launch per 12 seconds; 429 beyond them). On
top, what the description cannot show but real accounts do: per-(type, region) capacity that runs
out, instances that boot for a while before they are `active` (no IP while booting), termination
that takes a moment, a quota, other people's instances in the same account, and injectable faults.

Held to the reference both ways (tests/fakes/http.py, tests/fakes/openapi.py): every request is
checked against Lambda's OpenAPI file before the model sees it (unknown fields included: the fake
treats the reference's open objects as closed), every answer before it is sent. A request the
reference rejects is answered 400 `global/invalid-parameters`, and the test that sent it fails. The
429 body is not documented; the fake sends a 429 without JSON, and rayfleet decides on the status.

Use it in-process (`with FakeLambda(...) as fake: fake.url`), or as a CLI:
`python -m tests.lambda_cloud --port 8899 --api-key secret_test --scale 1` (see __main__.py).
Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.fakes.http import Fault
from tests.lambda_cloud.fake_firewall import FirewallRulesets
from tests.lambda_cloud.fake_http import REGIONS, Bucket, LambdaHttp, Reject, reference
from tests.waiting import wait_while

__all__ = ["CATALOG", "REGIONS", "FakeInstance", "FakeLambda", "Fault"]

#: name -> (description, price in cents per hour, vcpus, memory GiB, storage GiB, gpus)
CATALOG: dict[str, tuple[str, int, int, int, int, int]] = {
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", 75, 30, 200, 1400, 1),
    "gpu_1x_a100_sxm4": ("1x A100 (40 GB SXM4)", 129, 30, 200, 512, 1),
    "gpu_8x_a100": ("8x A100 (40 GB SXM4)", 1032, 124, 1800, 6144, 8),
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", 249, 26, 200, 1024, 1),
    "cpu_4x_general": ("4x vCPU (general)", 20, 4, 16, 100, 0),
}


@dataclass
class FakeInstance:
    id: str
    name: str
    type_name: str
    region: str
    ssh_key_names: list[str]
    file_system_names: list[str]
    launched: float
    #: Set when the fake hands out an address (at `active`).
    ip: str | None = None
    private_ip: str | None = None
    #: Forced status (unhealthy, terminating, terminated) and when it was set.
    forced: str | None = None
    forced_at: float = 0.0
    #: The final status this instance reaches after booting ("active" or "unhealthy").
    boots_to: str = "active"
    #: True for instances the fake pre-creates as "someone else's".
    foreign: bool = False
    #: Launch tags in request order, as [{key, value}].
    tags: list[dict[str, str]] = field(default_factory=list)
    #: Ids of the firewall rulesets attached at launch.
    firewall_rulesets: list[str] = field(default_factory=list)
    hostname: str | None = None
    #: Set once the terminate hook ran (the "machine" is off).
    powered_off: bool = False


class FakeLambda(FirewallRulesets, LambdaHttp):
    """The fake's state and HTTP server. Every knob is an attribute tests may change at any time."""

    def __init__(self, api_key: str = "secret_fake_key", *, scale: float = 1.0,
                 boot_delay: float = 2.0, terminate_delay: float = 0.5, forget_delay: float = 5.0,
                 capacity: dict[tuple[str, str], int] | None = None, quota: int = 50,
                 ip_pool: list[str] | None = None, port: int = 0) -> None:
        super().__init__(reference(), port)
        self.api_key = api_key
        self.scale = scale
        self.general = Bucket(1.0 * scale)
        self.launches = Bucket(12.0 * scale)
        self.boot_delay = boot_delay
        self.terminate_delay = terminate_delay
        self.forget_delay = forget_delay
        #: Instances that can still be launched, per (type, region); absent means none.
        self.capacity: dict[tuple[str, str], int] = dict(capacity or {})
        self.quota = quota
        #: Addresses handed to instances as they turn active (test-bed hosts); else TEST-NET-2.
        #: With a pool, the fake never hands out anything else: an instance waits in `booting`
        #: until a pool address is free (a terminated instance gives its address back).
        self.ip_pool = list(ip_pool or [])
        self.pool_only = ip_pool is not None
        self._next_ip = 2
        self.instances: dict[str, FakeInstance] = {}
        self.ssh_keys: dict[str, dict[str, str]] = {}
        self.file_systems: dict[str, dict[str, Any]] = {}
        #: name regex -> status the instance boots into instead of `active` ("unhealthy").
        self.boot_outcomes: dict[str, str] = {}
        #: Called after each served /instance-types (tests use it to take capacity away).
        self.after_instance_types: Callable[[FakeLambda], None] | None = None
        #: Called (in a thread of its own) when an instance that had an address is terminated:
        #: the test bed "powers the machine off" (stops Ray on that host) before the address is
        #: handed out again.
        self.on_terminate: Callable[[FakeInstance], None] | None = None
        self.firewall_rulesets: dict[str, dict[str, Any]] = {}
        #: The clients' account-wide pacing state (LAMBDA_PACING_DIR): this fake's account, not
        #: the machine's ~/.rayfleet (which a head's key scan must find untouched by the tests).
        self.pacing_dir = tempfile.TemporaryDirectory(prefix="rayfleet-fake-lambda-pacing-")

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{self.origin}{self.prefix}"

    def __enter__(self) -> FakeLambda:
        self.start()
        return self

    def client_env(self) -> dict[str, str]:
        """The environment that points rayfleet's Lambda client at this fake: its URL, key,
        rate-limit scale and pacing state."""
        return {"LAMBDA_API_URL": self.url, "LAMBDA_API_KEY": self.api_key,
                "LAMBDA_RATE_SCALE": str(self.scale), "LAMBDA_PACING_DIR": self.pacing_dir.name}

    @contextlib.contextmanager
    def serving(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLambda]:
        """This fake running, and this process's Lambda client pointed at it, while the block
        runs."""
        with self:
            for name, value in self.client_env().items():
                monkeypatch.setenv(name, value)
            yield self

    # --- setup helpers --------------------------------------------------------------------------

    def add_foreign_instance(self, name: str, type_name: str = "gpu_1x_a10",
                             region: str = "us-east-1") -> str:
        """An instance of someone else in the same account: rayfleet must never touch it."""
        with self.lock:
            inst = FakeInstance(uuid.uuid4().hex, name, type_name, region, ["someone-else"], [],
                                time.monotonic() - 3600, foreign=True)
            self._next_ip += 1  # never from ip_pool: those are for our instances
            inst.ip = f"198.51.100.{self._next_ip % 250 + 2}"
            self.instances[inst.id] = inst
            return inst.id

    def add_file_system(self, name: str, region: str) -> str:
        fs_id = uuid.uuid4().hex
        self.file_systems[fs_id] = {"id": fs_id, "name": name, "region": region}
        return fs_id

    def status_of(self, instance_id: str) -> str | None:
        with self.lock:
            inst = self.instances.get(instance_id)
            return self._status(inst, time.monotonic()) if inst else None

    def inventory(self) -> list[dict[str, Any]]:
        """Every instance the account has (including terminated ones not yet forgotten)."""
        with self.lock:
            now = time.monotonic()
            return [{"id": i.id, "name": i.name, "status": self._status(i, now), "foreign": i.foreign,
                     "region": i.region, "type": i.type_name, "ip": i.ip,
                     "tags": {t["key"]: t["value"] for t in i.tags},
                     "firewall_rulesets": list(i.firewall_rulesets)}
                    for i in self.instances.values()]

    def running(self, prefix: str = "") -> list[dict[str, Any]]:
        """Instances that cost money (not terminated), optionally only names with `prefix`."""
        return [i for i in self.inventory()
                if i["status"] not in ("terminated",) and i["name"].startswith(prefix)]

    def wait_powered_off(self, timeout: float = 120) -> None:
        """Until every terminated instance of ours that had an address ran `on_terminate`."""

        def pending() -> list[str]:
            with self.lock:
                now = time.monotonic()
                return [i.name for i in self.instances.values()
                        if not i.foreign and i.ip and self._status(i, now) == "terminated"
                        and not i.powered_off]

        wait_while(pending, "every terminated instance to be powered off", timeout=timeout,
                   interval=0.1)

    # --- model ----------------------------------------------------------------------------------

    def _take_ip(self) -> str | None:
        if self.ip_pool:
            return self.ip_pool.pop(0)
        if self.pool_only:
            return None
        self._next_ip += 1
        return f"198.51.100.{self._next_ip % 250 + 2}"

    def _status(self, inst: FakeInstance, now: float) -> str:
        if inst.forced in ("terminating",) and now - inst.forced_at >= self.terminate_delay:
            inst.forced, inst.forced_at = "terminated", inst.forced_at + self.terminate_delay
            self.capacity[(inst.type_name, inst.region)] = \
                self.capacity.get((inst.type_name, inst.region), 0) + 1
            if inst.ip and not inst.foreign:
                threading.Thread(target=self._power_off, args=(inst,), daemon=True).start()
        if inst.forced:
            return inst.forced
        if now - inst.launched < self.boot_delay:
            return "booting"
        if inst.boots_to != "active":
            return inst.boots_to
        if inst.ip is None:
            ip = self._take_ip()
            if ip is None:
                return "booting"  # no test-bed host free: it boots until one is
            inst.ip = ip
            # Test-bed hosts have one address, reachable from the other hosts: that is the
            # instance's private address too. Otherwise a private 10.19.x.y that nothing uses.
            inst.private_ip = ip if self.pool_only else \
                f"10.19.{len(self.instances) % 250}.{int(inst.id[:2], 16) % 250 + 2}"
        return "active"

    def _power_off(self, inst: FakeInstance) -> None:
        if self.on_terminate is not None:
            try:
                self.on_terminate(inst)
            except Exception as exc:  # a hook failure must not kill the fake; tests see the log
                print(f"fake Lambda: on_terminate({inst.name}) failed: {exc}")
        with self.lock:
            inst.powered_off = True
            if self.pool_only and inst.ip:
                self.ip_pool.append(inst.ip)  # the test-bed host is free again

    def _visible(self, inst: FakeInstance, now: float) -> bool:
        status = self._status(inst, now)
        return not (status == "terminated" and now - inst.forced_at >= self.forget_delay)

    def _instance_json(self, inst: FakeInstance, now: float) -> dict[str, Any]:
        status = self._status(inst, now)
        desc, price, vcpus, mem, disk, gpus = CATALOG[inst.type_name]
        data: dict[str, Any] = {
            "id": inst.id, "name": inst.name, "status": status,
            "ssh_key_names": inst.ssh_key_names, "file_system_names": inst.file_system_names,
            "region": {"name": inst.region,
                                                 "description": REGIONS[inst.region]},
            "instance_type": {"name": inst.type_name, "description": desc, "gpu_description": desc,
                              "price_cents_per_hour": price,
                              "specs": {"vcpus": vcpus, "memory_gib": mem, "storage_gib": disk,
                                        "gpus": gpus}},
            "tags": [dict(t) for t in inst.tags],
            "firewall_rulesets": [{"id": r} for r in inst.firewall_rulesets],
            "actions": {k: {"available": status == "active"}
                        for k in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")},
        }
        if inst.ip and status in ("active", "unhealthy", "terminating"):
            if inst.private_ip:
                data["private_ip"] = inst.private_ip
            data.update(ip=inst.ip,
                        hostname=inst.hostname or inst.ip.replace(".", "-"),
                        jupyter_token=inst.id[:32],
                        jupyter_url=f"https://jupyter-{inst.id[:12]}.lambdaspaces.example/")
        return data

    # --- endpoints ------------------------------------------------------------------------------

    def model(self, method: str, path: str, body: Any) -> Any:
        now = time.monotonic()
        if method == "GET" and path == "/instance-types":
            data = {}
            for name, (desc, price, vcpus, mem, disk, gpus) in CATALOG.items():
                regions = [{"name": r, "description": REGIONS[r]} for (t, r), n
                           in sorted(self.capacity.items()) if t == name and n > 0]
                data[name] = {"instance_type": {
                    "name": name, "description": desc, "gpu_description": desc,
                    "price_cents_per_hour": price,
                    "specs": {"vcpus": vcpus, "memory_gib": mem, "storage_gib": disk, "gpus": gpus}},
                    "regions_with_capacity_available": regions}
            if self.after_instance_types:
                self.after_instance_types(self)
            return data
        if method == "GET" and path == "/instances":
            return [self._instance_json(i, now) for i in self.instances.values()
                    if self._visible(i, now)]
        match = re.fullmatch(r"/instances/([^/]+)", path)
        if method == "GET" and match:
            inst = self.instances.get(match.group(1))
            if inst is None or not self._visible(inst, now):
                raise Reject("global/object-does-not-exist")
            return self._instance_json(inst, now)
        if method == "POST" and path == "/instance-operations/launch":
            return self._launch(body, now)
        if method == "POST" and path == "/instance-operations/terminate":
            return self._terminate(body, now)
        if method == "GET" and path == "/ssh-keys":
            return list(self.ssh_keys.values())
        if method == "POST" and path == "/ssh-keys":
            return self._add_key(body)
        match = re.fullmatch(r"/ssh-keys/([^/]+)", path)
        if method == "DELETE" and match:
            if self.ssh_keys.pop(match.group(1), None) is None:
                raise Reject("global/invalid-parameters", "SSH key does not exist.")
            return {}
        if path == "/firewall-rulesets" or path.startswith("/firewall-rulesets/"):
            return self._firewall(method, path, body, now)
        if method == "GET" and path == "/file-systems":
            return [{"id": f["id"], "name": f["name"], "mount_point": f"/lambda/nfs/{f['name']}",
                     "created": "2025-01-01T00:00:00Z", "is_in_use": False, "bytes_used": 0,
                     "created_by": {"id": "u1", "email": "owner@example.com", "status": "active"},
                     "region": {"name": f["region"], "description": REGIONS[f["region"]]}}
                    for f in self.file_systems.values()]
        raise Reject("global/object-does-not-exist", f"No route {method} {path}.")

    def _launch(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        # The reference has checked types, patterns and lengths; what it cannot say is checked here.
        region, type_name = body["region_name"], body["instance_type_name"]
        keys, name = body["ssh_key_names"], body.get("name", "")
        if len(keys) != 1:  # "Currently, exactly one SSH key must be specified."
            raise Reject("global/invalid-parameters", "Exactly one SSH key name is required.")
        tags, hostname = body.get("tags", []), body.get("hostname")
        rulesets = body.get("firewall_rulesets", [])
        if type_name not in CATALOG:
            raise Reject("global/object-does-not-exist", f"Instance type {type_name} not found.")
        for entry in rulesets:
            ruleset = self.firewall_rulesets.get(entry["id"])
            if ruleset is None:
                raise Reject("global/object-does-not-exist",
                              f"Firewall ruleset {entry['id']} not found.")
            if ruleset["region"] != region:
                raise Reject("global/invalid-parameters",
                              "The firewall rulesets must exist in the same region as the instance.")
        if keys[0] not in {k["name"] for k in self.ssh_keys.values()}:
            raise Reject("global/object-does-not-exist", f"SSH key {keys[0]} not found.")
        fs_names = body.get("file_system_names") or []
        for fs_name in fs_names:
            fs = next((f for f in self.file_systems.values() if f["name"] == fs_name), None)
            if fs is None:
                raise Reject("global/object-does-not-exist", f"File system {fs_name} not found.")
            if fs["region"] != region:
                raise Reject("instance-operations/launch/file-system-in-wrong-region")
        alive = [i for i in self.instances.values() if self._status(i, now) != "terminated"]
        if len(alive) >= self.quota:
            raise Reject("global/quota-exceeded")
        if self.capacity.get((type_name, region), 0) <= 0:
            raise Reject("instance-operations/launch/insufficient-capacity")
        self.capacity[(type_name, region)] -= 1
        inst = FakeInstance(uuid.uuid4().hex, name, type_name, region, list(keys), list(fs_names), now,
                            tags=[dict(t) for t in tags], hostname=hostname,
                            firewall_rulesets=[r["id"] for r in rulesets])
        for pattern, outcome in self.boot_outcomes.items():
            if re.fullmatch(pattern, name):
                inst.boots_to = outcome
        self.instances[inst.id] = inst
        return {"instance_ids": [inst.id]}

    def _terminate(self, body: Any, now: float) -> dict[str, Any]:
        ids = body.get("instance_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids:
            raise Reject("global/invalid-parameters", "instance_ids must be a non-empty list.")
        found = []
        for instance_id in ids:
            inst = self.instances.get(instance_id)
            if inst is None or not self._visible(inst, now):
                raise Reject("global/object-does-not-exist")
            found.append(inst)
        for inst in found:
            if self._status(inst, now) not in ("terminating", "terminated"):
                inst.forced, inst.forced_at = "terminating", now
        return {"terminated_instances": [self._instance_json(i, now) for i in found]}

    def _add_key(self, body: Any) -> dict[str, str]:
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise Reject("global/invalid-parameters", "Invalid SSH key name.")
        if any(k["name"] == name for k in self.ssh_keys.values()):
            raise Reject("global/invalid-parameters", "SSH key name already in use.")
        key_id = uuid.uuid4().hex
        public = body.get("public_key")
        generated = None
        if public is None:
            generated = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
            public = f"ssh-ed25519 AAAAfake{key_id[:8]} generated"
        if not isinstance(public, str) or not public.startswith(("ssh-", "ecdsa-")):
            raise Reject("global/invalid-parameters", "Invalid public key.")
        self.ssh_keys[key_id] = {"id": key_id, "name": name, "public_key": public}
        return {**self.ssh_keys[key_id], **({"private_key": generated} if generated else {})}

