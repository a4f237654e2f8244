"""What the gateway's mixins (its job routes, dashboard views and tick) call of Ray through it.

The calls are written once, in infra/node/gateway.py's `Gateway`; each mixin inherits this class
so that it names them without writing them again. Ray's standard library and aiohttp only (node
rule).
"""

from __future__ import annotations

from typing import Any


class Upstream:
    """Ray's dashboard and job API as the gateway reaches them with the cluster's token."""

    async def ray_jobs(self) -> tuple[int, list[dict[str, Any]]]:
        """Ray's job list: its status and the jobs (empty unless 200)."""
        raise NotImplementedError

    async def upstream_json(self, method: str, path: str) -> tuple[int, Any]:
        raise NotImplementedError

    async def upstream_raw(self, method: str, path: str, query: str = "") -> tuple[int, bytes]:
        raise NotImplementedError

    async def upstream_post_json(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        raise NotImplementedError
