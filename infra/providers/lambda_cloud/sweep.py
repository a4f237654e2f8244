"""Lambda's side of `invoke sweep` (infra/cli/sweep.py): instances whose launch tags carry a cluster id.

Tags are set at launch and cannot change, so an instance's `rayfleet-cluster` / `rayfleet-owner` tags
(infra/node/identity.py) say for its whole life whose cluster it belongs to. Instances without them are
never listed, whatever their name. Only instances bill by the hour; SSH keys and firewall rulesets
cost nothing and stay for `invoke teardown` of their cluster (their names carry the cluster's name).
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

from infra.core.errors import ProviderError
from infra.node import identity, wait
from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.autodown import listed, tags_of
from infra.providers.base import Marked
from infra.providers.base import Sweeper as BaseSweeper


class Sweeper(BaseSweeper):
    provider: ClassVar[str] = "lambda"
    #: Lambda's pacing (1 request/s) and retries: a terminate and its wait need a while.
    timeout_s: ClassVar[float] = 60.0
    wait_s: ClassVar[float] = 300.0

    def __init__(self, client: api.LambdaClient | None = None) -> None:
        self._client = client

    def client(self) -> api.LambdaClient:
        if self._client is None:
            self._client = api.LambdaClient.from_env()
        return self._client

    def credentials(self) -> str | None:
        if self._client is None and api.read_api_key() is None:
            return None
        return "LAMBDA_API_KEY / ~/" + str(api.LAMBDA_KEYS_FILE)

    def marked(self) -> list[Marked]:
        found = []
        for raw in listed(self.client()):
            tags = tags_of(raw)
            cluster_id = tags.get(identity.TAG_CLUSTER, "")
            if not identity.is_cluster_id(cluster_id) or raw.get("status") in api.GONE:
                continue
            itype = raw.get("instance_type") or {}
            price = itype.get("price_cents_per_hour")
            found.append(Marked(
                provider=self.provider, kind="Lambda instance", id=str(raw["id"]),
                name=str(raw.get("name") or ""), cluster_id=cluster_id,
                owner=tags.get(identity.TAG_OWNER, ""), cluster_name=tags.get(identity.TAG_NAME, ""),
                status=str(raw.get("status")), where=str((raw.get("region") or {}).get("name", "")),
                hourly_usd=None if price is None else int(price) / 100,
                attrs={"type": str(itype.get("name", ""))}))
        return found

    def delete(self, items: list[Marked]) -> None:
        ids = [i.id for i in items]
        if not ids:
            return
        client = self.client()
        with contextlib.suppress(api.NotFound):  # already gone: the wait below confirms it
            client.terminate(ids)
        left: list[api.Instance] = []

        def all_gone() -> bool | None:
            left[:] = [i for i in client.instances() if i.id in ids and i.status not in api.GONE]
            return True if not left else None

        wait.until(all_gone, self.wait_s, max(client.limits.routine_interval, 0.05),
                   on_timeout=lambda: ProviderError("Lambda still lists " + ", ".join(
                       f"{i.name} ({i.id}, {i.status})" for i in left) + f" after {self.wait_s:g}s; "
                       "run `invoke sweep --delete` again"))
