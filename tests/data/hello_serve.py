"""A Serve app for tests: answers where its replica runs and whether the node's environment gave
it the tracking login (never the login itself)."""

from __future__ import annotations

import os
import socket
from typing import Any

from ray import serve


@serve.deployment
class Hello:
    async def __call__(self, request: Any) -> dict[str, Any]:
        return {"host": socket.gethostname(),
                "tracking_uri": os.environ.get("MLFLOW_TRACKING_URI"),
                "has_password": bool(os.environ.get("MLFLOW_TRACKING_PASSWORD"))}


app = Hello.bind()
