"""What the local provider records in state (infra/core/state.py): its head's processes."""

from __future__ import annotations

from typing import ClassVar

from infra.core.state import Attrs


class Head(Attrs):
    """A head's processes on this machine; its id is their temp dir."""

    KIND: ClassVar[str] = "ray-head"

    #: The first of the head's block of ports (rayproc.PortBlock).
    port_base: int
    #: Where the temp dir was made (removed with it when rayfleet made it).
    temp_parent: str | None = None
    started_at: str | None = None
