"""Lambda's autodown action, run the way a head runs it (`python -m infra.node.autodown --config ...`)
against the fake API: the idle watcher terminates every instance carrying the cluster's id, workers
first and the head last, with the API key from its 0600 file; another cluster's instance and
untagged instances are untouched; the marker says the cluster removed itself.

The watcher here has no Ray to ask (its dashboard URL is a closed port), which it counts as idle:
what keeps a real cluster busy is proven with real Ray in tests/local/test_e2e_autodown.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from infra.node import identity
from infra.node.lambda_cloud import api
from tests.idle_watcher import run_idle_watcher
from tests.lambda_cloud.conftest import API_KEY, SCALE
from tests.lambda_cloud.fake_api import FakeLambda


def _launch(client: api.LambdaClient, name: str, tags: dict[str, str]) -> str:
    body = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10",
            "ssh_key_names": ["autodown-test"], "name": name,
            "tags": [{"key": k, "value": v} for k, v in tags.items()]}
    return str(client.request("POST", "/instance-operations/launch", body, launch=True)
               ["instance_ids"][0])


def test_idle_head_terminates_workers_then_itself(fake: FakeLambda, tmp_path: Path) -> None:
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(SCALE))
    client.add_ssh_key("autodown-test", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq6yJ7c0l3pB0vX1auto")
    ours, other = "0a0d0e01", "0be70002"

    def tags(cluster_id: str, node: str) -> dict[str, str]:
        return {identity.TAG_CLUSTER: cluster_id, identity.TAG_OWNER: "0123456789ab",
                identity.TAG_NAME: "idle", "rayfleet-node": node}

    head = _launch(client, "idle-head", tags(ours, "head"))
    for i in (1, 2):
        _launch(client, f"idle-worker-{i}", tags(ours, f"worker-{i}"))
    _launch(client, "busy-head", tags(other, "head"))

    key_file = tmp_path / "lambda-api-key"
    key_file.write_text(API_KEY)
    key_file.chmod(0o600)
    started = time.monotonic()
    done, config, marker = run_idle_watcher(
        tmp_path, ours, "infra.node.lambda_cloud.autodown:remove",
        {"api_key_file": str(key_file), "api_url": fake.url, "rate_scale": SCALE,
         "cluster_id": ours, "head_instance_id": head}, idle_minutes=0.02)
    took = time.monotonic() - started
    assert API_KEY not in config.read_text()
    print(f"watcher removed the cluster in {took:.1f}s (idle_minutes=0.02)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert API_KEY not in done.stdout + done.stderr
    log = done.stdout
    assert log.index("terminating 2 worker(s)") < log.index("terminating the head: idle-head")

    status = {i["name"]: i["status"] for i in fake.inventory()}
    assert all(status[n] in ("terminating", "terminated")
               for n in ("idle-head", "idle-worker-1", "idle-worker-2")), status
    assert status["busy-head"] == "active"
    assert all(s == "active" for n, s in status.items() if not n.startswith(("idle-", "busy-")))

    written = json.loads(marker.read_text())
    assert written["phase"] == "removed" and written["removed_at"]
    assert "Ray not answering" in written["detail"]
