"""The fake held to Google's discovery documents, and the bugs of issue 22 the documents show:
the contract check itself (requests and answers), the copies matching the pinned client, TPU quota
refusals, requestId on creates, deleting what is already DELETING, and limits at their edge."""

from __future__ import annotations

import filecmp
from importlib.metadata import version
from pathlib import Path
from typing import Any

import googleapiclient
import pytest

from infra.node.gcp_tpu import queued
from infra.node.gcp_tpu.api import ApiOptions, Credentials, Gcp, GcpError, GcpQuotaError
from infra.providers.gcp_tpu import tpu_quota
from tests.gcp_tpu.conftest import PROJECT, ZONE
from tests.gcp_tpu.discovery import DOCS, Contract, Violation
from tests.gcp_tpu.fake_errors import compute_error, grpc_error, quota_exhausted
from tests.gcp_tpu.fake_filter import matches
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.waiting import wait_until


@pytest.fixture
def api(fake: FakeGcp, options: ApiOptions) -> Gcp:
    return Gcp(PROJECT, Credentials(None, "test", None), options, sleep=lambda _: None)


def test_the_copies_are_the_pinned_clients_documents() -> None:
    bundled = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
    for copy in sorted(DOCS.glob("*.v*.json")):
        assert filecmp.cmp(copy, bundled / copy.name, shallow=False), (
            f"{copy.name} differs from the installed google-api-python-client's; "
            "copy it again (tests/data/google-discovery/README.md)")
    assert version("google-api-python-client") == "2.202.0"


@pytest.mark.parametrize(("verb", "path", "query", "body", "named"), [
    ("GET", "/compute/v1/projects/p/zones/z/instances", {"maxResult": "5"}, None,
     "unknown query parameter 'maxResult'"),
    ("GET", "/compute/v1/projects/p/zones/z/instances", {"maxResults": "-1"}, None,
     "parameter maxResults=-1: below 0 (rule: minimum)"),
    ("GET", "/compute/v1/projects/p/zones/z/instances", {"maxResults": "ten"}, None,
     "parameter maxResults='ten': not an integer (rule: type)"),
    ("GET", "/compute/v1/projects/p/zones/z/instances/Bad_Name", {}, None,
     "parameter instance='Bad_Name': does not match"),
    ("DELETE", "/compute/v1/projects/p/zones/z/instances", {}, None,
     "no method of compute.v1 has this path and verb"),
    ("POST", "/compute/v1/projects/p/global/firewalls", {}, {"name": "fw", "sourceRange": []},
     "field (top level): Additional properties are not allowed ('sourceRange' was unexpected)"),
    ("POST", "/compute/v1/projects/p/global/firewalls", {}, {"network": "n"},
     "field name is required (rule: required)"),
    ("POST", "/compute/v1/projects/p/global/firewalls", {}, {"name": "fw", "direction": "IN"},
     "field direction: 'IN' is not one of"),
    ("POST", "/compute/v1/projects/p/global/firewalls", {}, {"name": "fw", "priority": "high"},
     "field priority: 'high' is not of type 'integer'"),
    ("DELETE", "/v2/projects/p/locations/z/queuedResources/q", {"force": "yes"}, None,
     "parameter force='yes': not a boolean"),
    ("POST", "/v2/projects/p/locations/z/queuedResources", {"queuedResourceId": "q"},
     {"tpu": {"nodeSpec": [{"parent": "x", "nodeId": "n", "node": {"acceleratorTyp": "v4-8"}}]}},
     "field tpu.nodeSpec.0.node: Additional properties are not allowed ('acceleratorTyp'"),
    ("POST", "/v2/projects/p/locations/z/queuedResources", {}, {"bestEffort": {}},
     "Additional properties are not allowed ('bestEffort' was unexpected)"),  # v2alpha1 only
    ("DELETE", "/v2/projects/p/locations/z/nodes/n", {}, {"x": 1},
     "takes no request body"),
])
def test_requests_the_documents_reject_are_named(verb: str, path: str, query: dict[str, str],
                                                 body: Any, named: str) -> None:
    with pytest.raises(Violation) as caught:
        Contract().request(verb, path, query, body)
    assert named in str(caught.value), str(caught.value)


def test_a_rejected_request_gets_googles_400_and_fails_the_test(api: Gcp, fake: FakeGcp) -> None:
    request = api.compute.instances().list(project=PROJECT, zone=ZONE)
    request.uri += "&orderBy=name&bogus=1"
    with pytest.raises(Exception, match="HTTP 400"):
        api.call(request, "listing")
    answer = fake.requests[-1]
    assert answer["query"]["bogus"] == "1"
    found = fake.take_violations()  # what the autouse check would fail this test with
    assert found == ["request compute.instances.list: unknown query parameter 'bogus' "
                     "(rule: parameters)"]


def test_answers_the_documents_reject_are_recorded(api: Gcp, fake: FakeGcp) -> None:
    fake.add_instance(ZONE, "vm", {})["status"] = "HAPPY"
    api.instances(ZONE, {})
    assert any("enum" in v and "HAPPY" in v for v in fake.take_violations())
    fake.fail("GET", "/regions/", 404, {"error": {"code": 404, "message": "x", "status": "GONE"}})
    with pytest.raises(Exception, match="not found"):
        api.get_region("us-central2")
    assert any("error.status" in v for v in fake.take_violations())
    fake.fail("GET", "/regions/", 429, grpc_error(429, "NOT_FOUND", "x"), times=10)
    with pytest.raises(GcpError):
        api.get_region("us-central2")
    assert any("google.rpc.Code mapping" in v for v in fake.take_violations())


def test_filter_or_binds_tighter_than_and() -> None:
    """AIP-160: `a AND b OR c` means `a AND (b OR c)`."""
    vm = {"labels": {"a": "1"}, "status": "TERMINATED"}
    assert not matches("labels.a = 1 AND status = RUNNING OR labels.a = 2", vm)
    assert matches("labels.a = 2 OR labels.a = 1 AND status = TERMINATED", vm)


# --- issue 22, bug 5: TPU quota exhaustion is a quota error, and pre-flight checks TPU quotas --

def test_a_429_quota_refusal_is_one_quota_error_sent_once(api: Gcp, fake: FakeGcp) -> None:
    fake.fail("POST", "/queuedResources$", 429, quota_exhausted(
        "TPUV4PodPerProjectPerZoneForTPUAPI", "zone us-central2-b"), times=100)
    with pytest.raises(GcpQuotaError) as caught:
        queued.create(api, ZONE, "rf-0a1b2c3d-s-0-0", {"tpu": {"nodeSpec": []}})
    assert "quota TPUV4PodPerProjectPerZoneForTPUAPI is exhausted" in str(caught.value)
    assert "iam-admin/quotas?project=test-project" in str(caught.value)
    assert not caught.value.retryable and len(fake.calls("POST", "/queuedResources")) == 1


def test_preflight_refuses_a_zone_without_tpu_quota(api: Gcp, fake: FakeGcp,
                                                    tmp_path: Path) -> None:
    from infra.cli.loading import load_spec as load
    from infra.providers.gcp_tpu import preflight
    from tests.gcp_tpu.conftest import write_spec

    spec = load(write_spec(tmp_path))
    report = preflight.run(spec, api, ours=False)
    assert any(line.startswith("TPU quotas in us-central2-b: Preemptible TPU v4 cores")
               for line in report.passed), report.passed
    fake.tpu_quota_zones.add(ZONE)
    with pytest.raises(GcpQuotaError) as caught:
        preflight.run(spec, api, ours=False)
    assert str(caught.value) == (
        "gcp-tpu: tpu_workers.tpu: TPU quota 'Preemptible TPU v4 cores per project per zone' is 0 "
        "in us-central2-b; request quota at https://console.cloud.google.com/iam-admin/quotas?"
        "project=test-project, or pick another zone")
    assert [r for r in fake.requests if r["method"] != "GET"] == []


def test_tpu_quota_matching_and_unreadable_quotas_warn(api: Gcp, fake: FakeGcp) -> None:
    metrics = api.tpu_quota_metrics()
    assert len(metrics) == 6  # over three pages of 2
    assert tpu_quota.limit(metrics, "v4", False, ZONE, "us-central2") == (
        "TPU v4 cores per project per zone", 64)
    assert tpu_quota.limit(metrics, "v5litepod", True, ZONE, "us-central2") == (
        "Preemptible TPU v5e chips per project per zone", 64)
    assert tpu_quota.limit(metrics, "v3", False, ZONE, "us-central2") is None
    fake.disabled.add("serviceusage")
    passed: list[str] = []
    warnings: list[str] = []

    class Spec:  # only what the check reads
        project, zone, tpu_workers = PROJECT, ZONE, {}

    tpu_quota.check(Spec(), api, "us-central2", passed, warnings)  # type: ignore[arg-type]
    assert warnings and warnings[0].startswith("TPU quotas not checked (the Service Usage API is "
                                               "not enabled in project test-project; run `gcloud")


# --- issue 22, bug 6: requestId on creates; deleting what is already DELETING ----------------

def test_a_create_whose_answer_was_lost_is_not_made_twice(api: Gcp, fake: FakeGcp) -> None:
    body = {"name": "fw", "network": "global/networks/default", "sourceRanges": ["10.0.0.0/8"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["8265"]}]}
    fake.fail("POST", "/global/firewalls$", 503, compute_error(503, "backendError", "Backend"),
              after=True)
    operation = api.insert_firewall(body)
    # A poll answers None while the operation runs: poll it until done, not in a busy loop
    # that a never-finishing operation would turn into a hang.
    wait_until(lambda: api.poll(operation, "creating fw") is not None, "the firewall's insert "
               "operation to finish", timeout=30, interval=0.05)
    posts = fake.calls("POST", "/global/firewalls")
    assert len(posts) == 2 and posts[0]["query"]["requestId"] == posts[1]["query"]["requestId"]
    assert list(fake.firewalls) == ["fw"]
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    data = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": "rf-0a1b2c3d-s-0-0", "node": {
        "acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]}}
    fake.fail("POST", "/queuedResources$", 503, grpc_error(503, "UNAVAILABLE", "try again"),
              after=True)
    queued.create(api, ZONE, "rf-0a1b2c3d-s-0-0", data)
    posts = fake.calls("POST", "/queuedResources")
    assert len(posts) == 2 and posts[0]["query"]["requestId"] == posts[1]["query"]["requestId"]
    assert list(fake.queued_states()) == ["rf-0a1b2c3d-s-0-0"]


def test_deleting_what_is_already_deleting_is_success(api: Gcp, fake: FakeGcp) -> None:
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    name = f"{parent}/queuedResources/rf-0a1b2c3d-s-0-0"
    queued.create(api, ZONE, "rf-0a1b2c3d-s-0-0", {"tpu": {"nodeSpec": [{
        "parent": parent, "nodeId": "rf-0a1b2c3d-s-0-0", "node": {
            "acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]}})
    fake.op_polls = 1000  # someone else's delete is still running
    assert queued.delete(api, name) is not None
    assert queued.delete(api, name) is None  # autodown, a sweep, teardown: the second is fine
    assert fake.calls("DELETE", "/queuedResources/")[-1]["query"]["force"] == "true"
    node = fake.add_tpu_node(ZONE, "n1", "v4-8", {})
    assert api.delete_tpu_node(node["name"]) is not None
    assert api.delete_tpu_node(node["name"]) is None
    # Not DELETING: the same refusal is an error, not success.
    fake.fail("DELETE", "/nodes/n2$", 400, grpc_error(400, "FAILED_PRECONDITION", "busy"))
    other = fake.add_tpu_node(ZONE, "n2", "v4-8", {})
    with pytest.raises(Exception, match="busy"):
        api.delete_tpu_node(other["name"])


def test_a_v2_node_is_answered_in_each_versions_own_terms(api: Gcp, fake: FakeGcp) -> None:
    """A node created through v2 (a queued resource's) listed to Ray's v2alpha1 calls: each answer
    holds to its caller's document, whose Node.apiVersion enum has no `V2` in v2alpha1."""
    from googleapiclient import discovery

    node = fake.add_tpu_node(ZONE, "made-by-v2", "v4-8", {})
    assert node["apiVersion"] == "V2"
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    for api_version, expected in (("v2alpha1", "V2_ALPHA1"), ("v2", "V2")):
        tpu = discovery.build("tpu", api_version, http=api.compute._http, static_discovery=True,
                              client_options={"api_endpoint": f"{fake.url}/"})
        nodes = tpu.projects().locations().nodes()
        listed = api.call(nodes.list(parent=parent), "list")["nodes"]
        got = api.call(nodes.get(name=node["name"]), "get")
        assert [n["apiVersion"] for n in listed] == [expected] == [got["apiVersion"]], api_version
    assert fake.violations == []


# --- limits at their edge ------------------------------------------------------------------

LONGEST = "c" + "a" * 29 + "z"  # 31 characters: the longest cluster name a spec may have


def test_longest_names_and_labels_reach_google_intact(api: Gcp, fake: FakeGcp,
                                                      tmp_path: Path) -> None:
    """A 31-character cluster, 24-character node types and a 63/63 user label: every node config
    the product renders, sent as Ray sends it (Compute insert, TPU v2alpha1 create with Ray's own
    labels and node names), the dashboard rule and a queued request pass the documents and
    Google's label and name rules."""
    import yaml
    from googleapiclient import discovery

    from infra.cli.loading import load_spec as load
    from infra.node import identity
    from infra.providers.gcp_tpu import config
    from tests.gcp_tpu.conftest import write_spec

    cpu_type, tpu_type = "c" * 24, "t" * 24
    spec = load(write_spec(tmp_path, name=LONGEST, labels={"k" * 63: "v" * 63},
                           cpu_workers={cpu_type: {"machine_type": "n2-standard-8",
                                                   "max_workers": 2}},
                           tpu_workers={tpu_type: {"accelerator_type": "v4-32",
                                                   "max_workers": 1, "provisioning": "spot"}}))
    rendered = yaml.safe_load(config.render_cluster_yaml(
        spec, "ssh-ed25519 AAAA test", str(tmp_path / "key"), "0a1b2c3d",
        identity.owner_mark()))
    compute = discovery.build("compute", "v1", http=api.compute._http, static_discovery=True,
                              client_options={"api_endpoint": f"{fake.url}/compute/v1/"})
    tpu = discovery.build("tpu", "v2alpha1", http=api.compute._http, static_discovery=True,
                          client_options={"api_endpoint": f"{fake.url}/"})
    for index, (type_name, node_type) in enumerate(rendered["available_node_types"].items()):
        kind = "tpu" if "acceleratorType" in node_type["node_config"] else "compute"
        node_name = f"ray-{LONGEST}-worker-{index:08x}-{kind}"
        assert len(node_name) <= 63
        body = {**node_type["node_config"]}
        body["labels"] = {**body.get("labels", {}), "ray-node-name": node_name,
                          "ray-node-type": "worker", "ray-user-node-type": type_name,
                          "ray-launch-config": "f" * 40, "ray-cluster-name": LONGEST,
                          "ray-node-status": "uninitialized"}
        if kind == "compute":
            body["name"] = node_name
            body["machineType"] = f"zones/{ZONE}/machineTypes/{body['machineType']}"
            api.call(compute.instances().insert(project=PROJECT, zone=ZONE, body=body), "insert")
        else:
            api.call(tpu.projects().locations().nodes().create(
                parent=f"projects/{PROJECT}/locations/{ZONE}", nodeId=node_name, body=body),
                "create")
    assert len(fake.nodes_with({"rayfleet-name": LONGEST})) == len(
        rendered["available_node_types"])
    # Read back as Ray does (v2alpha1): the fake's answers hold to that document too.
    fake.op_polls = 0
    listed = api.call(tpu.projects().locations().nodes().list(
        parent=f"projects/{PROJECT}/locations/{ZONE}"), "list")
    assert {n["apiVersion"] for n in listed["nodes"]} == {"V2_ALPHA1"}
    name = config.firewall_name(LONGEST)
    api.insert_firewall({"name": name, "network": "global/networks/default",
                         "sourceRanges": ["10.0.0.0/8"], "targetTags": [config.head_tag(LONGEST)],
                         "allowed": [{"IPProtocol": "tcp", "ports": ["8265"]}]})
    qr_id = queued.request_id("0a1b2c3d", "s" * 23, 99, 99)
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    queued.create(api, ZONE, qr_id, {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": qr_id,
                                                           "node": {"acceleratorType": "v4-8",
                                                                    "runtimeVersion":
                                                                        "tpu-ubuntu2204-base",
                                                                    "labels": spec.labels}}]}})
    assert qr_id in fake.queued_states()


def test_google_refuses_labels_past_their_limits(api: Gcp, fake: FakeGcp) -> None:
    for labels in ({"k" * 64: "v"}, {"k": "v" * 64}, {"Key": "v"}, {"k": "Value"},
                   {f"k{i}": "v" for i in range(65)}):
        fake.add_instance(ZONE, "vm", {})
        with pytest.raises(Exception, match="HTTP 400"):
            api.call(api.compute.instances().setLabels(
                project=PROJECT, zone=ZONE, instance="vm",
                body={"labels": labels, "labelFingerprint": "42WmSpB8rSM="}), "labels")


@pytest.mark.parametrize("zone", ["us-central2-b", "us-central1-a"])
def test_every_zone_the_fake_offers_passes_preflight(api: Gcp, fake: FakeGcp, tmp_path: Path,
                                                     zone: str) -> None:
    """rayfleet lists no zones of its own (the spec names them); each zone the fake models
    (one per TPU region it offers) goes through pre-flight, TPU quota included."""
    from infra.cli.loading import load_spec as load
    from infra.providers.gcp_tpu import preflight
    from tests.gcp_tpu.conftest import write_spec

    accelerator = {"us-central2-b": "v4-8", "us-central1-a": "v5litepod-4"}[zone]
    spec = load(write_spec(tmp_path, zone=zone, tpu_workers={"tpu": {
        "accelerator_type": accelerator, "min_workers": 1, "max_workers": 1,
        "provisioning": "spot"}}))
    report = preflight.run(spec, api, ours=False)
    assert any(line.startswith(f"TPU quotas in {zone}:") for line in report.passed), report
