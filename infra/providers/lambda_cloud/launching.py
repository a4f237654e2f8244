"""Launching a Lambda cluster's missing nodes one by one, each down its list of choices (instance
type and region) on refusals, with a launch tag that finds a launch whose answer was lost; every
id goes to state the moment the API returns it (fleet.record)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infra.core import ui
from infra.core.state import State
from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.tags import TAG_LAUNCH
from infra.providers.lambda_cloud import fleet

if TYPE_CHECKING:
    from infra.providers.lambda_cloud.spec import Choice, Spec


@dataclass
class Launcher:
    """Launches the missing nodes one by one, moving down the choice lists on refusals."""

    client: api.LambdaClient
    spec: Spec
    state: State
    key_name: str
    run: str
    #: A capacity snapshot from `plan` that may be reused for the first launch (saves a request).
    types: dict[str, api.InstanceType] | None = None
    #: Human lines: which choice failed how, for the final error.
    attempts: list[str] | None = None
    #: Firewall ruleset ids to attach in a region (created on first use), or None for none.
    rulesets: Callable[[str], list[str]] | None = None
    #: More launch tags per slot (the autoscaling head carries Ray's node tags).
    extra_tags: Callable[[fleet.Slot], dict[str, str]] | None = None
    #: The capacity view the current slot was placed with (for prices).
    _seen: dict[str, api.InstanceType] = field(default_factory=dict)

    def launch(self, missing: list[fleet.Slot], region: str | None) -> None:
        self.attempts = []
        for slot in missing:
            region = self._launch_slot(slot, region)

    def _candidates(self, slot: fleet.Slot, region: str | None) -> list[Choice]:
        types = self.types if self.types is not None else self.client.instance_types(prompt=True)
        self.types = None  # later slots look again: capacity changes while we launch
        self._seen = types

        def has_capacity(choice: Choice) -> bool:
            info = types.get(choice.instance_type)
            if info is None:
                self._note(f"{choice}: no such instance type")
                return False
            if choice.region not in info.regions_with_capacity:
                self._note(f"{choice}: no capacity listed")
                return False
            return True

        if slot.role == "head" and region is None:
            found = []
            for choice in self.spec.head.choices:
                if not has_capacity(choice):
                    continue
                needed = self.spec.worker_choices(needed_now=True)
                if needed and not any(c.region == choice.region and has_capacity(c) for c in needed):
                    self._note(f"{choice}: no worker choice with capacity in {choice.region}")
                    continue
                found.append(choice)
            return found
        pool = self.spec.head.choices if slot.role == "head" else self.spec.worker_choices()
        return [c for c in pool if c.region == region and has_capacity(c)]

    def _note(self, line: str) -> None:
        assert self.attempts is not None
        if line not in self.attempts:
            self.attempts.append(line)

    def _launch_slot(self, slot: fleet.Slot, region: str | None) -> str:
        self.attempts = []  # the error names this node's choices only
        for choice in self._candidates(slot, region):
            try:
                self._launch_one(slot, choice)
            except api.InsufficientCapacity:
                self._note(f"{choice}: refused at launch (insufficient-capacity)")
                continue
            except api.FileSystemInWrongRegion:
                self._note(f"{choice}: file system {self.spec.file_system} is in another region")
                continue
            return choice.region
        where = f" in {region}" if region else ""
        raise fleet.LambdaProvisionError(
            f"no capacity for {slot.name}{where}: {'; '.join(self.attempts or ['no choices'])}; "
            "add choices to the spec or try later", list(self.attempts or []))

    def _launch_one(self, slot: fleet.Slot, choice: Choice) -> None:
        price = 0
        rulesets = self.rulesets(choice.region) if self.rulesets else []
        for attempt in range(3):
            token = secrets.token_hex(6)
            tags = {**fleet.identity_tags(self.state, slot.key), TAG_LAUNCH: token,
                    **(self.extra_tags(slot) if self.extra_tags else {})}
            with ui.step(f"launching {slot.name}: {choice.instance_type} in {choice.region}"):
                try:
                    instance_id = self.client.launch(
                        region=choice.region, instance_type=choice.instance_type,
                        ssh_key_name=self.key_name, name=slot.name,
                        file_system_names=[self.spec.file_system] if self.spec.file_system else None,
                        tags=tags, firewall_rulesets=rulesets)
                except api.LaunchOutcomeUnknown as exc:
                    ui.warn(f"{exc}; looking for {slot.name} (launch tag {token}) before "
                            "launching again")
                    found = find_lost(self.client, token)
                    if found is None:
                        if attempt == 2:
                            raise
                        continue
                    ui.info(f"{slot.name} exists after all ({found.id}); adopting it")
                    instance_id = found.id
                    price = found.price_cents_per_hour
            fleet.record(self.state, instance_id, slot.name, choice, price or self._price(choice), self.run,
                   role=slot.role, slot=slot.key)
            return

    def _price(self, choice: Choice) -> int:
        info = self._seen.get(choice.instance_type)
        return info.price_cents_per_hour if info else 0


def find_lost(client: api.LambdaClient, token: str) -> api.Instance | None:
    """The launch tagged `token`, once the list shows it, or None after the generous window."""
    return client.find_tagged(TAG_LAUNCH, token)
