"""The smallest Serve app, for bench/serve_deploy.py: answers every request with "ok"."""

from __future__ import annotations

from typing import Any

from ray import serve


@serve.deployment
class Echo:
    async def __call__(self, request: Any) -> str:
        return "ok"


app = Echo.bind()
