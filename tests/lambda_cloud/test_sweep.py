"""`invoke sweep` against the fake Lambda API: a leaked instance of ours is found and removed, a
colleague's (another owner mark) is listed only on request and deleted only when named, an instance
of a cluster that has a state file here is not a leak, and one without rayfleet's tags is never
listed at all. Everything through `invoke`, asserted on the fake's inventory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from infra.core.state import State
from infra.node import identity
from infra.node.lambda_cloud import api
from tests.forked_cli import run_invoke
from tests.lambda_cloud.conftest import API_KEY, SCALE
from tests.lambda_cloud.fake_api import FakeLambda
from tests.waiting import wait_until

ME = "alice@laptop"
COLLEAGUE = "bob@workstation"


def _mark(who: str) -> str:
    # identity.owner_mark() of RAYFLEET_OWNER=who (its documented rule: sha256, 12 hex).
    return hashlib.sha256(who.encode()).hexdigest()[:12]


def _launch(client: api.LambdaClient, name: str, tags: dict[str, str]) -> str:
    body = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10",
            "ssh_key_names": ["sweep-test"], "name": name,
            "tags": [{"key": k, "value": v} for k, v in tags.items()]}
    data = client.request("POST", "/instance-operations/launch", body, launch=True)
    return str(data["instance_ids"][0])


def _status(fake: FakeLambda) -> dict[str, str]:
    return {i["name"]: i["status"] for i in fake.inventory()}


def test_sweep_finds_and_deletes_only_our_leaks(fake: FakeLambda, rf_home: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFLEET_OWNER", ME)
    # No specs here: the sweep must not wander into the repository's example GCP spec.
    monkeypatch.setenv("RAYFLEET_CLUSTERS", str(tmp_path / "no-specs"))
    assert identity.owner_mark() == _mark(ME)
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(SCALE))
    client.add_ssh_key("sweep-test", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq6yJ7c0l3pB0vX1sweep")

    leaked_id, colleague_id, kept_id = "1eaced01", "c011ea90", "57a7ef11"
    leaked = _launch(client, "leaky-head", {identity.TAG_CLUSTER: leaked_id,
                                            identity.TAG_OWNER: _mark(ME),
                                            identity.TAG_NAME: "leaky"})
    _launch(client, "theirs-head", {identity.TAG_CLUSTER: colleague_id,
                                    identity.TAG_OWNER: _mark(COLLEAGUE),
                                    identity.TAG_NAME: "theirs"})
    _launch(client, "kept-head", {identity.TAG_CLUSTER: kept_id, identity.TAG_OWNER: _mark(ME),
                                  identity.TAG_NAME: "kept"})
    # An instance of ours whose cluster has a state file here: teardown's business, not a leak.
    # (with the id the instance was launched with)
    kept_state = State.new(rf_home / "state" / "kept.json", "kept", "lambda", cluster_id=kept_id)
    kept_state.save()
    wait_until(lambda: "booting" not in _status(fake).values(), "every instance to boot",
               timeout=30, interval=0.05)
    before = _status(fake)

    listed = run_invoke("sweep", "--json")
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)["resources"]
    assert [(r["name"], r["id"], r["yours"], r["cluster_id"]) for r in found] == [
        ("leaky-head", leaked, True, leaked_id)]
    assert found[0]["hourly_usd"] == 0.75  # the fake's gpu_1x_a10 price, from the API
    table = run_invoke("sweep", env={"COLUMNS": "200"})
    assert table.returncode == 0 and "leaky-head" in table.stdout and "prod-db" not in table.stdout
    assert "theirs-head" not in table.stdout and "kept-head" not in table.stdout

    everyone = json.loads(run_invoke("sweep", "--all-owners", "--json").stdout)["resources"]
    assert sorted((r["name"], r["yours"]) for r in everyone) == [
        ("leaky-head", True), ("theirs-head", False)]
    names = {i["name"] for i in fake.inventory()}
    assert {"prod-db", "lt-headless"} <= names, "the fake's foreign instances are there"

    unconfirmed = run_invoke("sweep", "--delete")  # no terminal, no --yes: nothing happens
    assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr
    assert _status(fake) == before

    deleted = run_invoke("sweep", "--delete", "--yes", "--all-owners")
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted 1 resource(s): leaky-head (lambda)" in deleted.stdout
    after = _status(fake)
    assert after["leaky-head"] == "terminated"
    assert {n: s for n, s in after.items() if n != "leaky-head"} == {
        n: s for n, s in before.items() if n != "leaky-head"}, "only the leak may change"
    assert after["theirs-head"] != "terminated" and after["kept-head"] != "terminated"

    again = json.loads(run_invoke("sweep", "--json").stdout)
    assert again["resources"] == []

    # A colleague's instance goes only when named explicitly.
    named = run_invoke("sweep", "--delete", "--yes", "--all-owners", "--only", "theirs-head")
    assert named.returncode == 0, named.stderr
    assert _status(fake)["theirs-head"] == "terminated"
    assert _status(fake)["kept-head"] != "terminated"
    assert all(s == "active" for n, s in _status(fake).items()
               if n not in ("leaky-head", "theirs-head", "kept-head"))
