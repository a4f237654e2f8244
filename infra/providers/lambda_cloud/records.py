"""What the Lambda provider records in state (infra/core/state.py), one model per resource kind."""

from __future__ import annotations

from typing import ClassVar

from infra.core.state import Attrs


class SshKey(Attrs):
    """The SSH key registered with the account; its id is Lambda's key id."""

    KIND: ClassVar[str] = "lambda-ssh-key"

    name: str
    registered: bool | None = None


class Instance(Attrs):
    """A launched (or adopted) instance; its id is Lambda's instance id."""

    KIND: ClassVar[str] = "lambda-instance"

    name: str
    #: Which node of the spec it is ("head", a worker's slot) and its role there.
    slot: str | None = None
    role: str | None = None
    #: The run of `up` that launched it, or "adopted".
    run: str | None = None
    instance_type: str | None = None
    region: str | None = None
    price_cents_per_hour: int | None = None
    launched_at: str | None = None
    ip: str | None = None
    private_ip: str | None = None
    status: str | None = None


class Firewall(Attrs):
    """The account's firewall ruleset of one region; its id is the ruleset's id."""

    KIND: ClassVar[str] = "lambda-firewall-ruleset"

    name: str
    region: str
    #: The networks its rules open SSH to.
    sources: list[str] | None = None
    #: The sharing gateway's (port, source ranges), when the rules open it.
    gateway: tuple[int, list[str]] | None = None
