"""The live suite's money: the cap checked against the provider's own estimate before every `up`,
and what the run spent, printed at the end.

Worst case of a cluster = its most expensive hour (`invoke plan --json`: `cost_range`, the
provider's own figure: Lambda's /instance-types, GCP's price table, Slurm's node-hours) times the
run's time limit (`--max-hours`), after which the suite tears everything down. Reservations add
up over the run, so a cap that covers the first cluster but not the second refuses before the
first is created.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


class CapExceeded(Exception):
    """The worst case of the run would exceed the user's cap: refuse before creating anything."""


@dataclass
class _Life:
    started: float
    ended: float | None = None
    #: The highest rate the provider reported for it (plan's minimum size, then `status`).
    peak_hourly: float = 0.0


@dataclass
class Budget:
    #: "usd" (Lambda, GCP) or "node-hours" (Slurm bills its allocation, not money).
    unit: str
    cap: float
    hours: float
    reserved: dict[str, float] = field(default_factory=dict)
    lives: dict[str, _Life] = field(default_factory=dict)
    source: str = ""

    def amount(self, value: float) -> str:
        return f"${value:.2f}" if self.unit == "usd" else f"{value:.2f} node-hours"

    def reserve(self, cluster: str, plan: dict[str, Any]) -> float:
        """Reserve `cluster`'s worst case from `invoke plan --json`; CapExceeded if over the cap."""
        rng = plan.get("cost_range") or {}
        if self.unit == "usd":
            hourly = rng.get("max_hourly_usd")
        else:
            hourly = float(rng["max_nodes"]) if rng.get("node_hours") else None
        if hourly is None:
            raise CapExceeded(f"{cluster}: the provider gives no cost estimate for this cluster, "
                              f"so the cap ({self.amount(self.cap)}) cannot be enforced")
        self.source = rng.get("source") or self.source
        worst = float(hourly) * self.hours
        others = sum(v for k, v in self.reserved.items() if k != cluster)
        if others + worst > self.cap:
            raise CapExceeded(
                f"the worst case of this run is {self.amount(others + worst)} "
                f"({cluster}: {self.amount(float(hourly))}/h at its largest for up to "
                f"{self.hours:g} h) and exceeds --max-{'usd' if self.unit == 'usd' else 'node-hours'}"
                f"={self.cap:g}; raise the cap or lower --max-hours")
        self.reserved[cluster] = worst
        return worst

    def started(self, cluster: str, plan: dict[str, Any]) -> None:
        rng = plan.get("cost_range") or {}
        low = rng.get("min_hourly_usd") if self.unit == "usd" else rng.get("min_nodes")
        self.lives[cluster] = _Life(time.time(), peak_hourly=float(low or 0.0))

    def observed(self, cluster: str, status: dict[str, Any]) -> None:
        """Raise the cluster's peak rate to what `invoke status --json` reports now."""
        life, cost = self.lives.get(cluster), status.get("cost") or {}
        if life is None:
            return
        hourly = cost.get("hourly_usd") if self.unit == "usd" else cost.get("nodes")
        if hourly is not None:
            life.peak_hourly = max(life.peak_hourly, float(hourly))

    def ended(self, cluster: str) -> None:
        life = self.lives.get(cluster)
        if life is not None and life.ended is None:
            life.ended = time.time()

    def spent(self) -> float:
        """An upper bound: each cluster at the highest rate seen, from `up` until it was gone."""
        now = time.time()
        return sum(life.peak_hourly * ((life.ended or now) - life.started) / 3600
                   for life in self.lives.values())

    def summary(self) -> str:
        parts = ", ".join(
            f"{name} {self.amount(life.peak_hourly * ((life.ended or time.time()) - life.started) / 3600)}"
            for name, life in self.lives.items())
        return (f"live run spent at most {self.amount(self.spent())} of the "
                f"{self.amount(self.cap)} cap ({parts or 'no cluster'}; {self.source or 'no prices'})")
