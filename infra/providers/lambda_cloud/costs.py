"""What a Lambda cluster costs now, in the provider-neutral form `invoke status` and `list` show.

Prices are Lambda's own (`price_cents_per_hour` of each instance, as `/instance-types` and
`/instances` report them); `status` sums them over the instances that bill now.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.providers.base import Cost

SOURCE = "Lambda /instance-types prices"


def cost(hourly_cents: float, accrued_cents: float, nodes: int,
         launched_at: list[str | None]) -> Cost:
    """`nodes` billing `hourly_cents` now, `accrued_cents` so far; uptime from the oldest launch."""
    from infra.providers.base import Cost

    now = dt.datetime.now(dt.timezone.utc)
    ages = []
    for stamp in launched_at:
        try:
            ages.append((now - dt.datetime.fromisoformat(str(stamp))).total_seconds())
        except ValueError:
            continue
    uptime = max(ages) if ages and nodes else None
    return Cost(nodes, hourly_cents / 100, uptime, round(accrued_cents / 100, 4), source=SOURCE)
