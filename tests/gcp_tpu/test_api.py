"""Our Google API calls and pre-flight, offline against the fake Compute v1 / TPU v2 endpoints:
error answers (403 API disabled, 404, 429, quota), pagination, slow operations, credentials."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.cli import loading
from infra.node.gcp_tpu.api import (
    ApiOptions,
    Gcp,
    GcpApiDisabledError,
    GcpCredentialsError,
    GcpError,
    GcpNotFoundError,
    GcpOperationError,
    GcpQuotaError,
    find_credentials,
)
from infra.providers.gcp_tpu import preflight
from tests.gcp_tpu.conftest import PROJECT, ZONE, write_service_account_key, write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp, compute_error, grpc_error, rate_limited, service_disabled

LABELS = {"rayfleet-cluster": "lab", "ray-cluster-name": "lab"}


@pytest.fixture
def api(fake: FakeGcp, options: ApiOptions, key_file: Path) -> Gcp:
    return Gcp(PROJECT, find_credentials(None, "spec.yaml"), options)


def _wait(api: Gcp, operation: dict, what: str = "op") -> tuple[dict, int]:
    polls = 0
    while True:
        done = api.poll(operation, what)
        if done is not None:
            return done, polls
        polls += 1
        assert polls < 50


# --- credentials --------------------------------------------------------------------------------


def test_no_credentials_is_one_line_with_the_fix() -> None:
    started = time.monotonic()
    with pytest.raises(GcpCredentialsError) as caught:
        find_credentials(None, "clusters/gcp-tpu.yaml")
    assert str(caught.value) == (
        "gcp-tpu: no Google credentials found; run `gcloud auth application-default login` or set "
        "credentials_file: in clusters/gcp-tpu.yaml")
    assert time.monotonic() - started < 2  # no metadata-server probing off GCE


def test_credentials_from_the_environment_and_from_a_spec_file(tmp_path: Path, key_file: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    found = find_credentials(None, "s.yaml")
    assert found.file == str(key_file) and found.credentials.service_account_email.startswith("tester@")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    other = write_service_account_key(tmp_path / "other.json")
    assert find_credentials(str(other), "s.yaml").file == str(other)


def test_gcloud_adc_file_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "gcloud"
    folder.mkdir(exist_ok=True)
    write_service_account_key(folder / "application_default_credentials.json")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(folder))
    found = find_credentials(None, "s.yaml")
    assert found.source == "application-default credentials" and found.file is None


@pytest.mark.parametrize(("content", "expected"), [
    ("not json", "is not a readable JSON key file"),
    ('{"type": "external_account"}', "holds 'external_account' credentials"),
    ('{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nAAAA\\n"}',
     "is not a usable service_account key"),
])
def test_bad_key_files_say_so_without_showing_the_key(tmp_path: Path, content: str,
                                                     expected: str) -> None:
    path = tmp_path / "key.json"
    path.write_text(content)
    with pytest.raises(GcpCredentialsError) as caught:
        find_credentials(str(path), "spec.yaml")
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert "AAAA" not in str(caught.value) and "PRIVATE" not in str(caught.value)


def test_loopback_endpoint_gets_no_credentials(api: Gcp, fake: FakeGcp) -> None:
    api.get_project()
    api.accelerator_types(ZONE)
    assert fake.requests
    assert all("authorization" not in {h.lower() for h in r["headers"]} for r in fake.requests)


# --- errors, retries ------------------------------------------------------------------------------


def test_tpu_api_disabled(api: Gcp, fake: FakeGcp) -> None:
    fake.disabled.add("tpu")
    with pytest.raises(GcpApiDisabledError) as caught:
        api.accelerator_types(ZONE)
    assert str(caught.value) == (
        "gcp-tpu: the Cloud TPU API is not enabled in project test-project; run `gcloud services "
        "enable tpu.googleapis.com --project test-project` and retry in a minute")
    assert caught.value.service == "tpu.googleapis.com" and caught.value.status == 403


def test_compute_api_disabled(api: Gcp, fake: FakeGcp) -> None:
    fake.disabled.add("compute")
    with pytest.raises(GcpApiDisabledError, match=r"Compute Engine API is not enabled.*"
                                                  r"gcloud services enable compute\.googleapis\.com"):
        api.get_project()


def test_unknown_zone_and_type_are_404(api: Gcp) -> None:
    with pytest.raises(GcpNotFoundError, match="zone us-east9-z: not found"):
        api.get_zone("us-east9-z")
    with pytest.raises(GcpNotFoundError, match="machine type n9-huge-8 in us-central2-b"):
        api.get_machine_type(ZONE, "n9-huge-8")
    with pytest.raises(GcpNotFoundError, match="Location us-east9-z is not found"):
        api.runtime_versions("us-east9-z")


@pytest.mark.parametrize("which", ["compute", "tpu"])
def test_429_is_retried_with_backoff_then_succeeds(api: Gcp, fake: FakeGcp, which: str) -> None:
    path, call = (("/projects/test-project$", api.get_project) if which == "compute" else
                  ("/acceleratorTypes$", lambda: api.accelerator_types(ZONE)))
    fake.fail("GET", path, 429, rate_limited(which), times=2)
    assert call()
    assert len([r for r in fake.requests if r["path"].endswith(path.strip("$"))]) >= 3


def test_429_that_persists_gives_up_after_the_retries(api: Gcp, fake: FakeGcp) -> None:
    fake.fail("GET", "/zones/us-central2-b$", 429, rate_limited(), times=100)
    with pytest.raises(GcpError) as caught:
        api.get_zone(ZONE)
    assert caught.value.retryable and "rate limit" in str(caught.value)
    assert len(fake.calls("GET", "/zones/us-central2-b")) == api.options.retries + 1


def test_retry_after_header_is_honoured(fake: FakeGcp, key_file: Path) -> None:
    waits: list[float] = []
    api = Gcp(PROJECT, find_credentials(None, "s"), ApiOptions(endpoint=fake.url, retry_base=0.01),
              sleep=waits.append)
    fake.fail("GET", "/regions/", 429, rate_limited(), times=1, headers={"Retry-After": "7"})
    api.get_region("us-central2")
    assert waits == [7.0]


def test_server_errors_are_retried_but_400s_are_not(api: Gcp, fake: FakeGcp) -> None:
    fake.fail("GET", "/networks/default$", 503, compute_error(503, "backendError", "Backend Error"))
    assert api.get_network("default")["name"] == "default"
    fake.fail("GET", "/networks/default$", 400, compute_error(400, "invalid", "Invalid value"))
    with pytest.raises(GcpError, match="HTTP 400"):
        api.get_network("default")


def test_unreachable_endpoint_is_one_line(key_file: Path) -> None:
    from infra.node import rayproc

    api = Gcp(PROJECT, find_credentials(None, "s"), ApiOptions(
        endpoint=f"http://127.0.0.1:{rayproc.free_port()}", retries=1, retry_base=0.01))
    with pytest.raises(GcpError, match=r"project test-project: cannot reach 127\.0\.0\.1"):
        api.get_project()


def test_quota_exceeded_at_once_and_in_an_operation(api: Gcp, fake: FakeGcp) -> None:
    body = {"name": "fw", "network": "global/networks/default", "sourceRanges": ["10.0.0.0/8"]}
    fake.fail("POST", "/global/firewalls$", 403, compute_error(
        403, "quotaExceeded", "Quota 'FIREWALLS' exceeded.  Limit: 200.0 globally."))
    with pytest.raises(GcpQuotaError, match=r"quota FIREWALLS is exhausted \(Quota 'FIREWALLS' exceeded"):
        api.insert_firewall(body)
    fake.op_errors["insert-firewall"] = {"code": "QUOTA_EXCEEDED",
                                         "message": "Quota 'FIREWALLS' exceeded.  Limit: 200.0"}
    operation = api.insert_firewall(body)
    with pytest.raises(GcpQuotaError, match="iam-admin/quotas\\?project=test-project"):
        _wait(api, operation)
    assert api.get_firewall("fw") is None


def test_tpu_operation_errors(api: Gcp, fake: FakeGcp) -> None:
    fake.add_tpu_node(ZONE, "n1", "v4-8", LABELS)
    fake.op_errors["delete-tpu"] = {"code": 13, "message": "internal error"}
    operation = api.delete_tpu_node(f"projects/{PROJECT}/locations/{ZONE}/nodes/n1")
    assert operation is not None
    with pytest.raises(GcpOperationError, match=r"internal error \(code 13"):
        _wait(api, operation)


# --- listings, operations ---------------------------------------------------------------------------


def test_slow_operations_are_polled_until_done(api: Gcp, fake: FakeGcp) -> None:
    fake.op_polls = 4
    fake.add_instance(ZONE, "w1", LABELS)
    operation = api.delete_instance(ZONE, "w1")
    assert operation is not None and operation["status"] == "PENDING"
    done, polls = _wait(api, operation)
    assert done["status"] == "DONE" and polls == 3
    assert fake.nodes_with(LABELS) == []
    fake.add_tpu_node(ZONE, "t1", "v4-8", LABELS)
    operation = api.delete_tpu_node(f"projects/{PROJECT}/locations/{ZONE}/nodes/t1")
    assert operation is not None and "done" not in operation
    done, polls = _wait(api, operation)
    assert done["done"] is True and polls == 3
    assert fake.nodes_with(LABELS) == []  # its hidden Compute instance went with it


def test_deleting_what_is_gone_is_not_an_error(api: Gcp) -> None:
    assert api.delete_instance(ZONE, "nope") is None
    assert api.delete_tpu_node(f"projects/{PROJECT}/locations/{ZONE}/nodes/nope") is None
    assert api.delete_firewall("nope") is None


def test_lists_follow_every_page(api: Gcp, fake: FakeGcp) -> None:
    for i in range(5):
        fake.add_instance(ZONE, f"w{i}", LABELS)
        fake.add_tpu_node(ZONE, f"t{i}", "v4-8", LABELS)
    assert len(api.instances(ZONE, LABELS)) == 10  # 5 VMs + the TPU VMs' hidden instances
    assert len(api.tpu_nodes(ZONE, LABELS)) == 5
    assert len(fake.calls("GET", "/zones/us-central2-b/instances")) == 5  # page size 2
    assert len(api.accelerator_types("us-central1-a")) == 7


def test_a_collection_is_made_once_and_each_request_is_new(api: Gcp, fake: FakeGcp) -> None:
    """googleapiclient makes a collection anew (every method, every docstring) at each call of
    its accessor, tens of ms of CPU: a poll loop on the head paid that per request."""
    assert api.compute.instances() is api.compute.instances()
    nodes = api.tpu.projects().locations().nodes()
    assert nodes is api.tpu.projects().locations().nodes()
    # A request is never shared: each call of a method is its own, and each one runs.
    name = f"projects/{PROJECT}/locations/{ZONE}/nodes/t0"
    assert nodes.get(name=name) is not nodes.get(name=name)
    fake.add_tpu_node(ZONE, "t0", "v4-8", LABELS)
    fake.add_instance(ZONE, "w0", LABELS)
    assert api.tpu_node(name)["name"] == name and api.tpu_node(name)["name"] == name
    assert len(api.instances(ZONE, LABELS)) == len(api.instances(ZONE, LABELS)) == 2
    api.delete_instance(ZONE, "w0")
    api.delete_instance(ZONE, "w0")
    assert len(fake.calls("DELETE", "/instances/w0")) == 2


def test_only_labelled_nodes_are_listed_even_if_the_server_ignores_the_filter(
        api: Gcp, fake: FakeGcp) -> None:
    fake.add_instance(ZONE, "ours", LABELS)
    fake.add_instance(ZONE, "same-ray-name", {"ray-cluster-name": "lab"})
    fake.add_instance(ZONE, "other", {"rayfleet-cluster": "other", "ray-cluster-name": "other"})
    fake.add_tpu_node(ZONE, "other-tpu", "v4-8", {"ray-cluster-name": "other"})
    fake.ignore_filter = True
    assert [i["name"] for i in api.instances(ZONE, LABELS)] == ["ours"]
    assert api.tpu_nodes(ZONE, LABELS) == []
    filters = {r["query"].get("filter") for r in fake.calls("GET", "/instances")}
    assert filters == {"(labels.ray-cluster-name = lab) AND (labels.rayfleet-cluster = lab)"}


# --- pre-flight ------------------------------------------------------------------------------------


def _run(tmp_path: Path, api: Gcp, ours: bool = False, **changes: object) -> preflight.Report:
    loaded = loading.load_spec(write_spec(tmp_path, name="lab", **changes))
    client = Gcp(loaded.project, find_credentials(None, "s"), api.options)  # type: ignore[attr-defined]
    return preflight.run(loaded, client, ours)  # type: ignore[arg-type]


def test_preflight_passes_and_reports_each_check(tmp_path: Path, api: Gcp) -> None:
    report = _run(tmp_path, api)
    text = "\n".join(report.passed)
    assert "project test-project reachable" in text and "v4-8 (tpu-ubuntu2204-base)" in text
    assert report.guest_cpus == {"n2-standard-4": 4, "n2-standard-8": 8}
    assert report.warnings == []


@pytest.mark.parametrize(("setup", "changes", "error", "expected"), [
    (lambda f: f.disabled.add("tpu"), {}, GcpApiDisabledError, "gcloud services enable tpu.googleapis"),
    (None, {"project": "missing-project"}, GcpNotFoundError, "project 'missing-project' not found"),
    (None, {"zone": "us-east9-z"}, GcpNotFoundError, "zone 'us-east9-z' does not exist"),
    (None, {"network": "labnet"}, GcpNotFoundError, "network 'labnet' not found"),
    (None, {"head": {"machine_type": "n9-huge-8"}}, GcpNotFoundError,
     "head.machine_type: 'n9-huge-8' is not offered in us-central2-b"),
    (None, {"tpu_workers": {"t": {"accelerator_type": "v5p-8"}}}, GcpNotFoundError,
     "tpu_workers.t: v5p-8 is not offered in us-central2-b (offered: v4-16, v4-32, v4-8)"),
    (None, {"tpu_workers": {"t": {"accelerator_config": {"type": "V4", "topology": "4x4x4"}}}},
     GcpNotFoundError, "tpu_workers.t: V4 4x4x4 is not offered"),
    (None, {"tpu_workers": {"t": {"accelerator_type": "v4-8", "runtime_version": "v2-alpha-tpuv6e"}}},
     GcpNotFoundError, "runtime version 'v2-alpha-tpuv6e' is not available in us-central2-b"),
    (lambda f: f.accelerator_types.pop(ZONE), {}, GcpNotFoundError,
     "tpu_workers.tpu: v4-8 is not offered in us-central2-b (offered: none)"),
    (lambda f: f.zone_status.update({ZONE: "DOWN"}), {}, GcpError, "zone us-central2-b is DOWN"),
    (lambda f: f.regions["us-central2"][0].update(usage=70.0), {}, GcpQuotaError,
     "quota CPUS in us-central2: 2 free of 72, but the head and min_workers need 4"),
    (lambda f: f.add_instance(ZONE, "ray-lab-head-1-compute", {"ray-cluster-name": "lab"}), {},
     GcpError, "already has nodes of a Ray cluster named 'lab' in us-central2-b (ray-lab-head-1"),
    (lambda f: f.project_quotas[0].update(usage=200.0),
     {"dashboard": {"allowed_source_ranges": ["10.1.0.0/16"]}}, GcpQuotaError,
     "quota FIREWALLS is used up"),
])
def test_preflight_failures_are_one_line_with_the_fix(
        tmp_path: Path, api: Gcp, fake: FakeGcp, setup: object, changes: dict, error: type,
        expected: str) -> None:
    if callable(setup):
        setup(fake)
    with pytest.raises(error) as caught:
        _run(tmp_path, api, **changes)
    assert expected in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)
    assert not [r for r in fake.requests if r["method"] != "GET"]  # pre-flight only reads


def test_preflight_warns_when_full_scale_out_exceeds_quota(tmp_path: Path, api: Gcp,
                                                           fake: FakeGcp) -> None:
    fake.regions["us-central2"][1].update(limit=20.0)  # N2_CPUS
    report = _run(tmp_path, api, cpu_workers={"cpu": {"machine_type": "n2-standard-8",
                                                      "min_workers": 1, "max_workers": 4}})
    assert any("quota N2_CPUS" in w and "full scale-out (36)" in w for w in report.warnings)


def test_preflight_accepts_our_own_cluster_name(tmp_path: Path, api: Gcp, fake: FakeGcp) -> None:
    fake.add_instance(ZONE, "ray-lab-head-1-compute", {"ray-cluster-name": "lab"})
    # Someone else's nodes by that name are refused, naming them...
    with pytest.raises(GcpError, match=r"already has nodes of a Ray cluster named 'lab' in "
                                       r"us-central2-b \(ray-lab-head-1-compute\)"):
        _run(tmp_path, api, ours=False)
    # ...while ours (state lists them) pass every check, the name's left out.
    report = _run(tmp_path, api, ours=True)
    assert "project test-project reachable" in "\n".join(report.passed)
    assert not [line for line in report.passed if "no other Ray cluster named" in line]
    assert report.zones == [ZONE] and report.warnings == []


def test_tpu_quota_error_reads_as_quota(api: Gcp, fake: FakeGcp) -> None:
    fake.fail("GET", "/runtimeVersions$", 429, grpc_error(
        429, "RESOURCE_EXHAUSTED", "Quota exceeded", "RATE_LIMIT_EXCEEDED"), times=1)
    assert api.runtime_versions(ZONE)
    fake.fail("GET", "/acceleratorTypes$", 403, service_disabled("tpu.googleapis.com"))
    with pytest.raises(GcpApiDisabledError):
        api.accelerator_types(ZONE)
