"""The strict `provider: lambda` section of a cluster spec (see clusters/lambda.yaml)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from infra.core.capabilities import CLOUD_HEAD, Capabilities
from infra.core.spec import ClusterSpec, StrictModel, WorkerRange, existing_file

#: Regions where Lambda applies no firewall rule (firewall.UNFILTERED_REGIONS; kept here too so
#: the spec module imports nothing of the provider's).
_UNFILTERED = ("us-south-1",)


class Choice(StrictModel):
    """One (instance type, region) to try, in the order listed."""

    #: A Lambda instance type name, e.g. gpu_1x_a10 (see `invoke plan` for prices and capacity).
    instance_type: str = Field(pattern=r"^[a-z0-9_]{1,64}$")
    #: A Lambda region name, e.g. us-east-1.
    region: str = Field(pattern=r"^[a-z]+(-[a-z]+)*-[0-9]+$")

    def __str__(self) -> str:
        return f"{self.instance_type}@{self.region}"


class Head(StrictModel):
    #: Ordered fallbacks for the head instance; the first with capacity wins.
    choices: list[Choice] = Field(min_length=1, max_length=32)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, value: list[Choice]) -> list[Choice]:
        return _distinct(value)


class Workers(StrictModel):
    #: Number of worker instances (the head runs Ray work too).
    count: int = Field(1, ge=0, le=64)
    #: Ordered fallbacks for workers; only those in the head's region are used.
    choices: list[Choice] = Field(default_factory=list, max_length=32)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, value: list[Choice]) -> list[Choice]:
        return _distinct(value)


class WorkerType(WorkerRange):
    """One kind of worker the autoscaler may launch, between min_workers and max_workers."""

    #: Ordered fallbacks; only those in the head's region are used.
    choices: list[Choice] = Field(min_length=1, max_length=32)
    #: Always running (launched by `up`'s autoscaler and never removed when idle).
    min_workers: int = Field(0, ge=0, le=64)
    #: Never more than this many of this type.
    max_workers: int = Field(1, ge=0, le=64)
    #: What Ray is told one worker of this type offers (e.g. {GPU: 1, CPU: 8, my_resource: 1});
    #: unset: CPU and GPU of the first choice's instance type, from /instance-types.
    resources: dict[str, float] | None = None

    @field_validator("choices")
    @classmethod
    def _distinct(cls, value: list[Choice]) -> list[Choice]:
        return _distinct(value)


def _distinct(choices: list[Choice]) -> list[Choice]:
    seen = set()
    for choice in choices:
        if str(choice) in seen:
            raise ValueError(f"{choice} is listed twice; remove the repetition")
        seen.add(str(choice))
    return choices


class Spec(ClusterSpec):
    #: The autoscaler's user alone holds the API key (users.py).
    CAPABILITIES: ClassVar[Capabilities] = CLOUD_HEAD

    provider: Literal["lambda"]
    head: Head
    workers: Workers = Field(default_factory=Workers)
    #: Autoscaling: worker types Ray's autoscaler launches on demand (replaces `workers`).
    worker_types: dict[str, WorkerType] | None = Field(None, min_length=1, max_length=8)
    #: Autoscaling: minutes a worker may idle before the autoscaler terminates it.
    idle_timeout_minutes: float = Field(5.0, ge=0.05, le=24 * 60)
    #: Login user on the instances (Lambda's images use ubuntu).
    ssh_user: str = Field("ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    #: Use this SSH key already registered in the account instead of a generated one.
    ssh_key_name: str | None = Field(None, min_length=1, max_length=64)
    #: The private key file of `ssh_key_name` (required with it).
    ssh_private_key: str | None = None
    #: Networks (IPv4 CIDR) allowed to SSH to the nodes; unset: anywhere (warned at every up).
    ssh_source_ranges: list[str] | None = Field(None, min_length=1, max_length=64)
    #: Regions where Lambda applies no firewall rule (us-south-1) that a choice may still use,
    #: knowing its nodes are open on every port: without this, such a choice is refused.
    accept_open_regions: list[Literal["us-south-1"]] = Field(default_factory=list, max_length=1)
    #: OpenSSH ProxyCommand to reach the instances (a bastion); %h/%p are the address and port.
    ssh_proxy_command: str | None = Field(None, min_length=1)
    #: A Lambda file system to attach to every node (it fixes the region).
    file_system: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,59}$")
    #: Node environment setup/install.sh installs; `none` uses the `ray` already on the PATH.
    env: Literal["auto", "cpu", "gpu", "none"] = "auto"
    #: How install.sh builds the env (conda, a venv, or whatever the node has).
    env_backend: Literal["auto", "conda", "venv"] = "auto"
    #: Object store size per node in MiB; unset lets Ray take 30% of the node's memory.
    object_store_memory_mb: int | None = Field(None, ge=75)
    #: How long instances may take to be active and accept SSH.
    boot_timeout_s: int = Field(1200, ge=10, le=7200)
    #: How long `ray up` plus every node joining may take.
    ray_timeout_s: int = Field(1200, ge=30, le=7200)

    @field_validator("ssh_private_key")
    @classmethod
    def _key_file(cls, value: str | None) -> str | None:
        existing_file(value, "give the private key of ssh_key_name")
        return value

    @field_validator("ssh_source_ranges")
    @classmethod
    def _cidrs(cls, value: list[str] | None) -> list[str] | None:
        import ipaddress

        for item in value or []:
            try:
                net = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IPv4 network; write e.g. 203.0.113.0/24") from None
            if net.version != 4:
                raise ValueError(f"{item!r}: Lambda firewall rules take IPv4 networks only")
        return value

    @field_validator("ssh_proxy_command")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and re.search(r"[\r\n]", value):
            raise ValueError("must be a single line")
        return value

    @field_validator("worker_types")
    @classmethod
    def _type_names(cls, value: dict[str, WorkerType] | None) -> dict[str, WorkerType] | None:
        for name in value or {}:
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,15}", name) or name == "head":
                raise ValueError(f"{name!r}: a worker type name is 1-16 lowercase letters, digits, "
                                 "'_' or '-', starting with a letter, and not 'head'")
        return value

    @property
    def autoscaling(self) -> bool:
        return self.worker_types is not None

    @property
    def fixed_workers(self) -> int:
        """Workers `up` launches itself: the fixed count, none when the autoscaler does it."""
        return 0 if self.autoscaling else self.workers.count

    def worker_choices(self, needed_now: bool = False) -> list[Choice]:
        """Every worker choice (of `workers` or of all worker types). With `needed_now`, only
        those whose nodes `up` waits for (fixed workers, or types with min_workers > 0)."""
        if not self.autoscaling:
            return list(self.workers.choices) if self.workers.count or not needed_now else []
        return [c for kind in (self.worker_types or {}).values()
                if kind.min_workers or not needed_now for c in kind.choices]

    def all_choices(self) -> list[tuple[str, Choice]]:
        """(where in the spec, choice) for every choice of head, workers and worker types."""
        found = [("head.choices", c) for c in self.head.choices]
        found += [("workers.choices", c) for c in self.workers.choices]
        found += [(f"worker_types.{name}.choices", c)
                  for name, kind in (self.worker_types or {}).items() for c in kind.choices]
        return found

    @model_validator(mode="after")
    def _open_regions(self) -> Spec:
        # Where Lambda ignores firewall rules (API description 1.8.3, /firewall-rules).
        used = set()
        for where, choice in self.all_choices():
            if choice.region in _UNFILTERED:
                used.add(choice.region)
                if choice.region not in self.accept_open_regions:
                    raise ValueError(
                        f"{where}: Lambda applies no firewall rules in {choice.region}: its nodes "
                        "accept connections on every port from anywhere; choose another region or "
                        f"add `accept_open_regions: [{choice.region}]`")
        for region in self.accept_open_regions:
            if region not in used:
                raise ValueError(f"accept_open_regions: no choice uses {region}; remove it")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        if self.worker_types is not None:
            if "workers" in self.model_fields_set:
                raise ValueError("workers: give either workers (a fixed number) or worker_types "
                                 "(autoscaling), not both; remove workers")
            head_regions = {c.region for c in self.head.choices}
            for name, kind in self.worker_types.items():
                if not head_regions & {c.region for c in kind.choices}:
                    raise ValueError(f"worker_types.{name}.choices: no region in common with "
                                     "head.choices; all nodes of a cluster run in one region")
            if self.ssh_key_name is not None or self.ssh_private_key is not None:
                raise ValueError("ssh_key_name: autoscaling clusters use the cluster's own "
                                 "generated key (the head logs into new workers with it); remove "
                                 "ssh_key_name and ssh_private_key")
            return self
        if (self.ssh_key_name is None) != (self.ssh_private_key is None):
            raise ValueError("ssh_key_name and ssh_private_key go together: give both (use a key "
                             "already in the account) or neither (rayfleet generates one)")
        if self.workers.count and not self.workers.choices:
            raise ValueError(f"workers.choices: workers.count is {self.workers.count} but no "
                             "choices are listed; add at least one {instance_type, region}")
        head_regions = {c.region for c in self.head.choices}
        if self.workers.count and not head_regions & {c.region for c in self.workers.choices}:
            raise ValueError("workers.choices: no region in common with head.choices; all nodes of "
                             "a cluster run in one region")
        return self

    def private_key_path(self) -> Path | None:
        return Path(self.ssh_private_key).expanduser() if self.ssh_private_key else None
