"""A small client for the Lambda Cloud public REST API (https://cloud.lambda.ai/api/v1), on `requests`.

What it guarantees, so callers need not think about it:
- Pacing (pacing.py): one request at a time, shared by all threads of every process of this
  machine's user that uses the same key (pace_state.py: one pacer per account), each sent at
  least `Limits.request_interval` (1 s; routine ones at this process's share of the budget,
  `Limits.routine_interval`), a launch at least `Limits.launch_interval` (12 s), after
  the latest moment the previous one (launch) can have reached Lambda: its answer, or
  `Limits.transit` after its last byte was written, whichever comes first. `LAMBDA_RATE_SCALE`
  scales the intervals (tests and the fake run at 0.01); the defaults are Lambda's documented
  limits.
- Retries with backoff on 429, 409 (Lambda's documented conflict on rulesets), 5xx and network
  errors, by urllib3's `Retry` on the session (Retry-After honoured, never faster than the
  request interval), except for launches: a launch is not idempotent, so an unknown outcome
  raises `LaunchOutcomeUnknown` and the caller reconciles (only a 429 launch is sent again).
- Typed errors chosen by the `error.code` field (never by message text), see `ERRORS`.
- The API key lives in one private attribute and the session's header. It is never in a message,
  a repr or an exception (and `_redact` scrubs it from anything the server echoes back).
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra.node.errors import UsageError
from infra.node.lambda_cloud.errors import ERRORS as ERRORS
from infra.node.lambda_cloud.errors import AccountInactive as AccountInactive
from infra.node.lambda_cloud.errors import Duplicate as Duplicate
from infra.node.lambda_cloud.errors import FileSystemInWrongRegion as FileSystemInWrongRegion
from infra.node.lambda_cloud.errors import InsufficientCapacity as InsufficientCapacity
from infra.node.lambda_cloud.errors import InvalidApiKey as InvalidApiKey
from infra.node.lambda_cloud.errors import InvalidParameters as InvalidParameters
from infra.node.lambda_cloud.errors import LambdaError as LambdaError
from infra.node.lambda_cloud.errors import LaunchOutcomeUnknown as LaunchOutcomeUnknown
from infra.node.lambda_cloud.errors import MissingApiKey as MissingApiKey
from infra.node.lambda_cloud.errors import NotFound as NotFound
from infra.node.lambda_cloud.errors import QuotaExceeded as QuotaExceeded
from infra.node.lambda_cloud.errors import RulesetInUse as RulesetInUse
from infra.node.lambda_cloud.errors import Unavailable as Unavailable
from infra.node.lambda_cloud.pace_state import account_store
from infra.node.lambda_cloud.pacing import (
    RETRY_STATUSES,
    Limits,
    PacedRetry,
    Pacer,
    paced_adapter,
    sending,
)
from infra.node.net import is_loopback
from infra.node.wait import WaitTimeout, until

DEFAULT_URL = "https://cloud.lambda.ai/api/v1"
#: The user's Lambda key file (as Lambda's own CLI keeps it), relative to their home.
LAMBDA_KEYS_FILE = Path(".lambda_cloud") / "lambda_keys"
#: How many of its latest requests a client remembers (`LambdaClient.sent`, `.written`).
HISTORY = 10_000
#: Statuses after which an instance never comes back.
GONE = frozenset({"terminated", "preempted"})
#: Statuses that end a wait for `active` with a failure.
FAILED = frozenset({"unhealthy", "terminating", *GONE})


@dataclass(frozen=True)
class InstanceType:
    name: str
    description: str
    price_cents_per_hour: int
    #: vcpus, memory_gib, storage_gib, gpus.
    specs: dict[str, int]
    #: Regions that report capacity right now (a launch there can still be refused).
    regions_with_capacity: tuple[str, ...]


@dataclass(frozen=True)
class Instance:
    id: str
    name: str
    status: str
    #: Public IPv4; missing while booting.
    ip: str | None
    private_ip: str | None
    type_name: str
    region: str
    price_cents_per_hour: int
    #: The launch `tags` (key -> value); they cannot change after the launch.
    tags: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    #: Ids of the firewall rulesets attached to it.
    firewall_rulesets: tuple[str, ...] = ()


@dataclass(frozen=True)
class FirewallRuleset:
    id: str
    name: str
    region: str
    #: [{protocol, port_range, source_network, description}] as the API has them.
    rules: tuple[dict[str, Any], ...]
    instance_ids: tuple[str, ...]


@dataclass(frozen=True)
class SshKey:
    id: str
    name: str
    public_key: str


@dataclass(frozen=True)
class FileSystem:
    id: str
    name: str
    region: str
    mount_point: str


#: Where the API key is read from, in this order: ours, then the variable of the proof of concept
#: rayfleet started from (its users have it set), then lambda-cli's file (`LAMBDA_KEYS_FILE`).
KEY_VARIABLES = ("LAMBDA_API_KEY", "LAMBDALABS_API_KEY")


def api_key_source() -> tuple[str, str] | None:
    """(the key, where it came from: a variable's name or ~/LAMBDA_KEYS_FILE), or None."""
    for variable in KEY_VARIABLES:
        key = os.environ.get(variable, "").strip()
        if key:
            return key, variable
    path = Path.home() / LAMBDA_KEYS_FILE
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = re.fullmatch(r"\s*api_key\s*=\s*(\S+)\s*", line)
        if match:
            return match.group(1).strip("'\""), f"~/{LAMBDA_KEYS_FILE}"
    return None


def read_api_key() -> str | None:
    """LAMBDA_API_KEY, else LAMBDALABS_API_KEY, else `api_key = ...` in ~/.lambda_cloud/lambda_keys
    (lambda-cli's file)."""
    found = api_key_source()
    return found[0] if found else None


def base_url(url: str | None = None) -> str:
    """`url`, else LAMBDA_API_URL, else Lambda's; plain http only to loopback (the key travels)."""
    url = (url or os.environ.get("LAMBDA_API_URL", "")).strip() or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"LAMBDA_API_URL={url!r}: expected https://host/api/v1")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise UsageError(f"LAMBDA_API_URL={url!r}: plain http would send the API key unencrypted; "
                         "use https (http is allowed for 127.0.0.1/localhost only)")
    return url.rstrip("/")


class LambdaClient:
    """The API calls rayfleet uses, each returning typed values, never raw JSON."""

    def __init__(self, api_key: str, url: str = DEFAULT_URL, limits: Limits | None = None,
                 timeout: tuple[float, float] = (5.0, 30.0), retries: int = 12) -> None:
        import requests

        self._key = api_key
        self.url = url.rstrip("/")
        self.limits = limits or Limits()
        self.timeout = timeout
        self.retries = retries
        #: Account-wide on this machine: every client of this key and endpoint, in any of this
        #: user's processes, paces with this one (pace_state.py, issue 48).
        self._pacer = Pacer(self.limits, account_store(self.url, api_key))
        headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json",
                   "User-Agent": "rayfleet"}
        #: Every call but launch: urllib3 retries 409/429/5xx and network errors.
        self._session = requests.Session()
        #: Launch: not idempotent, so only what certainly created nothing is sent again (a 429,
        #: a connection never made); a lost answer or 5xx is the caller's to reconcile.
        self._launch_session = requests.Session()
        for session in (self._session, self._launch_session):
            adapter = paced_adapter(self._retry(launch=session is self._launch_session))
            session.headers.update(headers)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        #: Requests sent, by "METHOD path", for benches and tests (a retry counts once); the
        #: latest only, as a head's provider lists instances for as long as the cluster lives.
        self.sent: deque[str] = deque(maxlen=HISTORY)
        #: ("METHOD path", monotonic time its last byte was written) of each attempt, for benches
        #: and tests that compare it with when the server counted it (bench/lambda_transit.py).
        self.written: deque[tuple[str, float]] = deque(maxlen=HISTORY)

    def __repr__(self) -> str:
        return f"LambdaClient(url={self.url!r})"

    def _retry(self, launch: bool) -> PacedRetry:
        retry = PacedRetry(
            total=self.retries, backoff_factor=self.limits.request_interval,
            backoff_max=self.limits.backoff_cap, backoff_jitter=self.limits.request_interval,
            status_forcelist={429} if launch else RETRY_STATUSES, allowed_methods=None,
            read=0 if launch else None, other=0 if launch else None, raise_on_status=False,
            respect_retry_after_header=False)  # PacedRetry.sleep reads it, capped
        retry.pacer, retry.launch = self._pacer, launch
        return retry

    def defer_launches(self, seconds: float) -> None:
        """No launch from this client before `seconds` from now (another process just launched)."""
        self._pacer.defer_launches(seconds)

    def launch_wait(self) -> float:
        """Seconds until this client's next launch may go by Lambda's launch interval."""
        return self._pacer.launch_wait()

    def routine_wait(self) -> float:
        """Seconds until a routine request (a listing) could go; inf while a request is out."""
        return self._pacer.routine_wait()

    @classmethod
    def from_env(cls, share: float = 1.0) -> LambdaClient:
        key = read_api_key()
        if not key:
            raise MissingApiKey(
                "no Lambda API key: set LAMBDA_API_KEY or put `api_key = <key>` in "
                f"~/{LAMBDA_KEYS_FILE} (create a key at https://cloud.lambda.ai/api-keys)")
        return cls(key, base_url(), Limits.from_env(share))

    # --- transport ------------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "<api key>") if self._key else text

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                launch: bool = False, prompt: bool = False) -> Any:
        """Send one API request and return its `data`, or raise a typed LambdaError. The session's
        urllib3 `Retry` does the retries; a launch's session resends only what was never created
        (429, or a connection never made). `prompt`: on a launch's way (Pacer.wait)."""
        import requests

        what = f"{method} {path}"
        started = time.monotonic()
        session = self._launch_session if launch else self._session

        def written() -> None:
            self.written.append((what, time.monotonic()))
            self._pacer.written()

        self._pacer.wait(launch, prompt)
        self.sent.append(what)
        try:
            with sending(written):
                response = session.request(method, f"{self.url}{path}", json=body,
                                           timeout=self.timeout)
        except requests.RequestException as exc:
            if launch:
                raise LaunchOutcomeUnknown(
                    f"Lambda API: {what}: no answer ({type(exc).__name__})") from None
            raise Unavailable(f"Lambda API: {what}: no answer after {self.retries} retries in "
                              f"{time.monotonic() - started:.0f}s ({type(exc).__name__}); try "
                              "again later", status=0) from None
        finally:
            self._pacer.done()
        if launch and response.status_code >= 500:
            raise LaunchOutcomeUnknown(
                f"Lambda API: {what}: HTTP {response.status_code}, the instance may exist")
        if response.status_code in RETRY_STATUSES:
            raise Unavailable(f"Lambda API: {what}: still failing after {self.retries} retries in "
                              f"{time.monotonic() - started:.0f}s (HTTP {response.status_code}); "
                              "try again later", status=response.status_code)
        return self._decode(what, response)

    def _decode(self, what: str, response: Any) -> Any:
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if response.ok and isinstance(payload, dict) and "data" in payload:
            return payload["data"]
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict):
            raise LambdaError(f"Lambda API: {what}: HTTP {response.status_code} without an error "
                              "body", status=response.status_code)
        code = str(error.get("code", ""))
        message = " ".join(str(error.get("message", "")).split())[:200]
        suggestion = " ".join(str(error.get("suggestion") or "").split())[:200]
        text = self._redact(f"Lambda API: {what}: {code}: {message}"
                            + (f" ({suggestion})" if suggestion else ""))
        raise ERRORS.get(code, LambdaError)(text, code=code, status=response.status_code)

    # --- endpoints ------------------------------------------------------------------------------

    def instance_types(self, prompt: bool = False) -> dict[str, InstanceType]:
        """Types and the regions with capacity now. `prompt`: read right before a launch, so
        spaced by Lambda's limit rather than this process's share (pacing.Limits.share)."""
        data = self.request("GET", "/instance-types", prompt=prompt)
        types = {}
        for name, item in data.items():
            spec = item["instance_type"]
            types[name] = InstanceType(
                name=name,
                description=str(spec.get("description") or spec.get("gpu_description") or name),
                price_cents_per_hour=int(spec["price_cents_per_hour"]),
                specs={k: int(v) for k, v in spec.get("specs", {}).items()},
                regions_with_capacity=tuple(r["name"] for r in item["regions_with_capacity_available"]),
            )
        return types

    def instances(self) -> list[Instance]:
        return [_instance(i) for i in self.request("GET", "/instances")]

    def find_tagged(self, key: str, value: str, window: float | None = None) -> Instance | None:
        """Poll the instance list until an instance tagged `key=value` shows up, or `window`
        (default: the generous `lost_launch_window`) passes. Used after a launch whose answer was
        lost: a launch that happened is never launched a second time."""
        def tagged() -> Instance | None:
            return next((i for i in self.instances() if i.tags.get(key) == value), None)

        try:
            return until(tagged, self.limits.lost_launch_window if window is None else window,
                         self.limits.routine_interval, f"an instance tagged {key}={value}")
        except WaitTimeout:
            return None

    def instance(self, instance_id: str) -> Instance:
        return _instance(self.request("GET", f"/instances/{instance_id}"))

    def launch(self, *, region: str, instance_type: str, ssh_key_name: str, name: str,
               file_system_names: list[str] | None = None, tags: dict[str, str] | None = None,
               firewall_rulesets: list[str] | None = None) -> str:
        """Launch exactly one instance; return its id. Never retried (see LaunchOutcomeUnknown)."""
        body: dict[str, Any] = {"region_name": region, "instance_type_name": instance_type,
                                "ssh_key_names": [ssh_key_name], "name": name}
        if file_system_names:
            body["file_system_names"] = file_system_names
        if tags:
            body["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        if firewall_rulesets:
            body["firewall_rulesets"] = [{"id": r} for r in firewall_rulesets]
        data = self.request("POST", "/instance-operations/launch", body, launch=True)
        ids = data.get("instance_ids") or []
        if len(ids) != 1:
            raise LambdaError(f"Lambda API: launch of {name} returned {len(ids)} ids, expected 1")
        return str(ids[0])

    def terminate(self, instance_ids: list[str]) -> list[Instance]:
        data = self.request("POST", "/instance-operations/terminate", {"instance_ids": instance_ids})
        return [_instance(i) for i in data.get("terminated_instances", [])]

    def ssh_keys(self) -> list[SshKey]:
        return [SshKey(str(k["id"]), str(k["name"]), str(k["public_key"]))
                for k in self.request("GET", "/ssh-keys")]

    def add_ssh_key(self, name: str, public_key: str) -> SshKey:
        """Register a public key. Always pass `public_key`: without it Lambda generates a key
        pair and sends the private key back, which we never want in transit."""
        data = self.request("POST", "/ssh-keys", {"name": name, "public_key": public_key})
        return SshKey(str(data["id"]), str(data["name"]), str(data["public_key"]))

    def delete_ssh_key(self, key_id: str) -> None:
        self.request("DELETE", f"/ssh-keys/{key_id}")

    def firewall_rulesets(self) -> list[FirewallRuleset]:
        return [_ruleset(r) for r in self.request("GET", "/firewall-rulesets")]

    def create_firewall_ruleset(self, name: str, region: str,
                                rules: list[dict[str, Any]]) -> FirewallRuleset:
        data = self.request("POST", "/firewall-rulesets",
                            {"name": name, "region": region, "rules": rules})
        return _ruleset(data)

    def firewall_ruleset(self, ruleset_id: str) -> FirewallRuleset:
        return _ruleset(self.request("GET", f"/firewall-rulesets/{ruleset_id}"))

    def update_firewall_ruleset(self, ruleset_id: str, rules: list[dict[str, Any]]) -> FirewallRuleset:
        """Replace the ruleset's rules (PATCH; its name stays)."""
        return _ruleset(self.request("PATCH", f"/firewall-rulesets/{ruleset_id}", {"rules": rules}))

    def delete_firewall_ruleset(self, ruleset_id: str) -> None:
        self.request("DELETE", f"/firewall-rulesets/{ruleset_id}")

    def file_systems(self) -> list[FileSystem]:
        return [FileSystem(str(f["id"]), str(f["name"]), str(f["region"]["name"]),
                           str(f.get("mount_point", "")))
                for f in self.request("GET", "/file-systems")]


def _instance(data: dict[str, Any]) -> Instance:
    itype = data.get("instance_type") or {}
    return Instance(
        id=str(data["id"]),
        name=str(data.get("name") or ""),
        status=str(data["status"]),
        ip=data.get("ip") or None,
        private_ip=data.get("private_ip") or None,
        type_name=str(itype.get("name", "")),
        region=str((data.get("region") or {}).get("name", "")),
        price_cents_per_hour=int(itype.get("price_cents_per_hour", 0)),
        tags={str(t["key"]): str(t["value"]) for t in data.get("tags") or []},
        firewall_rulesets=tuple(str(r["id"]) for r in data.get("firewall_rulesets") or []),
    )


def _ruleset(data: dict[str, Any]) -> FirewallRuleset:
    return FirewallRuleset(
        id=str(data["id"]), name=str(data["name"]),
        region=str((data.get("region") or {}).get("name", "")),
        rules=tuple(dict(r) for r in data.get("rules") or []),
        instance_ids=tuple(str(i) for i in data.get("instance_ids") or []),
    )
