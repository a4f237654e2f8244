"""The toy provider's verbs. Its cloud is a folder: a machine is a JSON file there carrying the
cluster's id and owner (as a cloud's tags would), so ownership is decided by the id, never by a
name; each machine is recorded in state before its file is made."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import ClassVar

from infra.core.costs import Cost, CostRange
from infra.core.endpoint import Endpoint
from infra.core.errors import ProviderError
from infra.core.state import Attrs, State
from infra.providers.base import Plan, PlannedResource, ProviderStatus, Readiness
from infra.providers.base import Provider as BaseProvider
from tests.toy_provider.spec import Spec

PRICES = "the toy's price list"


class Machine(Attrs):
    """A toy machine; its id is its name in the toy cloud."""

    KIND: ClassVar[str] = "toy-machine"

    started_at: str


class Provider(BaseProvider[Spec, None]):
    name = "toy"

    def _cloud(self) -> Path:
        return Path(self.spec.cloud)

    def _names(self) -> list[str]:
        return [f"toy-{self.spec.name}-{i}" for i in range(self.spec.machines)]

    def _listed(self, state: State) -> list[str]:
        """The machines the toy cloud lists with this cluster's id, by name."""
        return sorted(p.stem for p in self._cloud().glob("*.json")
                      if json.loads(p.read_text())["cluster_id"] == state.cluster_id)

    def plan(self, state: State | None) -> Plan[None]:
        recorded = {r.id for r in state.resources(Machine)} if state else set()
        problems = [] if self._cloud().is_dir() else [
            f"cloud: no folder {self._cloud()}; create it or fix `cloud:` in {self.spec.source}"]
        return Plan(resources=[PlannedResource("toy machine", name, f"${self.spec.usd_per_hour}/h",
                                               name in recorded) for name in self._names()],
                    files={"machines.txt": "".join(f"{n}\n" for n in self._names())},
                    notes=[f"the toy cloud is the folder {self._cloud()}"], problems=problems,
                    extra=None)

    def create(self, state: State, plan: Plan[None]) -> Endpoint:
        if plan.problems:
            raise ProviderError(plan.problems[0])
        for name in self._names():
            if state.find(Machine, name) is None:
                now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                state.add(name, Machine(name=name, started_at=now))  # recorded first
            (self._cloud() / f"{name}.json").write_text(json.dumps(
                {"cluster_id": state.cluster_id, "owner": state.owner}))
        address = f"{self._names()[0]}:6379"
        state.set_info(address=address)
        return Endpoint(dashboard_url="", address=address)

    def status(self, state: State) -> ProviderStatus:
        """Never `running`: that promises a Ray that answers, and the toy starts none."""
        recorded = [r.id for r in state.resources(Machine)]
        if not recorded:
            return ProviderStatus(False, "not up")
        listed = self._listed(state)
        rows = [{"machine": name, "listed": "yes" if name in listed else "NO"}
                for name in recorded]
        return ProviderStatus(
            False, f"{len(listed)} of {len(recorded)} toy machines listed in {self._cloud()}",
            rows, state=f"{len(listed)}/{len(recorded)} machines",
            cost=Cost(len(listed), len(listed) * self.spec.usd_per_hour, source=PRICES))

    def readiness(self) -> list[Readiness]:
        cloud = self._cloud()
        return [Readiness("toy cloud", cloud.is_dir(), str(cloud),
                          "" if cloud.is_dir() else f"mkdir {cloud}")]

    def cost_range(self, plan: Plan[None] | None) -> CostRange | None:
        hourly = self.spec.machines * self.spec.usd_per_hour
        return CostRange(self.spec.machines, self.spec.machines, hourly, hourly, source=PRICES)

    def teardown(self, state: State) -> None:
        for name in self._listed(state):
            (self._cloud() / f"{name}.json").unlink()
        left = self._listed(state)
        if left:
            raise ProviderError(f"toy machines {', '.join(left)} are still listed")
        for machine in state.resources(Machine):
            state.remove(Machine, machine.id)
