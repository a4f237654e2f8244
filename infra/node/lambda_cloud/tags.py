"""Launch-tag keys of Lambda instances, shared by `up` (fleet.py) and the head's node provider.

Lambda tags are fixed at launch (key `^[a-z][a-z0-9-:]+$`, at most 55 characters; value at most
128), so they hold what must survive: identity (infra/node/identity.py), which node it is, and Ray's
immutable node tags. This module imports nothing heavy: the head imports it.
"""

from __future__ import annotations

import re

#: Which node of the cluster: `head`, `worker-<i>` (fixed size) or the autoscaler's node type.
TAG_NODE = "rayfleet-node"
#: A random token per launch request: finds a launch whose answer was lost.
TAG_LAUNCH = "rayfleet-launch"
#: Unix time of the launch (the API reports none; uptime and accrued cost need it).
TAG_LAUNCHED_AT = "rayfleet-launched-at"

_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")


def valid(key: str, value: str) -> bool:
    return bool(_KEY.fullmatch(key)) and len(key) <= 55 and len(value) <= 128
