"""A faithful local fake of the Lambda Cloud API (the endpoints rayfleet uses), for tests and benches.

Modelled on Lambda's OpenAPI description 1.8.3: the same paths, `{"data": ...}` / `{"error":
{code, message, suggestion}}` bodies, error codes and statuses, Bearer (or Basic) auth, and the
documented rate limits (one request per second, one launch per 12 seconds; 429 beyond them). On
top, what the description cannot show but real accounts do: per-(type, region) capacity that runs
out, instances that boot for a while before they are `active` (no IP while booting), termination
that takes a moment, a quota, other people's instances in the same account, and injectable faults.

Stricter than Lambda where that catches our mistakes: unknown keys in a launch body are rejected
(`global/invalid-parameters`). The 429 body is not documented; the fake sends an error object with
code `global/too-many-requests`, and rayfleet decides on the HTTP status only.

Use it in-process (`with FakeLambda(...) as fake: fake.url`), or as a CLI:
`python -m tests.lambda_cloud --port 8899 --api-key secret_test --scale 1` (see __main__.py).
Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REGIONS = {
    "us-east-1": "Virginia, USA", "us-west-1": "California, USA", "us-west-2": "Arizona, USA",
    "us-south-1": "Texas, USA", "us-midwest-1": "Illinois, USA", "europe-central-1": "Germany",
    "asia-northeast-1": "Tokyo, Japan", "me-west-1": "Israel", "us-east-3": "Washington DC, USA",
}
#: name -> (description, price in cents per hour, vcpus, memory GiB, storage GiB, gpus)
CATALOG: dict[str, tuple[str, int, int, int, int, int]] = {
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", 75, 30, 200, 1400, 1),
    "gpu_1x_a100_sxm4": ("1x A100 (40 GB SXM4)", 129, 30, 200, 512, 1),
    "gpu_8x_a100": ("8x A100 (40 GB SXM4)", 1032, 124, 1800, 6144, 8),
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", 249, 26, 200, 1024, 1),
    "cpu_4x_general": ("4x vCPU (general)", 20, 4, 16, 100, 0),
}
LAUNCH_KEYS = {"region_name", "instance_type_name", "ssh_key_names", "file_system_names",
               "file_system_mounts", "hostname", "name", "image", "user_data", "tags",
               "firewall_rulesets"}
ERRORS = {
    "global/invalid-api-key": (401, "API key was invalid, expired, or deleted.",
                               "Check your API key or create a new one, then try again."),
    "global/object-does-not-exist": (404, "Specified instance does not exist.", None),
    "global/invalid-parameters": (400, "Invalid request data.", None),
    "global/quota-exceeded": (400, "Quota exceeded.", "Contact Support to increase your quota."),
    "instance-operations/launch/insufficient-capacity": (
        400, "Not enough capacity to fulfill launch request.", None),
    "instance-operations/launch/file-system-in-wrong-region": (
        400, "File system is in a different region.", None),
    "global/too-many-requests": (429, "Too many requests.", "Slow down and try again."),
    "global/internal-error": (500, "An internal server error occurred.",
                              "Try again later. Contact Support if the problem persists."),
    "firewall-rulesets/firewall-ruleset-in-use": (
        400, "Firewall ruleset is in use by one or more instances.",
        "Terminate all instances that are using the ruleset before deleting it."),
}
#: RequestedTagEntry: key pattern and lengths (OpenAPI 1.8.3).
TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")
#: InstanceLaunchRequest.hostname.
HOSTNAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")
PROTOCOLS = ("tcp", "udp", "icmp", "all")


class _Reject(Exception):
    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


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


@dataclass
class Fault:
    """Fail matching requests: `status` (429/500/503...) or `drop` (do the work, then close the
    connection without an answer). `times` requests are affected, after `skip` matching ones."""

    method: str
    path: str  # regex matched against the path after /api/v1
    status: int = 0
    drop: bool = False
    times: int = 1
    skip: int = 0
    retry_after: str | None = None


@dataclass
class Bucket:
    """Token bucket: `interval` seconds per token, at most `burst` tokens."""

    interval: float
    burst: float = 1.0
    tokens: float = 1.0
    updated: float = field(default_factory=time.monotonic)
    #: Accept a request this much (fraction of interval) early: clocks differ a little.
    tolerance: float = 0.01

    def take(self, now: float) -> bool:
        if self.interval <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.updated) / self.interval)
        self.updated = now
        if self.tokens >= 1.0 - self.tolerance:
            self.tokens -= 1.0
            return True
        return False


class FakeLambda:
    """The fake's state and HTTP server. Every knob is an attribute tests may change at any time."""

    def __init__(self, api_key: str = "secret_fake_key", *, scale: float = 1.0,
                 boot_delay: float = 2.0, terminate_delay: float = 0.5, forget_delay: float = 5.0,
                 capacity: dict[tuple[str, str], int] | None = None, quota: int = 50,
                 ip_pool: list[str] | None = None, port: int = 0) -> None:
        self.api_key = api_key
        self.lock = threading.RLock()
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
        self.faults: list[Fault] = []
        #: name regex -> status the instance boots into instead of `active` ("unhealthy").
        self.boot_outcomes: dict[str, str] = {}
        #: Called after each served /instance-types (tests use it to take capacity away).
        self.after_instance_types: Callable[[FakeLambda], None] | None = None
        #: Called (in a thread of its own) when an instance that had an address is terminated:
        #: the test bed "powers the machine off" (stops Ray on that host) before the address is
        #: handed out again.
        self.on_terminate: Callable[[FakeInstance], None] | None = None
        self.firewall_rulesets: dict[str, dict[str, Any]] = {}
        #: (monotonic time, method, path, HTTP status) of every request.
        self.log: list[tuple[float, str, str, int]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/v1"

    def start(self) -> FakeLambda:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread (the CLI)."""
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeLambda:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def add_foreign_ruleset(self, name: str, region: str = "us-east-1") -> str:
        """Someone else's firewall ruleset: rayfleet must never change or delete it."""
        with self.lock:
            rid = uuid.uuid4().hex
            self.firewall_rulesets[rid] = {
                "id": rid, "name": name, "region": region, "foreign": True,
                "created": "2025-01-01T00:00:00Z",
                "rules": [{"protocol": "tcp", "port_range": [22, 22], "source_network": "0.0.0.0/0",
                           "description": "colleague's"}]}
            return rid

    def add_file_system(self, name: str, region: str) -> str:
        fs_id = uuid.uuid4().hex
        self.file_systems[fs_id] = {"id": fs_id, "name": name, "region": region}
        return fs_id

    def inject(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

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
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                now = time.monotonic()
                pending = [i.name for i in self.instances.values()
                           if not i.foreign and i.ip and self._status(i, now) == "terminated"
                           and not i.powered_off]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not powered off after {timeout}s: {pending}")
            time.sleep(0.1)

    def requests(self, method: str | None = None, path: str | None = None) -> list[tuple[float, int]]:
        """(time, status) of logged requests matching method and path regex."""
        with self.lock:
            return [(t, s) for t, m, p, s in self.log
                    if (method is None or m == method) and (path is None or re.fullmatch(path, p))]

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
            "file_system_mounts": [], "region": {"name": inst.region,
                                                 "description": REGIONS[inst.region]},
            "instance_type": {"name": inst.type_name, "description": desc, "gpu_description": desc,
                              "price_cents_per_hour": price,
                              "specs": {"vcpus": vcpus, "memory_gib": mem, "storage_gib": disk,
                                        "gpus": gpus}},
            "is_reserved": False, "tags": [dict(t) for t in inst.tags],
            "firewall_rulesets": [{"id": r} for r in inst.firewall_rulesets],
            "actions": {k: {"available": status == "active"}
                        for k in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")},
        }
        if inst.ip and status in ("active", "unhealthy", "terminating"):
            data.update(ip=inst.ip, private_ip=inst.private_ip,
                        hostname=inst.hostname or inst.ip.replace(".", "-"),
                        jupyter_token=inst.id[:32],
                        jupyter_url=f"https://jupyter-{inst.id[:12]}.lambdaspaces.example/")
        return data

    # --- endpoints ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any) -> Any:
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
                raise _Reject("global/object-does-not-exist")
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
                raise _Reject("global/invalid-parameters", "SSH key does not exist.")
            return {}
        if path == "/firewall-rulesets" or path.startswith("/firewall-rulesets/"):
            return self._firewall(method, path, body, now)
        if method == "GET" and path == "/file-systems":
            return [{"id": f["id"], "name": f["name"], "mount_point": f"/lambda/nfs/{f['name']}",
                     "created": "2025-01-01T00:00:00Z", "is_in_use": False, "bytes_used": 0,
                     "created_by": {"id": "u1", "email": "owner@example.com", "status": "active"},
                     "region": {"name": f["region"], "description": REGIONS[f["region"]]}}
                    for f in self.file_systems.values()]
        raise _Reject("global/object-does-not-exist", f"No route {method} {path}.")

    def _launch(self, body: Any, now: float) -> dict[str, Any]:
        if not isinstance(body, dict) or set(body) - LAUNCH_KEYS:
            raise _Reject("global/invalid-parameters", f"Unknown fields {sorted(set(body) - LAUNCH_KEYS)}"
                          if isinstance(body, dict) else "Expected an object.")
        region, type_name = body.get("region_name"), body.get("instance_type_name")
        keys, name = body.get("ssh_key_names"), body.get("name", "")
        if region not in REGIONS or not isinstance(type_name, str):
            raise _Reject("global/invalid-parameters", "Invalid region_name or instance_type_name.")
        if not isinstance(keys, list) or len(keys) != 1:
            raise _Reject("global/invalid-parameters", "Exactly one SSH key name is required.")
        if not isinstance(name, str) or len(name) > 64:
            raise _Reject("global/invalid-parameters", "Invalid name.")
        tags = body.get("tags", [])
        if not isinstance(tags, list) or not all(
                isinstance(t, dict) and set(t) == {"key", "value"} and isinstance(t["key"], str)
                and isinstance(t["value"], str) and TAG_KEY.match(t["key"]) and len(t["key"]) <= 55
                and len(t["value"]) <= 128 for t in tags):
            raise _Reject("global/invalid-parameters", "Invalid tags.")
        hostname = body.get("hostname")
        if hostname is not None and (not isinstance(hostname, str) or not HOSTNAME.match(hostname)):
            raise _Reject("global/invalid-parameters", "Invalid hostname.")
        rulesets = body.get("firewall_rulesets", [])
        if not isinstance(rulesets, list) or not all(
                isinstance(r, dict) and set(r) == {"id"} and isinstance(r["id"], str) for r in rulesets):
            raise _Reject("global/invalid-parameters", "Invalid firewall_rulesets.")
        if type_name not in CATALOG:
            raise _Reject("global/object-does-not-exist", f"Instance type {type_name} not found.")
        for entry in rulesets:
            ruleset = self.firewall_rulesets.get(entry["id"])
            if ruleset is None:
                raise _Reject("global/object-does-not-exist",
                              f"Firewall ruleset {entry['id']} not found.")
            if ruleset["region"] != region:
                raise _Reject("global/invalid-parameters",
                              "The firewall rulesets must exist in the same region as the instance.")
        if keys[0] not in {k["name"] for k in self.ssh_keys.values()}:
            raise _Reject("global/object-does-not-exist", f"SSH key {keys[0]} not found.")
        fs_names = body.get("file_system_names") or []
        for fs_name in fs_names:
            fs = next((f for f in self.file_systems.values() if f["name"] == fs_name), None)
            if fs is None:
                raise _Reject("global/object-does-not-exist", f"File system {fs_name} not found.")
            if fs["region"] != region:
                raise _Reject("instance-operations/launch/file-system-in-wrong-region")
        alive = [i for i in self.instances.values() if self._status(i, now) != "terminated"]
        if len(alive) >= self.quota:
            raise _Reject("global/quota-exceeded")
        if self.capacity.get((type_name, region), 0) <= 0:
            raise _Reject("instance-operations/launch/insufficient-capacity")
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
            raise _Reject("global/invalid-parameters", "instance_ids must be a non-empty list.")
        found = []
        for instance_id in ids:
            inst = self.instances.get(instance_id)
            if inst is None or not self._visible(inst, now):
                raise _Reject("global/object-does-not-exist")
            found.append(inst)
        for inst in found:
            if self._status(inst, now) not in ("terminating", "terminated"):
                inst.forced, inst.forced_at = "terminating", now
        return {"terminated_instances": [self._instance_json(i, now) for i in found]}

    # --- firewall rulesets (OpenAPI 1.8.3: /firewall-rulesets, /firewall-rulesets/{id}) -----------

    def _ruleset_json(self, ruleset: dict[str, Any], now: float) -> dict[str, Any]:
        users = [i.id for i in self.instances.values()
                 if ruleset["id"] in i.firewall_rulesets and self._status(i, now) != "terminated"]
        return {"id": ruleset["id"], "name": ruleset["name"],
                "region": {"name": ruleset["region"], "description": REGIONS[ruleset["region"]]},
                "rules": [dict(r) for r in ruleset["rules"]], "created": ruleset["created"],
                "instance_ids": users}

    @staticmethod
    def _valid_rules(rules: Any) -> bool:
        import ipaddress

        if not isinstance(rules, list):
            return False
        for rule in rules:
            if not isinstance(rule, dict) or set(rule) - {"protocol", "port_range", "source_network",
                                                          "description"}:
                return False
            if rule.get("protocol") not in PROTOCOLS or not isinstance(rule.get("description"), str) \
                    or len(rule["description"]) > 128:
                return False
            try:
                ipaddress.IPv4Network(rule.get("source_network"), strict=False)
            except (ValueError, TypeError):
                return False
            ports = rule.get("port_range")
            if rule["protocol"] == "icmp":
                if ports is not None:
                    return False
            elif not (isinstance(ports, list) and len(ports) == 2
                      and all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
                      and ports[0] <= ports[1]):
                return False
        return True

    def _firewall(self, method: str, path: str, body: Any, now: float) -> Any:
        if path == "/firewall-rulesets" and method == "GET":
            return [self._ruleset_json(r, now) for r in self.firewall_rulesets.values()]
        if path == "/firewall-rulesets" and method == "POST":
            if not isinstance(body, dict) or set(body) - {"name", "region", "rules"}:
                raise _Reject("global/invalid-parameters", "Invalid request data.")
            name, region, rules = body.get("name"), body.get("region"), body.get("rules")
            if not isinstance(name, str) or not 0 < len(name) <= 64 or region not in REGIONS \
                    or not self._valid_rules(rules):
                raise _Reject("global/invalid-parameters", "Invalid name, region or rules.")
            rid = uuid.uuid4().hex
            self.firewall_rulesets[rid] = {"id": rid, "name": name, "region": region,
                                           "rules": rules, "created": "2026-01-01T00:00:00Z"}
            return self._ruleset_json(self.firewall_rulesets[rid], now)
        match = re.fullmatch(r"/firewall-rulesets/([^/]+)", path)
        if match and match.group(1) != "global":
            ruleset = self.firewall_rulesets.get(match.group(1))
            if ruleset is None:
                raise _Reject("global/object-does-not-exist",
                              "Firewall ruleset does not exist or you do not have permission to "
                              "access it.")
            if method == "GET":
                return self._ruleset_json(ruleset, now)
            if method == "PATCH":
                if not isinstance(body, dict) or set(body) - {"name", "rules"} or (
                        "rules" in body and not self._valid_rules(body["rules"])):
                    raise _Reject("global/invalid-parameters", "Invalid request data.")
                ruleset.update(body)
                return self._ruleset_json(ruleset, now)
            if method == "DELETE":
                if self._ruleset_json(ruleset, now)["instance_ids"]:
                    raise _Reject("firewall-rulesets/firewall-ruleset-in-use")
                del self.firewall_rulesets[ruleset["id"]]
                return {}
        raise _Reject("global/object-does-not-exist", f"No route {method} {path}.")

    def _add_key(self, body: Any) -> dict[str, str]:
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise _Reject("global/invalid-parameters", "Invalid SSH key name.")
        if any(k["name"] == name for k in self.ssh_keys.values()):
            raise _Reject("global/invalid-parameters", "SSH key name already in use.")
        key_id = uuid.uuid4().hex
        public = body.get("public_key")
        generated = None
        if public is None:
            generated = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
            public = f"ssh-ed25519 AAAAfake{key_id[:8]} generated"
        if not isinstance(public, str) or not public.startswith(("ssh-", "ecdsa-")):
            raise _Reject("global/invalid-parameters", "Invalid public key.")
        self.ssh_keys[key_id] = {"id": key_id, "name": name, "public_key": public}
        return {**self.ssh_keys[key_id], **({"private_key": generated} if generated else {})}

    # --- HTTP -----------------------------------------------------------------------------------

    def authorized(self, header: str) -> bool:
        if header.startswith("Bearer "):
            return secrets.compare_digest(header[7:], self.api_key)
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:]).decode()
            except ValueError:
                return False
            return secrets.compare_digest(decoded, f"{self.api_key}:")
        return False

    def _fault_for(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and re.fullmatch(fault.path, path):
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                if not path.startswith("/api/v1/"):
                    return self._send(404, {"error": {"code": "global/object-does-not-exist",
                                                      "message": "Not found."}}, method, path)
                path = path[len("/api/v1"):]
                with fake.lock:
                    now = time.monotonic()
                    if not fake.authorized(self.headers.get("Authorization", "")):
                        return self._error("global/invalid-api-key", None, method, path)
                    fault = fake._fault_for(method, path)
                    if fault and fault.status:
                        extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                        code = "global/too-many-requests" if fault.status == 429 \
                            else "global/internal-error"
                        if fault.status in (502, 503):  # a load balancer's page, not JSON
                            return self._send(fault.status, None, method, path, extra,
                                              b"<html>Bad gateway</html>")
                        return self._error(code, None, method, path, fault.status, extra)
                    if not fake.general.take(now):
                        return self._error("global/too-many-requests", None, method, path)
                    is_launch = method == "POST" and path == "/instance-operations/launch"
                    if is_launch and not fake.launches.take(now):
                        fake.general.tokens += 1  # refused requests do not count
                        return self._error("global/too-many-requests", None, method, path)
                    try:
                        body = json.loads(raw) if raw else None
                    except ValueError:
                        return self._error("global/invalid-parameters", "Body is not JSON.",
                                           method, path)
                    try:
                        data = fake.handle(method, path, body)
                    except _Reject as rej:
                        return self._error(rej.code, rej.message, method, path)
                    if fault and fault.drop:
                        fake.log.append((now, method, path, 0))
                        self.close_connection = True
                        self.connection.close()
                        return None
                    return self._send(200, {"data": data}, method, path)

            def _error(self, code: str, message: str | None, method: str, path: str,
                       status: int | None = None, headers: dict[str, str] | None = None) -> None:
                default_status, default_message, suggestion = ERRORS[code]
                error = {"code": code, "message": message or default_message}
                if suggestion:
                    error["suggestion"] = suggestion
                self._send(status or default_status, {"error": error}, method, path, headers)

            def _send(self, status: int, payload: Any, method: str, path: str,
                      headers: dict[str, str] | None = None, raw: bytes | None = None) -> None:
                fake.log.append((time.monotonic(), method, path, status))
                body = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if raw else "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

        return Handler
