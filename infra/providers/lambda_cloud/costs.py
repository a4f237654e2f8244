"""What a Lambda cluster costs now, in the provider-neutral form `invoke status` and `list` show.

Prices are Lambda's own (`price_cents_per_hour` of each instance, as `/instance-types` and
`/instances` report them); `status` sums them over the instances that bill now.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infra.core.costs import usd
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import fleet
from infra.providers.lambda_cloud.records import Instance

if TYPE_CHECKING:
    from infra.core.costs import Cost
    from infra.core.state import State

SOURCE = "Lambda /instance-types prices"


def cost(hourly_cents: float, accrued_cents: float, nodes: int,
         launched_at: list[str | None]) -> Cost:
    """`nodes` billing `hourly_cents` now, `accrued_cents` so far; uptime from the oldest launch."""
    from infra.core.costs import Cost

    now = dt.datetime.now(dt.timezone.utc)
    ages = []
    for stamp in launched_at:
        try:
            ages.append((now - dt.datetime.fromisoformat(str(stamp))).total_seconds())
        except ValueError:
            continue
    uptime = max(ages) if ages and nodes else None
    return Cost(nodes, hourly_cents / 100, uptime, round(accrued_cents / 100, 4), source=SOURCE)


def usd_from_cents(cents: float) -> str:
    """Lambda's prices are cents per hour; shown in dollars, the one way (infra.core.costs.usd)."""
    return usd(cents / 100)


def uptime(launched_at: str | None) -> float | None:
    if not launched_at:
        return None
    started = dt.datetime.fromisoformat(launched_at)
    return max(0.0, (dt.datetime.now(dt.timezone.utc) - started).total_seconds())


@dataclass
class Bill:
    """The cluster's instances as the API lists them now, with what each costs (for `status`)."""

    #: Instances of the state file that the API still lists, by id.
    tracked: dict[str, api.Instance]
    #: Carry our cluster id but are not in state: the autoscaler's workers, and orphans of an
    #: interrupted `up`.
    scaled: list[api.Instance]
    orphans: list[api.Instance]
    #: Named like the cluster without our id: never ours.
    lookalikes: list[api.Instance]
    rows: list[dict[str, str]] = field(default_factory=list)
    hourly_cents: float = 0.0
    accrued_cents: float = 0.0
    active: int = 0


def tally(state: State, listed: list[api.Instance]) -> Bill:
    tracked, strays, lookalikes = fleet.ours(state, listed)
    bill = Bill(tracked, [i for i in strays if fleet.autoscaled(i)],
                [i for i in strays if not fleet.autoscaled(i)], lookalikes)
    for r in state.resources(Instance):
        inst = tracked.get(r.id)
        price = inst.price_cents_per_hour if inst else (r.attrs.price_cents_per_hour or 0)
        up_s = uptime(r.attrs.launched_at)
        if inst is not None and inst.status not in api.GONE:
            bill.hourly_cents += price
            bill.accrued_cents += price * (up_s or 0) / 3600
        bill.active += bool(inst and inst.status == "active")
        bill.rows.append(_row(r.attrs.name, r.id,
                              inst.status if inst else "not listed (terminated?)",
                              inst, r.attrs, price, up_s))
    for inst in bill.scaled + bill.orphans:
        up_s = uptime(fleet.tag_time(inst))
        bill.hourly_cents += inst.price_cents_per_hour
        bill.accrued_cents += inst.price_cents_per_hour * (up_s or 0) / 3600
        bill.active += inst.status == "active"
        label = "autoscaled" if fleet.autoscaled(inst) else "ORPHAN"
        bill.rows.append(_row(inst.name, inst.id, f"{inst.status} {label}", inst, None,
                              inst.price_cents_per_hour, up_s))
    return bill


def _row(name: object, instance_id: str, status: str, inst: api.Instance | None,
         attrs: Instance | None, price: int, up_s: float | None) -> dict[str, str]:
    return {
        "instance": str(name), "id": instance_id[:12], "state": status,
        "ip": str((inst.ip if inst else None) or (attrs and attrs.ip) or "-"),
        "type": str(inst.type_name if inst else (attrs and attrs.instance_type) or "?"),
        "region": str(inst.region if inst else (attrs and attrs.region) or "?"),
        "$/h": usd_from_cents(price),
        "uptime": "?" if up_s is None else str(dt.timedelta(seconds=int(up_s))),
        "accrued": "?" if up_s is None else usd_from_cents(price * up_s / 3600),
    }
