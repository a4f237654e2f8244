"""Provisioning against the fake Lambda API under faults; each test checks the fake's inventory.

Successful scenarios call the provider's `provision` (launch, wait active, SSH) in-process and
then the real `teardown` command: `ray up` is exercised by the test-bed test, never against the
loopback sshd. Failing `up`s run as `invoke up` processes, as a user would run them, forked from
the CLI zygote (tests/forked_cli.py: none of them starts Ray, and a fresh interpreter's imports
cost ~0.4 s of CPU each); the one about a killed `up` is a fresh process.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import providers
from infra.cli import commands
from infra.cli.loading import load_spec
from infra.core import state
from tests.conftest import ROOT
from tests.forked_cli import run_invoke
from tests.lambda_cloud.conftest import API_KEY, SpecFactory, assert_clean, ours, read_state
from tests.lambda_cloud.fake_api import FakeLambda, Fault
from tests.waiting import wait_until

LAUNCH = "/instance-operations/launch"


def provision(path: Path) -> dict[str, Any]:
    spec = load_spec(path)
    with state.locked(spec.name, spec.provider, "up") as current:
        nodes = providers.create(spec).provision(current)  # type: ignore[attr-defined]
    return dict(nodes)


def teardown(path: Path) -> None:
    commands.teardown(None, str(path))


def assert_one_each(fake: FakeLambda, names: list[str], region: str | None = None) -> None:
    """One running instance of ours per slot key (`head`, `worker-1`...)."""
    running = [i for i in ours(fake) if i["status"] != "terminated"]
    assert sorted(i["tags"]["rayfleet-node"] for i in running) == sorted(names), running
    if region:
        assert {i["region"] for i in running} == {region}


def assert_state_matches(home: Path, fake: FakeLambda) -> None:
    data = read_state(home)
    assert data is not None
    in_state = {r["id"] for r in data["resources"] if r["kind"] == "lambda-instance"}
    running = {i["id"] for i in ours(fake) if i["status"] != "terminated"}
    assert in_state == running


def test_happy_path_then_teardown_leaves_nothing(fake: FakeLambda, make_spec: SpecFactory,
                                                 rf_home: Path) -> None:
    path = make_spec()
    nodes = provision(path)
    assert sorted(nodes) == ["head", "worker-1", "worker-2"]
    assert all(n.status == "active" and n.ip for n in nodes.values())
    assert_one_each(fake, list(nodes), "us-east-1")
    assert_state_matches(rf_home, fake)
    launches = [t for t, s in fake.requests("POST", LAUNCH) if s == 200]
    gaps = [b - a for a, b in itertools.pairwise(launches)]
    assert len(launches) == 3 and min(gaps) >= fake.launches.interval * 0.99, gaps
    data = read_state(rf_home)
    assert data is not None
    cid = data["cluster_id"]
    assert [k["name"][:20] for k in fake.ssh_keys.values()] == [f"rayfleet-lt-{cid}-"[:20]]
    # Every instance carries the cluster id, owner mark, name and node as launch tags, its name
    # carries the id, and the cluster's own ruleset (SSH only) is attached at every launch.
    ours_now = ours(fake)
    ruleset = [r for r in fake.firewall_rulesets.values() if r["name"] == f"rayfleet-lt-{cid}"]
    assert len(ruleset) == 1 and ruleset[0]["region"] == "us-east-1"
    assert [(r["protocol"], r["port_range"], r["source_network"]) for r in ruleset[0]["rules"]] \
        == [("tcp", [22, 22], "0.0.0.0/0")]
    for inst in ours_now:
        assert inst["tags"]["rayfleet-cluster"] == cid and inst["tags"]["rayfleet-owner"] == data["owner"]
        assert inst["tags"]["rayfleet-name"] == "lt" and inst["name"].startswith(f"lt-{cid}-")
        assert inst["firewall_rulesets"] == [ruleset[0]["id"]]
    # A second provision is a no-op: same instances, no launch.
    again = provision(path)
    assert {n.id for n in again.values()} == {n.id for n in nodes.values()}
    assert len([s for _, s in fake.requests("POST", LAUNCH) if s == 200]) == 3
    teardown(path)
    assert_clean(fake)
    assert fake.ssh_keys == {}
    assert read_state(rf_home) is None
    assert not (rf_home / "keys" / "lt").exists()


def test_capacity_only_in_second_choice(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    fake.capacity = {("gpu_1x_a10", "us-west-1"): 1, ("cpu_4x_general", "us-west-1"): 5}
    path = make_spec()
    nodes = provision(path)
    assert nodes["head"].region == "us-west-1"
    # a10 in us-west-1 ran out with the head; the workers fell back to the third worker choice.
    assert {nodes[n].type_name for n in ("worker-1", "worker-2")} == {"cpu_4x_general"}
    assert_one_each(fake, ["head", "worker-1", "worker-2"], "us-west-1")
    assert_state_matches(rf_home, fake)
    teardown(path)
    assert_clean(fake)


def test_capacity_vanishing_between_check_and_launch(fake: FakeLambda, make_spec: SpecFactory,
                                                     rf_home: Path) -> None:
    def take_us_east(f: FakeLambda) -> None:
        f.capacity[("gpu_1x_a10", "us-east-1")] = 0
        f.after_instance_types = None

    fake.after_instance_types = take_us_east
    path = make_spec()
    nodes = provision(path)
    refused = [s for _, s in fake.requests("POST", LAUNCH) if s == 400]
    assert refused == [400], "the first launch should have been refused for capacity"
    assert {n.region for n in nodes.values()} == {"us-west-1"}
    assert_one_each(fake, ["head", "worker-1", "worker-2"], "us-west-1")
    teardown(path)
    assert_clean(fake)


def test_429_storm(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    fake.inject(Fault("GET", "/.*", status=429, times=12),
                Fault("POST", LAUNCH, status=429, times=4, retry_after="0.05"),
                Fault("POST", "/instance-operations/terminate", status=429, times=3))
    path = make_spec()
    provision(path)
    assert len([s for _, s in fake.requests() if s == 429]) >= 16
    assert_one_each(fake, ["head", "worker-1", "worker-2"])
    assert_state_matches(rf_home, fake)
    teardown(path)
    assert fake.faults == [], "every injected 429 was served (and survived)"
    assert_clean(fake)


def test_500s_are_retried_but_launches_reconciled(fake: FakeLambda, make_spec: SpecFactory,
                                                  rf_home: Path) -> None:
    fake.inject(Fault("GET", "/instances", status=500, times=3),
                Fault("GET", "/instance-types", status=502, times=2),  # HTML from a proxy
                Fault("POST", LAUNCH, status=500, times=1, skip=1),  # worker-1: refused, not made
                Fault("POST", "/instance-operations/terminate", status=503, times=1))
    path = make_spec()
    provision(path)
    assert_one_each(fake, ["head", "worker-1", "worker-2"])
    assert_state_matches(rf_home, fake)
    teardown(path)
    assert_clean(fake)


def test_lost_launch_response_is_adopted_not_duplicated(fake: FakeLambda, make_spec: SpecFactory,
                                                        rf_home: Path) -> None:
    fake.inject(Fault("POST", LAUNCH, drop=True, times=1, skip=1))  # worker-1 made, answer lost
    path = make_spec()
    nodes = provision(path)
    assert_one_each(fake, ["head", "worker-1", "worker-2"])
    dropped = [s for _, s in fake.requests("POST", LAUNCH) if s == 0]
    assert dropped == [0]
    assert len(ours(fake)) == 3, "a lost launch must not be launched twice"
    assert nodes["worker-1"].id in {i["id"] for i in ours(fake)}
    assert_state_matches(rf_home, fake)
    teardown(path)
    assert_clean(fake)


def _rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """The provider's rows in `invoke status --json` (the key was renamed once)."""
    return list(report.get("provider_resources", report.get("resources", [])))


def _invoke(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_invoke(*args, env=env, timeout=120)


def test_unhealthy_instance_fails_up_and_cleans_up(fake: FakeLambda, make_spec: SpecFactory,
                                                   rf_home: Path) -> None:
    fake.boot_outcomes["lt-.*-worker-1"] = "unhealthy"
    path = make_spec()
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and re.search(r"lt-[0-9a-f]{8}-worker-1 ", last) \
        and "unhealthy" in last, last
    assert "Traceback" not in result.stderr
    assert_clean(fake)  # this run's instances were terminated
    data = read_state(rf_home)
    assert data is not None and not [r for r in data["resources"] if r["kind"] == "lambda-instance"]
    result = _invoke("teardown", "--cluster", str(path))
    assert result.returncode == 0, result.stderr
    assert fake.ssh_keys == {} and read_state(rf_home) is None


def test_keep_partial_keeps_instances_for_teardown(fake: FakeLambda, make_spec: SpecFactory,
                                                   rf_home: Path) -> None:
    fake.boot_outcomes["lt-.*-worker-2"] = "unhealthy"
    path = make_spec()
    result = _invoke("up", "--cluster", str(path), "--keep-partial")
    assert result.returncode == 1 and re.search(r"lt-[0-9a-f]{8}-worker-2", result.stderr)
    assert len([i for i in ours(fake) if i["status"] != "terminated"]) == 3
    assert_state_matches(rf_home, fake)
    status = _invoke("status", "--cluster", str(path), "--json")
    assert status.returncode == 0, status.stderr
    rows = _rows(json.loads(status.stdout))
    assert {r["state"] for r in rows} == {"active", "unhealthy"} and all(r["$/h"] == "$0.75" for r in rows)
    result = _invoke("teardown", "--cluster", str(path))
    assert result.returncode == 0, result.stderr
    assert_clean(fake)
    assert read_state(rf_home) is None


def test_no_capacity_anywhere_is_one_line_and_creates_nothing(fake: FakeLambda, make_spec: SpecFactory,
                                                               rf_home: Path) -> None:
    # Heads would fit, but no worker choice has capacity in their region: launch nothing.
    fake.capacity = {("gpu_1x_a10", "us-east-1"): 3, ("gpu_1x_a10", "us-west-1"): 3}
    path = make_spec(workers={"count": 1, "choices": [
        {"instance_type": "cpu_4x_general", "region": "us-west-1"}]})
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"error: no capacity for lt-[0-9a-f]{8}-head:", last), last
    assert "gpu_1x_a10@us-east-1: no worker choice with capacity in us-east-1" in last, last
    assert "gpu_1x_a10@us-west-1: no worker choice with capacity in us-west-1" in last, last
    fake.capacity = {}
    last = _invoke("up", "--cluster", str(path)).stderr.strip().splitlines()[-1]
    assert "gpu_1x_a10@us-east-1: no capacity listed; gpu_1x_a10@us-west-1: no capacity listed" in last
    assert ours(fake) == [] and not fake.requests("POST", LAUNCH)
    _invoke("teardown", "--cluster", str(path))
    assert fake.ssh_keys == {}


def test_workers_running_out_after_the_head_terminates_the_head(fake: FakeLambda,
                                                                make_spec: SpecFactory,
                                                                rf_home: Path) -> None:
    fake.capacity = {("gpu_1x_a10", "us-east-1"): 2}  # head + one worker, not two workers
    path = make_spec()
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1
    assert re.search(r"no capacity for lt-[0-9a-f]{8}-worker-2 in us-east-1", result.stderr)
    assert re.search(r"terminating what this run created: lt-([0-9a-f]{8})-head, lt-\1-worker-1",
                     result.stderr), result.stderr
    assert_clean(fake)
    assert_state_matches(rf_home, fake)


def test_quota_exceeded(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    fake.quota = len(fake.inventory()) + 1
    path = make_spec()
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1
    assert "global/quota-exceeded" in result.stderr.strip().splitlines()[-1]
    assert_clean(fake)


def test_teardown_when_instances_are_already_gone(fake: FakeLambda, make_spec: SpecFactory,
                                                  rf_home: Path) -> None:
    path = make_spec()
    nodes = provision(path)
    with fake.lock:  # terminated in the console long ago: the API answers 404 for it now
        head = fake.instances[nodes["head"].id]
        head.forced, head.forced_at = "terminated", time.monotonic() - 60
        worker = fake.instances[nodes["worker-1"].id]
        worker.forced, worker.forced_at = "terminated", time.monotonic()  # still listed
    assert fake.status_of(head.id) == "terminated"
    teardown(path)
    assert_clean(fake)
    assert read_state(rf_home) is None


def test_orphans_are_flagged_then_terminated_and_similar_names_untouched(
        fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    path = make_spec()
    nodes = provision(path)
    # Forget worker-2 as if the process died between the API's answer and the state write.
    spec = load_spec(path)
    with state.locked("lt", "lambda", "test") as current:
        current.remove("lambda-instance", nodes["worker-2"].id)
    status = _invoke("status", "--cluster", str(path), "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    data = read_state(rf_home)
    assert data is not None
    worker2 = f"lt-{data['cluster_id']}-worker-2"
    assert any(f"orphan {worker2}" in w for w in report["warnings"]), report["warnings"]
    assert [r["instance"] for r in _rows(report) if "ORPHAN" in r["state"]] == [worker2]
    # The colleague's cluster of the same name is mentioned, never claimed.
    assert any(w.startswith("lt-head (") and "not ours" in w for w in report["warnings"])
    assert spec.name == "lt"
    teardown(path)
    assert_clean(fake)  # includes: lt-headless, ltx-head, lt-head-old, lt-worker-1b untouched


def test_kill_9_between_launches_then_teardown(fake: FakeLambda, make_spec: SpecFactory,
                                               rf_home: Path) -> None:
    # Slow launches down (0.4 s apart) so the kill lands between the first and the second.
    fake.launches.interval = 0.4
    path = make_spec()
    env = {**os.environ, "LAMBDA_RATE_SCALE": str(0.4 / 12)}
    process = subprocess.Popen([sys.executable, "-m", "invoke", "up", "--cluster", str(path)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def launched() -> bool:
        assert process.poll() is None, "up ended before launching"
        return any(s == 200 for _, s in fake.requests("POST", LAUNCH))

    wait_until(launched, "up's first launch", timeout=60, interval=0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len([s for _, s in fake.requests("POST", LAUNCH) if s == 200]) == 1
    data = read_state(rf_home)  # valid JSON whenever the kill landed
    assert data is None or isinstance(data["resources"], list)
    assert len(ours(fake)) == 1
    result = _invoke("teardown", "--cluster", str(path))
    assert result.returncode == 0, result.stderr
    assert_clean(fake)
    assert read_state(rf_home) is None and fake.ssh_keys == {}


def test_api_key_never_leaks(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    fake.boot_outcomes["lt-.*-worker-1"] = "unhealthy"
    path = make_spec()
    outputs = [_invoke("plan", "--cluster", str(path)), _invoke("up", "--cluster", str(path)),
               _invoke("status", "--cluster", str(path)), _invoke("teardown", "--cluster", str(path)),
               _invoke("up", "--cluster", str(path), LAMBDA_API_KEY="secret_wrong_key_987")]
    for result in outputs:
        assert API_KEY not in result.stdout + result.stderr
        assert "secret_wrong_key_987" not in result.stdout + result.stderr
    assert "global/invalid-api-key" in outputs[-1].stderr
    for file in rf_home.rglob("*"):
        if file.is_file():
            assert API_KEY.encode() not in file.read_bytes(), file
    assert_clean(fake)


@pytest.mark.parametrize("with_key", [False, True])
def test_plan_with_and_without_a_key(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path,
                                     tmp_path: Path, with_key: bool) -> None:
    path = make_spec()
    env = {"HOME": str(tmp_path), "COLUMNS": "200"}
    if not with_key:
        env["LAMBDA_API_KEY"] = ""
    result = _invoke("plan", "--cluster", str(path), **env)
    assert result.returncode == (0 if with_key else 1), result.stderr
    assert "Traceback" not in result.stderr
    if with_key:
        assert "assigned-at-first-up" in result.stdout and "$0.75/h (capacity now)" in result.stdout
        assert "estimated cost: $2.25/h for 3 instance(s)" in result.stdout
    else:
        # The plan is still shown; the missing key fails it (`up` could not start), with the fix.
        problems = [line for line in result.stderr.splitlines()
                    if "capacity and prices unknown" in line]
        assert len(problems) == 1 and "no Lambda API key" in problems[0]
        assert "lt-assigned-at-first-up-head" in result.stdout
        assert result.stderr.strip().splitlines()[-1].startswith("error: 1 pre-flight check")
    assert fake.requests("POST") == []  # plan creates nothing


def test_file_system_fixes_the_region(fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    path = make_spec(file_system="datasets")
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1
    assert "file_system: no file system named 'datasets' in the account" in result.stderr
    assert ours(fake) == []
    fake.add_file_system("datasets", "us-west-1")
    nodes = provision(path)
    assert {n.region for n in nodes.values()} == {"us-west-1"}  # although us-east-1 comes first
    assert all(fake.instances[n.id].file_system_names == ["datasets"] for n in nodes.values())
    teardown(path)
    assert_clean(fake)


def test_state_from_before_cluster_ids_keeps_working(fake: FakeLambda, make_spec: SpecFactory,
                                                     rf_home: Path) -> None:
    """An old state (no cluster id, instances named `lt-head`, no tags) still owns its instances
    by id; the colleague's `lt-head` (same name, another id) is left alone."""
    from infra.node.lambda_cloud import api as lambda_api

    path = make_spec()
    client = lambda_api.LambdaClient(API_KEY, fake.url, lambda_api.Limits.scaled(0.01))
    client.add_ssh_key("old-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldOldOld old")
    old_id = client.launch(region="us-east-1", instance_type="gpu_1x_a10", ssh_key_name="old-key",
                           name="lt-head")
    (rf_home / "state").mkdir(parents=True, exist_ok=True)
    (rf_home / "state" / "lt.json").write_text(json.dumps({
        "version": 1, "cluster": "lt", "provider": "lambda", "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:00:00+00:00", "info": {},
        "resources": [{"kind": "lambda-instance", "id": old_id,
                       "attrs": {"name": "lt-head", "role": "head", "run": "old",
                                 "instance_type": "gpu_1x_a10", "region": "us-east-1",
                                 "price_cents_per_hour": 75, "launched_at": None}}]}))
    status = _invoke("status", "--cluster", str(path), "--json")
    rows = _rows(json.loads(status.stdout))
    assert [r["id"] for r in rows] == [old_id[:12]], rows
    result = _invoke("teardown", "--cluster", str(path))
    assert result.returncode == 0, result.stderr
    assert fake.status_of(old_id) == "terminated"
    assert_clean(fake, tagged=False)  # the colleague's lt-head and lt-worker-1 are untouched
    assert read_state(rf_home) is None


def test_cost_range_and_launch_read_the_plan_alone(fake: FakeLambda, make_spec: SpecFactory,
                                                   rf_home: Path) -> None:
    path = make_spec()
    loaded = load_spec(path)
    plan = providers.create(loaded).plan(None)
    listed = len(fake.requests("GET", "/instance-types"))
    assert listed == 1
    fresh = providers.create(loaded)  # never planned: what `plan` found comes in the plan
    cost = fresh.cost_range(plan)
    assert cost is not None and (cost.min_nodes, cost.max_nodes) == (3, 3)
    assert cost.min_hourly_usd == cost.max_hourly_usd == pytest.approx(2.25)
    assert fresh.cost_range(None) is None  # no plan, no prices: nothing is remembered
    assert len(fake.requests("GET", "/instance-types")) == listed  # cost_range asked nothing
    # The plan's listing, while fresh, is what the first launch goes by.
    assert plan.extra.fresh(3600) is plan.extra.types and plan.extra.fresh(0) is None
    # The sharing gateway's prices: a fixed-size cluster runs no autoscaler, its price is fixed.
    prices = cost.node_prices
    assert prices is not None and dict(prices.by_type) == {}
    assert prices.floor_usd == pytest.approx(2.25) and fresh.cost_range(None) is None
    scaling_path = make_spec("lts", worker_types={"gpu": {
        "choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}],
        "min_workers": 0, "max_workers": 2}})
    data = yaml.safe_load(scaling_path.read_text())
    del data["workers"]  # worker_types instead: an autoscaling cluster
    scaling_path.write_text(yaml.safe_dump(data))
    scaling = load_spec(scaling_path)
    scaled = providers.create(scaling).cost_range(providers.create(scaling).plan(None))
    prices = scaled.node_prices if scaled else None
    assert prices is not None and prices.head_type == "head"
    assert dict(prices.by_type) == {"head": pytest.approx(0.75), "gpu": pytest.approx(0.75)}


def test_a_lookalike_is_named_once_per_command(capfd: pytest.CaptureFixture[str]) -> None:
    """teardown lists the account at each step and poll: a colleague's instance named like the
    cluster was reported ten times in one teardown; once says it."""
    from infra.node.lambda_cloud import api
    from infra.providers.lambda_cloud import fleet

    theirs = api.Instance("i-colleague-1", "lt-head", "active", "198.51.100.7", None,
                          "gpu_1x_a10", "us-east-1", 75)
    other = api.Instance("i-colleague-2", "lt-worker-1", "active", "198.51.100.8", None,
                         "gpu_1x_a10", "us-east-1", 75)
    for _ in range(3):
        fleet.mention_lookalikes([theirs])
    fleet.mention_lookalikes([theirs, other])
    said = capfd.readouterr().err
    assert said.count("lt-head (i-colleague-1) is named like this cluster") == 1, said
    assert said.count("lt-worker-1 (i-colleague-2) is named like this cluster") == 1, said
