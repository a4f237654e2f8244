"""Lambda's autodown action (infra/node/autodown.py): the head terminates its workers, then itself.

Runs on the head with only requests and this package (the sweep reuses its listing helpers, not the
other way round); infra/providers/lambda_cloud/services.py is the laptop's side. The API key
is the one the head already holds for autoscaling, read from its 0600 file (`api_key_file`), never
from the config or a command line. Instances are chosen by the cluster id in their launch tags
(immutable), so nothing of another cluster can be hit; the head goes last so that a failure
half-way leaves a head that can retry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.node import identity
from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.tags import TAG_NODE
from infra.node.wait import until


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
        until(lambda: all(_is_head(i, head_id) for i in _ours(client, cluster_id)), wait_s,
              max(client.limits.routine_interval, 0.05), "the workers to leave the list")
    heads = [i for i in _ours(client, cluster_id) if _is_head(i, head_id)]
    if heads:
        log("terminating the head: " + ", ".join(str(i["name"]) for i in heads))
        client.terminate([str(i["id"]) for i in heads])
