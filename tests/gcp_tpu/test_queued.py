"""Queued TPU slices without Ray: the strict spec section, the request bodies and ids, the fake's
queuedResources (states over time, errors, force delete, suspension), and the laptop's queueing,
status rows and teardown against it. The joined-cluster path runs in test_e2e_queued.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.cli import loading
from infra.core import state
from infra.core.errors import SpecError
from infra.node.gcp_tpu import queued
from infra.node.gcp_tpu.api import ApiOptions, Credentials, Gcp, GcpError
from infra.providers.gcp_tpu import slices
from infra.providers.gcp_tpu.records import Cluster, Queued
from tests.gcp_tpu.conftest import write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.waiting import wait_until

SECOND_ZONE = "us-central2-a"
CLUSTER_ID = "0123abcd"


def add_second_zone(fake: FakeGcp) -> None:
    fake.zones[SECOND_ZONE] = "us-central2"
    fake.accelerator_types[SECOND_ZONE] = list(fake.accelerator_types["us-central2-b"])
    fake.runtime_versions[SECOND_ZONE] = list(fake.runtime_versions["us-central2-b"])


def api_for(options: ApiOptions) -> Gcp:
    return Gcp("test-project", Credentials(None, "test", None), options)


def load(tmp_path: Path, queued_slices: dict[str, Any], **changes: Any) -> Any:
    return loading.load_spec(write_spec(tmp_path, name="qcls", queued_slices=queued_slices,
                                     **changes))


@pytest.mark.parametrize(("entry", "changes", "expected"), [
    ({"accelerator_type": "v4-8", "zones": ["us-central1-a"]}, {},
     "queued_slices.a.zones: us-central1-a is not in the cluster's region us-central2"),
    ({"accelerator_type": "v4-8", "provisioning": "reserved"}, {},
     "provisioning: reserved needs reservation: <name>"),
    ({"accelerator_type": "v4-8", "provisioning": "reserved", "reservation": "r1",
      "zones": ["us-central2-b", "us-central2-a"]}, {}, "a reservation lives in one zone"),
    ({"accelerator_type": "v4-8", "reservation": "r1"}, {}, "only used with provisioning: reserved"),
    ({"accelerator_type": "v4-8", "count": 0}, {}, "count"),
    ({"accelerator_type": "v4-8", "valid_until_hours": 0}, {}, "valid_until_hours"),
    ({"accelerator_type": "v4-8", "provisioning": "preemptible"}, {}, "provisioning"),
    ({"accelerator_type": "v4-8", "zone": "us-central2-b"}, {}, "zone"),
    ({"accelerator_type": "v4-8", "zones": []}, {}, "zones is empty"),
    ({"accelerator_type": "v9-8"}, {}, "unknown TPU generation"),
    ({}, {}, "give exactly one of accelerator_type"),
])
def test_bad_queued_slices_are_one_line_errors_naming_the_field(
        tmp_path: Path, entry: dict[str, Any], changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, {"a": entry}, **changes)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message
    assert "queued_slices" in message, message


def test_slice_requests_carry_the_cluster_id_labels_key_and_zones(tmp_path: Path) -> None:
    cluster = load(tmp_path, {
        "pod": {"accelerator_config": {"type": "V4", "topology": "2x2x2"}, "provisioning": "spot",
                "valid_until_hours": 1.5, "count": 2},
        "one": {"accelerator_type": "v4-8", "zones": ["us-central2-a", "us-central2-b"]}},
        zone=None, zones=["us-central2-b", "us-central2-a"])
    pod, one = slices.slice_requests(cluster, CLUSTER_ID, "ownerownerow", "ssh-ed25519 AAAA k")
    assert (pod.hosts, pod.chips_per_host, pod.config, pod.zones) == (
        2, 4, ("V4", "2x2x2"), ["us-central2-b", "us-central2-a"])
    assert one.zones == ["us-central2-a", "us-central2-b"] and one.config is None
    qr_id = queued.request_id(CLUSTER_ID, "pod", 1, 0)
    body = queued.body(pod, "test-project", "us-central2-b", qr_id)
    node = body["tpu"]["nodeSpec"][0]["node"]
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "5400s"}
    assert node["acceleratorConfig"] == {"type": "V4", "topology": "2x2x2"}
    assert node["labels"]["rayfleet-cluster"] == CLUSTER_ID and "ray-cluster-name" not in node[
        "labels"]  # Ray's provider must never take a queued node for one of its own
    assert node["metadata"] == {"ssh-keys": "root:ssh-ed25519 AAAA k"}
    assert queued.parse_id(qr_id) == (CLUSTER_ID, "pod", 1, 0) and len(qr_id) <= 63
    assert queued.ours({**body, "name": f"x/queuedResources/{qr_id}"}, CLUSTER_ID)
    look_alike = {**body, "name": f"x/queuedResources/{qr_id}"}
    look_alike["tpu"] = {"nodeSpec": [{"node": {"labels": {"rayfleet-cluster": "ffffffff"}}}]}
    assert not queued.ours(look_alike, CLUSTER_ID)  # the id alone is never enough


def _wait(api: Gcp, operation: dict[str, Any]) -> None:
    for _ in range(100):
        if api.poll(operation, "op") is not None:
            return
    raise AssertionError("operation never finished")


def test_the_fake_moves_requests_through_the_queue_and_answers_like_google(
        fake: FakeGcp, options: ApiOptions) -> None:
    add_second_zone(fake)
    fake.queue_wait_s, fake.queue_provision_s = 0.3, 0.2
    api = api_for(options)
    request = queued.SliceRequest("pod", "v4-16", None, "tpu-ubuntu2204-base", 2, 4, 8, "spot",
                                  ["us-central2-b", SECOND_ZONE], 1,
                                  labels={"rayfleet-cluster": CLUSTER_ID})
    qr_id = queued.request_id(CLUSTER_ID, "pod", 0, 0)
    _wait(api, queued.create(api, "us-central2-b", qr_id,
                             queued.body(request, api.project, "us-central2-b", qr_id)))
    with pytest.raises(GcpError) as again:
        queued.create(api, "us-central2-b", qr_id,
                      queued.body(request, api.project, "us-central2-b", qr_id))
    assert again.value.status == 409
    bad = queued.body(request, api.project, "us-central2-b", "other")
    bad["tpu"]["nodeSpec"][0]["node"]["acceleratorType"] = "v5p-8"
    with pytest.raises(GcpError, match="not available in zone"):
        queued.create(api, "us-central2-b", "other", bad)
    seen: list[str] = []

    def active() -> bool:
        states = [queued.state_of(r) for r in queued.listed(api, "us-central2-b", CLUSTER_ID)]
        if not seen or seen[-1] != states[0]:
            seen.append(states[0])
        return seen[-1] == "ACTIVE"

    wait_until(active, "the request to become ACTIVE", timeout=10, interval=0.05)
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    node = api.tpu_nodes("us-central2-b", {"rayfleet-cluster": CLUSTER_ID})
    assert [len(n["networkEndpoints"]) for n in node] == [2] and node[0]["state"] == "READY"
    name = f"projects/{api.project}/locations/us-central2-b/queuedResources/{qr_id}"
    with pytest.raises(GcpError, match="has nodes"):
        api.call(api.tpu.projects().locations().queuedResources().delete(name=name), "delete")
    fake.suspend(qr_id)
    assert fake.queued_states()[qr_id] == ("us-central2-b", "SUSPENDED")
    assert api.tpu_nodes("us-central2-b", {}) == []  # the slice's node went with the suspension
    _wait(api, queued.delete(api, name) or {})
    assert queued.listed(api, "us-central2-b", CLUSTER_ID) == []
    assert queued.delete(api, name) is None  # gone: 404 is not an error


def test_expired_and_failing_requests_end_failed(fake: FakeGcp, options: ApiOptions) -> None:
    api = api_for(options)
    fake.queue_held_zones.add("us-central2-b")
    request = queued.SliceRequest("a", "v4-8", None, "tpu-ubuntu2204-base", 1, 4, 8, "standard",
                                  ["us-central2-b"], 1, valid_until_hours=0.0001,
                                  labels={"rayfleet-cluster": CLUSTER_ID})
    qr_id = queued.request_id(CLUSTER_ID, "a", 0, 0)
    _wait(api, queued.create(api, "us-central2-b", qr_id,
                             queued.body(request, api.project, "us-central2-b", qr_id)))

    def moved_on() -> dict[str, Any] | None:
        # The fake moves a request on at each TPU call, one state at a time: wait for the state
        # after the queue (a fixed sleep past the 0.36 s validity raced that stepping).
        (listed,) = queued.listed(api, "us-central2-b", CLUSTER_ID)
        return None if queued.state_of(listed) in ("ACCEPTED", "WAITING_FOR_RESOURCES") else listed

    found = wait_until(moved_on, "the request to leave the queue", timeout=30, interval=0.05)
    assert queued.state_of(found) == "FAILED"
    assert "expired" in found["state"]["failedData"]["error"]["message"]


def test_status_and_teardown_find_every_request_of_the_cluster(
        tmp_path: Path, fake: FakeGcp, options: ApiOptions) -> None:
    add_second_zone(fake)
    fake.queue_held_zones.add(SECOND_ZONE)
    cluster = load(tmp_path, {"a": {"accelerator_type": "v4-8", "provisioning": "spot",
                                    "zones": ["us-central2-b", SECOND_ZONE], "count": 2}},
                   zone=None, zones=["us-central2-b", SECOND_ZONE])
    api = api_for(options)
    with state.locked("qcls", "gcp-tpu", "up") as current:
        requests = slices.slice_requests(cluster, current.cluster_id, current.owner, "ssh-ed25519 K")
        slices.queue_all(api, current, requests, 0.01)
        assert sorted(r.id for r in current.resources(Queued)) == [
            queued.request_id(current.cluster_id, "a", i, 0) for i in range(2)]
        slices.queue_all(api, current, requests, 0.01)  # a second `up` queues nothing new
        assert len(fake.queued) == 2
        # A replacement the head queued (not in state) and a look-alike of another cluster.
        extra = queued.request_id(current.cluster_id, "a", 0, 1)
        _wait(api, queued.create(api, SECOND_ZONE, extra,
                                 queued.body(requests[0], api.project, SECOND_ZONE, extra)))
        other = queued.request_id("ffffffff", "a", 0, 0)
        foreign = queued.SliceRequest(**{**requests[0].__dict__,
                                         "labels": {"rayfleet-cluster": "ffffffff"}})
        _wait(api, queued.create(api, SECOND_ZONE, other,
                                 queued.body(foreign, api.project, SECOND_ZONE, other)))
        fake.suspend(queued.request_id(current.cluster_id, "a", 1, 0))
        rows, warnings = slices.status_rows(api, cluster, current, {})
        assert sorted((r["name"], r["state"], r["zone"]) for r in rows) == sorted([
            (queued.request_id(current.cluster_id, "a", 0, 0), "ACTIVE", "us-central2-b"),
            (queued.request_id(current.cluster_id, "a", 1, 0), "SUSPENDED", "us-central2-b"),
            (extra, "WAITING_FOR_RESOURCES", SECOND_ZONE)])
        assert len(warnings) == 1 and "SUSPENDED" in warnings[0], warnings
        slices.teardown(api, cluster, current)
        assert current.resources(Queued) == []
    assert list(fake.queued_states()) == [other]  # only the other cluster's request is left
    assert [n["name"].rsplit("/", 1)[-1] for n in fake.tpu_nodes.values()] == []


def test_the_joiner_requeues_lost_spot_slices_in_the_next_zone_and_reports_the_rest(
        tmp_path: Path, fake: FakeGcp, options: ApiOptions) -> None:
    from infra.node.gcp_tpu import joiner

    add_second_zone(fake)
    fake.queue_held.add("rf-")  # nothing becomes ACTIVE: no host to reach in this test
    fake.queue_fail_zones.add(SECOND_ZONE)
    api = api_for(options)
    spot = queued.SliceRequest("s", "v4-8", None, "tpu-ubuntu2204-base", 1, 4, 8, "spot",
                               ["us-central2-b", SECOND_ZONE], 1,
                               labels={"rayfleet-cluster": CLUSTER_ID})
    standard = queued.SliceRequest(**{**spot.__dict__, "name": "d", "provisioning": "standard",
                                      "zones": [SECOND_ZONE]})
    config = joiner.Config(
        cluster="qcls", cluster_id=CLUSTER_ID, project=api.project, head_address="10.0.0.2:6379",
        ssh_user="ray", ssh_key="~/ray_bootstrap_key.pem", install_command="true",
        marker=str(tmp_path / "marker.json"), max_attempts=3,
        slices=[{**r.__dict__, "config": None} for r in (spot, standard)])
    for request, zone in ((spot, "us-central2-b"), (standard, SECOND_ZONE)):
        qr_id = queued.request_id(CLUSTER_ID, request.name, 0, 0)
        _wait(api, queued.create(api, zone, qr_id, queued.body(request, api.project, zone, qr_id)))
    daemon = joiner.Joiner(config, api=api)
    fake.queue_held = {"-s-0-0", "-s-0-2"}  # the re-queued one in the first zone keeps waiting
    fake.suspend(queued.request_id(CLUSTER_ID, "s", 0, 0))
    daemon.step()
    daemon.step()  # the re-queued one FAILs in the second zone; the next wraps to the first
    daemon.write_marker()
    states = fake.queued_states()
    assert states[queued.request_id(CLUSTER_ID, "s", 0, 1)] == (SECOND_ZONE, "FAILED")
    assert states[queued.request_id(CLUSTER_ID, "s", 0, 2)] == ("us-central2-b",
                                                                "WAITING_FOR_RESOURCES")
    assert states[queued.request_id(CLUSTER_ID, "d", 0, 0)] == (SECOND_ZONE, "FAILED")
    assert len(states) == 4  # the standard slice is reported, never re-queued
    marker = json.loads((tmp_path / "marker.json").read_text())["requests"]
    assert marker[queued.request_id(CLUSTER_ID, "s", 0, 0)]["replaced_by"] == \
        queued.request_id(CLUSTER_ID, "s", 0, 1)
    assert marker[queued.request_id(CLUSTER_ID, "d", 0, 0)]["replaced_by"] == ""
    assert "no more capacity" in marker[queued.request_id(CLUSTER_ID, "d", 0, 0)]["error"]
    daemon.step()  # attempt 3 would pass max_attempts: reported, not queued
    daemon.step()
    assert len(fake.queued_states()) == 4


def test_autodown_removes_the_clusters_queued_slices_with_its_nodes(
        fake: FakeGcp, key_file: Path) -> None:
    from infra.node.gcp_tpu import autodown

    fake.op_polls = 1
    api = api_for(ApiOptions(endpoint=fake.url, poll_interval=0.02, retries=0))
    fake.add_instance("us-central2-b", "ray-qcls-head", {"rayfleet-cluster": CLUSTER_ID,
                                                         "ray-cluster-name": "qcls"})
    request = queued.SliceRequest("a", "v4-8", None, "tpu-ubuntu2204-base", 1, 4, 8, "standard",
                                  ["us-central2-b"], 1, labels={"rayfleet-cluster": CLUSTER_ID})
    for cluster_id in (CLUSTER_ID, "ffffffff"):
        qr_id = queued.request_id(cluster_id, "a", 0, 0)
        body = queued.body(request, api.project, "us-central2-b", qr_id)
        body["tpu"]["nodeSpec"][0]["node"]["labels"] = {"rayfleet-cluster": cluster_id}
        _wait(api, queued.create(api, "us-central2-b", qr_id, body))
    fake.queued_states()
    fake.queued_states()  # ACTIVE, with a node each
    assert len(fake.tpu_nodes) == 2
    seen: list[str] = []
    autodown.remove({"project": api.project, "zone": "us-central2-b", "head_name": "ray-qcls-head",
                     "labels": {"rayfleet-cluster": CLUSTER_ID, "ray-cluster-name": "qcls"},
                     "api_endpoint": fake.url, "credentials_file": str(key_file),
                     "queued_zones": ["us-central2-b"], "wait_s": 30}, seen.append)
    assert f"deleting queued TPU request {queued.request_id(CLUSTER_ID, 'a', 0, 0)}" in seen
    assert list(fake.queued_states()) == [queued.request_id("ffffffff", "a", 0, 0)]
    assert [n.rsplit("/", 1)[-1] for n in fake.tpu_nodes] == [queued.request_id("ffffffff", "a",
                                                                                 0, 0)]


def test_plan_lists_queued_slices_and_preflight_checks_their_zones(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path) -> None:
    from infra.providers.gcp_tpu.provider import Provider

    add_second_zone(fake)
    fake.accelerator_types[SECOND_ZONE] = [("v4-8", "V4", "2x2x1")]
    path = write_spec(tmp_path, name="qcls", zone=None, zones=["us-central2-b", SECOND_ZONE],
                      queued_slices={"pod": {"accelerator_type": "v4-16",
                                             "zones": ["us-central2-b", SECOND_ZONE]}})
    plan = Provider(loading.load_spec(path), api_options=options).plan(None)  # type: ignore[arg-type]
    (row,) = [r for r in plan.resources if r.name == "pod"]
    assert "1 × v4-16 (8 chips, 2 host(s))" in row.detail and SECOND_ZONE in row.detail
    assert any("queued_slices.pod: v4-16 (tpu-ubuntu2204-base, standard) offered in "
               "us-central2-b" in n for n in plan.notes), plan.notes
    assert any(f"v4-16 with tpu-ubuntu2204-base is not offered in {SECOND_ZONE}" in n
               for n in plan.notes), plan.notes
    fake.accelerator_types["us-central2-b"] = [("v4-8", "V4", "2x2x1")]
    plan = Provider(loading.load_spec(path), api_options=options).plan(None)  # type: ignore[arg-type]
    # A failed pre-flight check is a problem of the plan (`invoke plan` exits 1), not a note.
    assert any("queued_slices.pod: v4-16 with runtime tpu-ubuntu2204-base is offered in none of "
               "its zones" in n for n in plan.problems), plan.problems


def test_sweep_lists_and_deletes_queued_requests_by_their_cluster_id(
        rf_home: Path, tmp_path: Path, fake: FakeGcp, options: ApiOptions, key_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.providers.gcp_tpu.sweep import Sweeper

    monkeypatch.setenv("RAYFLEET_CLUSTERS", str(tmp_path / "no-specs"))  # only the state below

    api = api_for(options)
    with state.locked("qcls", "gcp-tpu", "up") as current:  # where this checkout created things
        current.add("rf-x", Queued(project=api.project, zone="us-central2-b"))
    request = queued.SliceRequest("a", "v4-8", None, "tpu-ubuntu2204-base", 1, 4, 8, "spot",
                                  ["us-central2-b"], 1, labels={"rayfleet-cluster": CLUSTER_ID,
                                                                "rayfleet-queued-slice": "a"})
    ours, look_alike = queued.request_id(CLUSTER_ID, "a", 0, 0), queued.request_id(
        "ffffffff", "a", 0, 0)
    for qr_id in (ours, look_alike):  # the look-alike's node does not carry its id
        _wait(api, queued.create(api, "us-central2-b", qr_id,
                                 queued.body(request, api.project, "us-central2-b", qr_id)))
    fake.queued_states()
    fake.queued_states()  # ACTIVE, each with a node
    sweeper = Sweeper(options)
    assert sweeper.credentials()
    marked = sweeper.marked()
    assert [(m.name, m.cluster_id, m.status) for m in marked] == [(ours, CLUSTER_ID, "ACTIVE")]
    assert (marked[0].hourly_usd or 0) > 0  # an ACTIVE request bills its slice
    sweeper.delete(marked)
    assert list(fake.queued_states()) == [look_alike]
    assert [n.rsplit("/", 1)[-1] for n in fake.tpu_nodes] == [look_alike]


def test_the_heads_autodown_config_covers_queued_slices(tmp_path: Path) -> None:
    """With queued slices, the watcher's action gets every zone their requests may be in and
    stops the joiner first (it would re-queue a spot slice while its request is being deleted);
    without them, neither."""
    from infra.providers.gcp_tpu import services

    cluster = load(tmp_path, {"one": {"accelerator_type": "v4-8",
                                      "zones": ["us-central2-a", "us-central2-b"]}},
                   zone=None, zones=["us-central2-b", "us-central2-a"], autodown={"idle_minutes": 5})
    current = state.State.new(tmp_path / "s.json", "qcls", "gcp-tpu")
    # A request the joiner moved to a zone the spec no longer lists still counts.
    current.add("rf-x-one-0-1", Queued(zone="us-central2-c"))
    head = current.add("qcls", Cluster(project="test-project", zone="us-central2-b",
                                       head="ray-qcls-head", label_id=current.cluster_id))
    args = services.watcher_config(cluster, current, head).action_args
    assert args["queued_zones"] == ["us-central2-a", "us-central2-b", "us-central2-c"]
    assert args["stop_first"] == ["~/.rayfleet/queued.json.pid"]
    (tmp_path / "plain").mkdir()
    plain = load(tmp_path / "plain", {}, autodown={"idle_minutes": 5})
    fresh = state.State.new(tmp_path / "t.json", "qcls", "gcp-tpu")
    args = services.watcher_config(plain, fresh, head).action_args
    assert "queued_zones" not in args and "stop_first" not in args
