"""The toy provider's section of a cluster spec, and its capability table (the defaults: it
offers no tracking, metrics or sharing, so `plan` and `up` refuse those keys in one line)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from infra.core.capabilities import Capabilities
from infra.core.spec import ClusterSpec


class Spec(ClusterSpec):
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(metrics_default="none")

    provider: Literal["toy"]
    #: How many machines `up` creates.
    machines: int = Field(1, ge=1, le=8)
    #: The folder that plays the cloud's API: one JSON file per machine.
    cloud: str
    #: What one machine costs per hour, in dollars.
    usd_per_hour: float = Field(0.25, ge=0)
