"""The gcp-tpu provider's verbs against the fake Google APIs, a fake `ray` CLI, and a real sshd on
loopback playing the head (so tunnels, `connect` and the dashboard check are real).

Everything up to the moment `ray up` runs is checked exactly (command, environment, validated
YAML); teardown's API-side cleanup runs for real against the fake; state stays consistent in
every error case.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from infra import providers
from infra.cli import loading
from infra.core import node_start, paths, state
from infra.core.errors import ClusterNotRunningError
from infra.node import where
from infra.node.gcp_tpu.api import ApiOptions, GcpCredentialsError, GcpError, GcpQuotaError
from infra.providers.base import UpOptions
from infra.providers.gcp_tpu import config
from infra.providers.gcp_tpu.provider import Provider
from infra.providers.gcp_tpu.records import Cluster, Firewall, SshKey
from tests.gcp_tpu.conftest import ZONE, Dashboard, FakeRay, Sshd, assert_nothing_created, write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp, rate_limited
from tests.gcp_tpu.test_google_errors import ERRORS

pytestmark = pytest.mark.slow  # a real sshd per test


class Lab:
    """One cluster under test: its spec, provider, fake `ray`, and helpers to run the verbs."""

    def __init__(self, tmp_path: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
                 board: Dashboard, name: str = "lab", **changes: Any) -> None:
        changes.setdefault("dashboard", {"port": board.port})
        self.path = write_spec(tmp_path, name=name, **changes)
        self.spec = loading.load_spec(self.path)
        self.fake = fake
        self.ray = FakeRay(fake, sshd)
        self.provider = self.make_provider(options, sshd.port)
        self.name = name

    def make_provider(self, options: ApiOptions, ssh_port: int) -> Provider:
        made = providers.spec_class("gcp-tpu")  # the registry resolves to this package
        assert made is type(self.spec)
        return Provider(self.spec, ray=self.ray, api_options=options, ssh_port=ssh_port,  # type: ignore[arg-type]
                        head_monitor=self.ray.start_monitor)

    def up(self, keep_partial: bool = False) -> Any:
        with state.locked(self.name, "gcp-tpu", "up") as current:
            plan = self.provider.plan(current)
            return self.provider.up(current, plan, UpOptions(keep_partial=keep_partial))

    def teardown(self) -> None:
        with state.locked(self.name, "gcp-tpu", "teardown") as current:
            self.provider.teardown(current)
            current.delete()

    def state(self) -> state.State:
        found = state.read(self.name)
        assert found is not None
        return found

    def kinds(self) -> list[str]:
        found = state.read(self.name)
        return sorted(r.kind for r in found.resources()) if found else []

    def left(self) -> list[str]:
        return sorted(self.fake.nodes_with({"rayfleet-name": self.name}))


@pytest.fixture
def lab(tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard, key_file: Path) -> Iterator[Lab]:
    yield Lab(tmp_path, fake, options, sshd, dashboard)


def test_up_runs_ray_up_with_a_validated_config_and_records_the_head(
        lab: Lab, key_file: Path, dashboard: Dashboard, rf_home: Path) -> None:
    endpoint = lab.up()
    assert len(lab.ray.calls) == 1
    call = lab.ray.calls[0]
    config_path = rf_home / "gcp-tpu" / "lab" / config.FILE_NAME
    assert call["args"] == [where.ray_executable(), "up", "-y", "--no-config-cache",
                            "--log-style=record", "--log-color=false", str(config_path)]
    assert call["env"]["RAY_USAGE_STATS_ENABLED"] == "0"
    assert call["env"]["GOOGLE_APPLICATION_CREDENTIALS"] == str(key_file)
    # What ray got is what Ray's own checks accept, with this cluster's real key in it.
    prepared = config.check_with_ray(call["config"], "sent to ray up")
    keys = paths.keys_dir("lab")
    public = (keys / "id_ed25519.pub").read_text().strip()
    head = prepared["available_node_types"]["head"]["node_config"]
    assert head["metadata"]["items"][0]["value"] == f"root:{public}"
    assert prepared["auth"]["ssh_private_key"] == str(keys / "id_ed25519")
    assert stat.S_IMODE((keys / "id_ed25519").stat().st_mode) == 0o600
    key_text = (keys / "id_ed25519").read_text()
    assert key_text.strip().splitlines()[1] not in call["config"]
    assert key_file.read_text() not in call["config"]
    # The applied copy (for `plan`'s diff) is the file ray got.
    assert (paths.rendered_dir("lab") / config.FILE_NAME).read_text() == call["config"]
    current = lab.state()
    cluster = current.find(Cluster, "lab")
    assert cluster is not None and cluster.attrs.head_ip == "127.0.0.1"
    assert cluster.attrs.head_internal_ip == "10.128.0.2"
    assert current.info.address == "10.128.0.2:6379"
    assert current.info.dashboard_access == "SSH tunnel only"
    assert endpoint.address == "10.128.0.2:6379" and not endpoint.tunneled
    assert "/api/jobs/" in dashboard.hits  # answered through a real SSH tunnel
    state_text = current.path.read_text()
    assert "PRIVATE KEY" not in state_text and key_text not in state_text


def test_second_up_reports_the_running_cluster(lab: Lab) -> None:
    lab.up()
    lab.up()
    assert len(lab.ray.calls) == 1  # same config, head running, dashboard answering
    # Ray's autoscaler: replaced after the `ray up`, then only started again if none runs.
    assert lab.ray.monitors == [True, False]


def test_connect_gives_each_cluster_its_own_local_port(
        lab: Lab, tmp_path: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard) -> None:
    (tmp_path / "b").mkdir()
    other = Lab(tmp_path / "b", fake, options, sshd, dashboard, name="lab2")
    lab.up()
    other.up()
    with lab.provider.connect(lab.state()) as first, other.provider.connect(other.state()) as second:
        assert first.tunneled and second.tunneled
        assert first.dashboard_url != second.dashboard_url
        for endpoint in (first, second):
            assert requests.get(f"{endpoint.dashboard_url}/api/jobs/", timeout=5).json() == []
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{first.dashboard_url}/api/jobs/", timeout=2)  # closed with the block
    other.teardown()


def test_teardown_sweeps_workers_ray_down_missed(lab: Lab, fake: FakeGcp) -> None:
    lab.up()
    recorded = lab.state()
    ours = {**config.node_labels(lab.spec, recorded.cluster_id, recorded.owner),  # type: ignore[arg-type]
            "ray-cluster-name": "lab"}
    # What the autoscaler added later, including a preempted VM that only stopped.
    fake.add_instance(ZONE, "ray-lab-worker-5e5e5e5e-compute", {**ours, "ray-node-type": "worker"})
    fake.add_instance(ZONE, "ray-lab-worker-6f6f6f6f-compute", {**ours, "ray-node-type": "worker"},
                      status="TERMINATED")
    fake.add_tpu_node(ZONE, "ray-lab-worker-7a7a7a7a-tpu", "v4-16", ours, hosts=2,
                      state="PREEMPTED")
    # Not ours: another cluster, and a VM that merely shares Ray's name label.
    fake.add_instance(ZONE, "someone-else", {"rayfleet-cluster": "other", "ray-cluster-name": "other"})
    fake.add_instance(ZONE, "same-ray-name", {"ray-cluster-name": "lab"})
    fake.op_polls = 3
    assert len(lab.left()) > 3
    lab.teardown()
    assert lab.left() == []
    assert [c["args"][1] for c in lab.ray.calls] == ["up", "down"]
    assert {i["name"] for i in fake.instances.values()} == {"someone-else", "same-ray-name"}
    assert state.read("lab") is None
    assert not paths.keys_dir("lab").exists()
    lab.teardown()  # safe twice


def test_dashboard_firewall_rule_lifecycle(tmp_path: Path, rf_home: Path, fake: FakeGcp,
                                           options: ApiOptions, sshd: Sshd, dashboard: Dashboard,
                                           key_file: Path) -> None:
    ranges = ["198.51.100.0/24"]
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ranges})
    endpoint = lab.up()
    rule = fake.firewalls["rayfleet-lab-dashboard"]
    assert rule["sourceRanges"] == ranges and rule["direction"] == "INGRESS"
    assert rule["targetTags"] == ["rayfleet-lab-head"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": [str(dashboard.port)]}]
    assert lab.state().find(Firewall, "rayfleet-lab-dashboard").attrs.ranges == ranges
    assert endpoint.dashboard_url == f"http://127.0.0.1:{dashboard.port}"
    # The head's Ray flags are in node.conf, staged beside the config sent to `ray up`.
    staged = paths.rendered_dir("lab") / node_start.STAGED / node_start.CONF_NAME
    assert "--dashboard-host=0.0.0.0" in staged.read_text()
    # Changed ranges: the same rule is updated, not a second one made.
    lab2 = Lab(tmp_path, fake, options, sshd, dashboard, dashboard={
        "port": dashboard.port, "allowed_source_ranges": ["203.0.113.0/24", "198.51.100.0/24"]})
    lab2.up()
    assert list(fake.firewalls) == ["rayfleet-lab-dashboard"]
    assert fake.firewalls["rayfleet-lab-dashboard"]["sourceRanges"] == ["203.0.113.0/24",
                                                                        "198.51.100.0/24"]
    assert len(fake.calls("PATCH", "/global/firewalls/rayfleet-lab-dashboard")) == 1
    lab2.teardown()
    assert fake.firewalls == {} and lab2.left() == [] and state.read("lab") is None


def test_removing_the_ranges_removes_the_rule_at_the_next_up(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard, key_file: Path) -> None:
    Lab(tmp_path, fake, options, sshd, dashboard,
        dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]}).up()
    closed = Lab(tmp_path, fake, options, sshd, dashboard)
    closed.up()
    assert fake.firewalls == {} and closed.state().resources(Firewall) == []
    closed.teardown()


def test_failed_ray_up_is_one_line_and_cleaned_up(tmp_path: Path, rf_home: Path, fake: FakeGcp,
                                                  options: ApiOptions, sshd: Sshd,
                                                  dashboard: Dashboard, key_file: Path) -> None:
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]})
    lab.ray.up_failure = ("googleapiclient.errors.HttpError: <HttpError 403 when requesting "
                          "https://compute.googleapis.com/compute/v1/projects/test-project/zones/"
                          "us-central2-b/instances returned \"Quota 'N2_CPUS' exceeded.  Limit: "
                          "0.0 in region us-central2.\">")
    with pytest.raises(GcpQuotaError) as caught:
        lab.up()
    message = str(caught.value)
    assert "`ray up` failed" in message and "Quota 'N2_CPUS' exceeded" in message
    assert "ray-up.log" in message and "\n" not in message
    assert lab.left() == [] and fake.firewalls == {}
    assert lab.kinds() == []  # nothing left to pay for, nothing left in state


def test_keep_partial_keeps_everything_in_state_for_teardown(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard, key_file: Path) -> None:
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]})
    lab.ray.up_failure = "ZONE_RESOURCE_POOL_EXHAUSTED: The zone does not have enough resources"
    with pytest.raises(GcpError, match="no capacity for it now; try another zone"):
        lab.up(keep_partial=True)
    assert lab.kinds() == sorted([Cluster.KIND, Firewall.KIND, SshKey.KIND])
    assert lab.left() == ["ray-lab-head-0a1b2c3d-compute"]
    lab.teardown()
    assert lab.left() == [] and fake.firewalls == {} and state.read("lab") is None


def test_preflight_failure_creates_nothing(lab: Lab, fake: FakeGcp, rf_home: Path) -> None:
    fake.disabled.add("tpu")
    with pytest.raises(GcpError, match="Cloud TPU API is not enabled"):
        lab.up()
    assert lab.ray.calls == [] and lab.kinds() == []
    assert_nothing_created(rf_home, "lab")
    assert not paths.keys_dir("lab").exists()
    assert [r for r in fake.requests if r["method"] != "GET"] == []


def test_up_without_credentials_creates_nothing(lab: Lab, fake: FakeGcp, rf_home: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(GcpCredentialsError, match="no Google credentials found"):
        lab.up()
    assert fake.requests == [] and lab.ray.calls == []
    assert_nothing_created(rf_home, "lab")


def test_teardown_that_cannot_finish_keeps_state_then_finishes(lab: Lab, fake: FakeGcp) -> None:
    lab.up()
    fake.fail("DELETE", "/nodes/", 429, rate_limited("tpu"), times=100)
    with pytest.raises(GcpError, match="rate limit"):
        lab.teardown()
    assert Cluster.KIND in lab.kinds()  # the TPU is still there, so the state still says so
    assert any(n.endswith("-tpu") for n in lab.left())
    fake.failures.clear()
    lab.teardown()
    assert lab.left() == [] and state.read("lab") is None


def test_status_lists_nodes_by_label(lab: Lab) -> None:
    lab.up()
    status = lab.provider.status(lab.state())
    assert status.running
    roles = sorted((r["kind"].split(" ")[0], r["role"]) for r in status.rows)
    assert roles == [("Compute", "head"), ("TPU", "worker")]
    assert "head RUNNING" in status.summary
    lab.teardown()
    empty = state.State.new(state.state_path("lab"), "lab", "gcp-tpu")
    with pytest.raises(ClusterNotRunningError), lab.provider.connect(empty):
        pass


def test_state_lists_only_what_teardown_needs(lab: Lab) -> None:
    lab.up()
    data = json.loads(lab.state().path.read_text())
    cluster = next(r for r in data["resources"] if r["kind"] == Cluster.KIND)
    assert {"project", "zone", "config", "credentials_file", "head_ip"} <= set(cluster["attrs"])
    assert yaml.safe_load(Path(cluster["attrs"]["config"]).read_text())["cluster_name"] == "lab"


def test_firewall_quota_during_up_leaves_nothing(tmp_path: Path, rf_home: Path, fake: FakeGcp,
                                                 options: ApiOptions, sshd: Sshd,
                                                 dashboard: Dashboard, key_file: Path) -> None:
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]})
    fake.op_errors["insert-firewall"] = {"code": "QUOTA_EXCEEDED",
                                         "message": "Quota 'FIREWALLS' exceeded.  Limit: 200.0 "
                                                    "globally."}
    with pytest.raises(GcpQuotaError) as caught:
        lab.up()
    assert "Quota 'FIREWALLS' exceeded" in str(caught.value) and "\n" not in str(caught.value)
    assert lab.ray.calls == []  # stopped before `ray up`
    assert fake.firewalls == {} and lab.kinds() == []


@pytest.mark.parametrize("error", sorted(ERRORS))
def test_every_documented_error_at_the_firewall_insert_of_up(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard, key_file: Path, error: str) -> None:
    """The create `up` makes itself, refused with each of Google's errors: transient ones pass
    after the client's retries; the rest stop `up` in one line, before `ray up`, with nothing
    left in Google, and state that `teardown` finishes."""
    make, _, transient = ERRORS[error]
    body = make("compute")
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]})
    fake.fail("POST", "/global/firewalls$", body["error"]["code"], body,
              times=options.retries if transient else 100)
    if transient:
        lab.up()
        assert list(fake.firewalls) == ["rayfleet-lab-dashboard"]
    else:
        with pytest.raises(GcpError) as caught:
            lab.up()
        assert str(caught.value).startswith("gcp-tpu: ") and "\n" not in str(caught.value)
        assert lab.ray.calls == [] and fake.firewalls == {} and lab.left() == []
    fake.failures.clear()
    lab.teardown()
    assert fake.firewalls == {} and lab.left() == [] and state.read("lab") is None
