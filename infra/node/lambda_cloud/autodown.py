"""Lambda's autodown action (infra/autodown.py): the head terminates its workers, then itself.

Runs on the head with only requests and our small modules (the sweep reuses its listing helpers,
not the other way round, so nothing here imports pydantic). The API key is the one the head already
holds for autoscaling, read from its 0600 file (`api_key_file`), never from the config or a command
line. Instances are chosen by the cluster id in their launch tags (immutable), so nothing of another
cluster can be hit; the head goes last so that a failure half-way leaves a head that can retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra import identity
from infra.providers.lambda_cloud import api

#: The launch tag saying which node of the cluster an instance is (see fleet.py).
TAG_NODE = "rayfleet-node"


def tags_of(raw: dict[str, Any]) -> dict[str, str]:
    """An instance's launch tags from the API's JSON (key -> value)."""
    return {str(t.get("key")): str(t.get("value")) for t in raw.get("tags") or []
            if isinstance(t, dict)}


def listed(client: api.LambdaClient) -> list[dict[str, Any]]:
    """GET /instances as the API sends it: every field, tags included, whatever the client parses."""
    data = client.request("GET", "/instances")
    return [i for i in data if isinstance(i, dict)]


def _client(args: dict[str, Any]) -> api.LambdaClient:
    key = Path(str(args["api_key_file"])).expanduser().read_text().strip()
    limits = api.Limits.scaled(float(args.get("rate_scale") or 1.0))
    # No URL in the config: the head's own LAMBDA_API_URL, else Lambda's (api.base_url()).
    return api.LambdaClient(key, str(args.get("api_url") or api.base_url()), limits)


def _ours(client: api.LambdaClient, cluster_id: str) -> list[dict[str, Any]]:
    return [i for i in listed(client) if tags_of(i).get(identity.TAG_CLUSTER) == cluster_id
            and i.get("status") not in api.GONE]


def _is_head(raw: dict[str, Any], head_id: str | None) -> bool:
    return str(raw["id"]) == head_id if head_id else tags_of(raw).get(TAG_NODE) == "head"


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    """Terminate every instance tagged with `cluster_id`: workers, wait, then the head."""
    client = _client(args)
    cluster_id = str(args["cluster_id"])
    head_id = str(args["head_instance_id"]) if args.get("head_instance_id") else None
    wait_s = float(args.get("wait_s") or 600)
    workers = [i for i in _ours(client, cluster_id) if not _is_head(i, head_id)]
    if workers:
        log(f"terminating {len(workers)} worker(s): " + ", ".join(str(i["name"]) for i in workers))
        client.terminate([str(i["id"]) for i in workers])
        deadline = time.monotonic() + wait_s
        while any(not _is_head(i, head_id) for i in _ours(client, cluster_id)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers still listed after {wait_s:g}s")
            time.sleep(max(client.limits.request_interval, 0.05))
    heads = [i for i in _ours(client, cluster_id) if _is_head(i, head_id)]
    if heads:
        log("terminating the head: " + ", ".join(str(i["name"]) for i in heads))
        client.terminate([str(i["id"]) for i in heads])


# --- this machine's side: what `up` puts on the head (see infra/autodown_remote.py) ---------------

#: The modules the action imports, beyond the watcher's own (autodown_remote.CORE_FILES).
FILES = ["infra/providers/lambda_cloud/__init__.py", "infra/providers/lambda_cloud/api.py",
         "infra/providers/lambda_cloud/autodown.py"]
#: The API key on the head (0600; the same file the autoscaler's node provider reads).
KEY_FILE = ".rayfleet/lambda-api-key"
#: The Python next to the `ray` the head runs: it has requests (Ray depends on it).
HEAD_PYTHON = '$(dirname "$(command -v ray)")/python'


def watcher_config(cluster: str, cluster_id: str, idle_minutes: float, head_id: str,
                   dashboard_port: int, token_path: str | None, api_url: str | None,
                   rate_scale: float) -> Any:
    """The head's watcher config: Ray on the head's loopback, this action, no secret inside."""
    from infra import autodown

    return autodown.Config(
        cluster=cluster, cluster_id=cluster_id, idle_minutes=idle_minutes,
        dashboard_url=f"http://127.0.0.1:{dashboard_port}", marker=autodown.HEAD_MARKER,
        action="infra.providers.lambda_cloud.autodown:remove",
        action_args={"api_key_file": f"~/{KEY_FILE}", "api_url": api_url, "rate_scale": rate_scale,
                     "cluster_id": cluster_id, "head_instance_id": head_id},
        token_path=token_path)
