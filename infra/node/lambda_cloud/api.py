"""A small client for the Lambda Cloud public REST API (https://cloud.lambda.ai/api/v1), on `requests`.

What it guarantees, so callers need not think about it:
- Pacing: one request in flight at a time, shared by all threads of the process, sent at least
  `Limits.request_interval` (1 s) after the previous one was answered, a launch at least
  `Limits.launch_interval` (12 s) after the previous launch was answered: the server sees them
  that far apart however late each reached it. `LAMBDA_RATE_SCALE` scales both (tests and the
  fake run at 0.01); the defaults are Lambda's documented limits.
- Retries with backoff on 429, 409 (Lambda's documented conflict on rulesets), 5xx and network
  errors, by urllib3's `Retry` on the session (Retry-After honoured, never faster than the
  request interval), except for launches: a launch is not idempotent, so an unknown outcome
  raises `LaunchOutcomeUnknown` and the caller reconciles (only a 429 launch is sent again).
- Typed errors chosen by the `error.code` field (never by message text), see `_ERRORS`.
- The API key lives in one private attribute and the session's header. It is never in a message,
  a repr or an exception (and `_redact` scrubs it from anything the server echoes back).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from urllib3.util.retry import Retry

from infra.node.errors import ProviderError, UsageError
from infra.node.net import is_loopback
from infra.node.wait import WaitTimeout, until

DEFAULT_URL = "https://cloud.lambda.ai/api/v1"
#: The user's Lambda key file (as Lambda's own CLI keeps it), relative to their home.
LAMBDA_KEYS_FILE = Path(".lambda_cloud") / "lambda_keys"
#: Statuses after which an instance never comes back.
GONE = frozenset({"terminated", "preempted"})
#: Statuses that end a wait for `active` with a failure.
FAILED = frozenset({"unhealthy", "terminating", *GONE})


class LambdaError(ProviderError):
    """The Lambda API refused or failed a request. `code` is the API's `error.code`."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class InvalidApiKey(LambdaError):
    """401 global/invalid-api-key."""


class AccountInactive(LambdaError):
    """403 global/account-inactive (or an invalid billing address)."""


class NotFound(LambdaError):
    """404 global/object-does-not-exist."""


class InvalidParameters(LambdaError):
    """400 global/invalid-parameters (includes a duplicate SSH key name)."""


class InsufficientCapacity(LambdaError):
    """400 instance-operations/launch/insufficient-capacity: try the next choice."""


class QuotaExceeded(LambdaError):
    """400 global/quota-exceeded: no choice will work until the quota is raised."""


class FileSystemInWrongRegion(LambdaError):
    """400 instance-operations/launch/file-system-in-wrong-region."""


class Duplicate(LambdaError):
    """400/409 global/duplicate."""


class RulesetInUse(LambdaError):
    """400 firewall-rulesets/firewall-ruleset-in-use: instances still use it (terminate first)."""


class Unavailable(LambdaError):
    """429/5xx/network errors that outlasted the retries."""


class LaunchOutcomeUnknown(LambdaError):
    """A launch request was sent but its answer was lost (timeout, 5xx, reset).

    The instance may or may not exist: find it by name before launching again.
    """


class MissingApiKey(UsageError):
    """No API key in LAMBDA_API_KEY or ~/.lambda_cloud/lambda_keys."""


_ERRORS: dict[str, type[LambdaError]] = {
    "global/invalid-api-key": InvalidApiKey,
    "global/account-inactive": AccountInactive,
    "global/invalid-address": AccountInactive,
    "global/object-does-not-exist": NotFound,
    "global/invalid-parameters": InvalidParameters,
    "global/quota-exceeded": QuotaExceeded,
    "instance-operations/launch/insufficient-capacity": InsufficientCapacity,
    "instance-operations/launch/file-system-in-wrong-region": FileSystemInWrongRegion,
    "global/duplicate": Duplicate,
    "firewall-rulesets/firewall-ruleset-in-use": RulesetInUse,
}


@dataclass(frozen=True)
class Limits:
    """Lambda's documented rate limits, optionally scaled (tests, the fake)."""

    #: Seconds between any two requests ("generally one request per second").
    request_interval: float = 1.0
    #: Seconds between two launches ("one request per 12 seconds").
    launch_interval: float = 12.0
    #: Longest single backoff sleep after a 429/5xx.
    backoff_cap: float = 30.0
    #: Safety margin over the intervals: the server's clock is not ours.
    margin: float = 0.02
    #: How long a launch whose answer was lost may take to show up in the instance list before
    #: we believe it never happened (generous: Lambda documents nothing about it).
    lost_launch_window: float = 120.0

    @classmethod
    def scaled(cls, scale: float, share: float = 1.0) -> Limits:
        """Lambda's limits times `scale`; `share` < 1 takes only that part of the request budget
        (the head's node provider and the user's machine share one account's budget)."""
        return cls(1.0 * scale / share, 12.0 * scale, 30.0 * scale, lost_launch_window=120.0 * scale)

    @property
    def scale(self) -> float:
        return self.launch_interval / 12.0

    @classmethod
    def from_env(cls, share: float = 1.0) -> Limits:
        raw = os.environ.get("LAMBDA_RATE_SCALE", "1")
        try:
            scale = float(raw)
        except ValueError:
            raise UsageError(f"LAMBDA_RATE_SCALE={raw!r}: expected a number such as 1 or 0.01") from None
        if not 0 < scale <= 100:
            raise UsageError(f"LAMBDA_RATE_SCALE={raw!r}: must be > 0 and <= 100")
        return cls.scaled(scale, share)


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


@dataclass
class _Pacer:
    """One request in flight at a time, shared by threads, each sent one interval (a launch: one
    launch interval) after the previous one was answered.

    Spacing the moments requests leave is not enough: the server judges the moments they arrive,
    and a request can take long from leaving to the server (80 ms on a loaded test machine, a slow
    network). Another thread's request sent meanwhile could arrive right behind it and be refused
    with a 429. Only the answer proves the server has seen a request, so the next one waits for
    it. A launch waiting out its longer interval holds nobody back."""

    limits: Limits
    lock: threading.Condition = field(default_factory=threading.Condition)
    next_any: float = 0.0
    next_launch: float = 0.0
    #: The thread whose request is between `wait` and `done`, if any.
    owner: int | None = None

    def wait(self, launch: bool) -> None:
        """Until this thread may send; its request is then in flight until it calls `done`."""
        me = threading.get_ident()
        with self.lock:
            while True:
                now = time.monotonic()
                start = max(self.next_any, self.next_launch) if launch else self.next_any
                busy = self.owner not in (None, me)
                if not busy and now >= start:
                    break
                # `done` wakes us; else our slot's time does (wait() may wake early: looped).
                self.lock.wait(None if busy else start - now)
            self.owner = me

    def done(self, launch: bool) -> None:
        """The request was answered (or failed): the next one waits its interval from now."""
        factor = 1 + self.limits.margin
        with self.lock:
            now = time.monotonic()
            if self.owner == threading.get_ident():  # a second `done` frees nobody else's turn
                self.owner = None
            self.next_any = max(self.next_any, now + self.limits.request_interval * factor)
            if launch:
                self.next_launch = max(self.next_launch, now + self.limits.launch_interval * factor)
            self.lock.notify_all()

    def push_back(self, seconds: float) -> None:
        """After a 429, keep every thread quiet for a while, not just the one that was told."""
        with self.lock:
            self.next_any = max(self.next_any, time.monotonic() + seconds)


#: Answers worth the same request again: rate limit, Lambda's 409 on rulesets ("conflict", sent
#: with the internal-error body), and server or gateway failures.
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class _PacedRetry(Retry):
    """urllib3's Retry, paced like every other request: it waits Retry-After when the answer has
    one (capped), else its exponential backoff but never less than one request interval; a 429
    also quiets every other thread (`_Pacer.push_back`). The failed attempt gives up its turn
    while it backs off; the retry then waits for a turn like any request."""

    pacer: _Pacer | None = None
    #: Retries of a launch take a launch slot.
    launch: bool = False

    def new(self, **kw: Any) -> _PacedRetry:
        retry = super().new(**kw)
        retry.pacer, retry.launch = self.pacer, self.launch
        return retry

    def get_backoff_time(self) -> float:
        limits = self.pacer.limits if self.pacer else Limits()
        floor = limits.request_interval * (1 + limits.margin)
        return max(floor, super().get_backoff_time())

    def sleep(self, response: Any = None) -> None:
        delay = self.get_backoff_time()
        header = response.headers.get("Retry-After") if response is not None else None
        if header and self.pacer is not None:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(header), self.pacer.limits.backoff_cap * 2))
        if self.pacer is not None:
            self.pacer.done(self.launch)
            if response is not None and response.status == 429:
                self.pacer.push_back(delay)
            time.sleep(delay)
            self.pacer.wait(self.launch)
        else:
            time.sleep(delay)


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
        from requests.adapters import HTTPAdapter

        self._key = api_key
        self.url = url.rstrip("/")
        self.limits = limits or Limits()
        self.timeout = timeout
        self.retries = retries
        self._pacer = _Pacer(self.limits)
        headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json",
                   "User-Agent": "rayfleet"}
        #: Every call but launch: urllib3 retries 409/429/5xx and network errors.
        self._session = requests.Session()
        #: Launch: not idempotent, so only what certainly created nothing is sent again (a 429,
        #: a connection never made); a lost answer or 5xx is the caller's to reconcile.
        self._launch_session = requests.Session()
        for session in (self._session, self._launch_session):
            adapter = HTTPAdapter(max_retries=self._retry(launch=session is self._launch_session))
            session.headers.update(headers)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        #: Requests sent, by "METHOD path", for benches and tests (a retry counts once).
        self.sent: list[str] = []

    def __repr__(self) -> str:
        return f"LambdaClient(url={self.url!r})"

    def _retry(self, launch: bool) -> _PacedRetry:
        retry = _PacedRetry(
            total=self.retries, backoff_factor=self.limits.request_interval,
            backoff_max=self.limits.backoff_cap, backoff_jitter=self.limits.request_interval,
            status_forcelist={429} if launch else RETRY_STATUSES, allowed_methods=None,
            read=0 if launch else None, other=0 if launch else None, raise_on_status=False,
            respect_retry_after_header=False)  # _PacedRetry.sleep reads it, capped
        retry.pacer, retry.launch = self._pacer, launch
        return retry

    def defer_launches(self, seconds: float) -> None:
        """No launch from this client before `seconds` from now (another process just launched)."""
        with self._pacer.lock:
            self._pacer.next_launch = max(self._pacer.next_launch, time.monotonic() + seconds)

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
                launch: bool = False) -> Any:
        """Send one API request and return its `data`, or raise a typed LambdaError. The session's
        urllib3 `Retry` does the retries; a launch's session resends only what was never created
        (429, or a connection never made)."""
        import requests

        what = f"{method} {path}"
        started = time.monotonic()
        session = self._launch_session if launch else self._session
        self._pacer.wait(launch)
        self.sent.append(what)
        try:
            response = session.request(method, f"{self.url}{path}", json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            if launch:
                raise LaunchOutcomeUnknown(
                    f"Lambda API: {what}: no answer ({type(exc).__name__})") from None
            raise Unavailable(f"Lambda API: {what}: no answer after {self.retries} retries in "
                              f"{time.monotonic() - started:.0f}s ({type(exc).__name__}); try "
                              "again later", status=0) from None
        finally:
            self._pacer.done(launch)
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
        raise _ERRORS.get(code, LambdaError)(text, code=code, status=response.status_code)

    # --- endpoints ------------------------------------------------------------------------------

    def instance_types(self) -> dict[str, InstanceType]:
        data = self.request("GET", "/instance-types")
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
                         self.limits.request_interval, f"an instance tagged {key}={value}")
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
