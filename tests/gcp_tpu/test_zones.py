"""Zone fallback for directly created capacity (`zones:`), against the fake Google APIs.

Pre-flight picks the first listed zone that offers every type and runtime version; a head that
Google refuses for capacity (a stockout) moves `up` to the next zone after the refused zone is
swept clean. Only the test that lets `up` succeed needs a real sshd (the dashboard is checked
through an SSH tunnel); the others stop before that point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.cli import loading
from infra.core import state
from infra.core.errors import SpecError
from infra.node.gcp_tpu.api import ApiOptions, GcpError
from infra.providers.base import UpOptions
from infra.providers.gcp_tpu import config
from infra.providers.gcp_tpu.provider import Provider
from infra.providers.gcp_tpu.records import Cluster
from tests.gcp_tpu.conftest import Dashboard, FakeRay, Sshd, write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp

FIRST, SECOND = "us-central1-b", "us-central1-a"


def add_first_zone(fake: FakeGcp) -> None:
    """A second zone in us-central1, listed first: v5 lite pods, no v5p."""
    fake.zones[FIRST] = "us-central1"
    fake.accelerator_types[FIRST] = [("v2-8", "V2", "2x2"),
                                     ("v5litepod-8", "V5LITE_POD", "2x4")]
    fake.runtime_versions[FIRST] = ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite"]


def zones_spec(folder: Path, accelerator: str, runtime: str, **changes: Any) -> Path:
    return write_spec(folder, name="zoned", zone=None, zones=[FIRST, SECOND],
                      tpu_workers={"tpu": {"accelerator_type": accelerator,
                                           "runtime_version": runtime, "max_workers": 1}},
                      **changes)


def make_provider(path: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd | None = None,
                  ssh_port: int = 22) -> tuple[Provider, FakeRay]:
    ray = FakeRay(fake, sshd)
    loaded = loading.load_spec(path)
    return Provider(loaded, ray=ray, api_options=options, ssh_port=ssh_port,  # type: ignore[arg-type]
                    head_monitor=ray.start_monitor), ray


def up(provider: Provider) -> Any:
    with state.locked("zoned", "gcp-tpu", "up") as current:
        plan = provider.plan(current)
        return provider.up(current, plan, UpOptions())


def inventory(fake: FakeGcp, zone: str) -> list[str]:
    """Every VM and TPU node in `zone`, whoever made it."""
    with fake.lock:
        names = [name for (z, name) in fake.instances if z == zone]
        names += [n.rsplit("/", 1)[-1] for n in fake.tpu_nodes if f"/locations/{zone}/" in n]
    return names


def zone_of(text: str) -> str:
    return str(yaml.safe_load(text)["provider"]["availability_zone"])


def test_zone_and_zones_together_is_a_one_line_spec_error(tmp_path: Path) -> None:
    path = write_spec(tmp_path, zones=[FIRST, SECOND])  # BASE_SPEC has zone: too
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    message = str(caught.value)
    assert "\n" not in message and "zone and zones are both set" in message


def test_zones_of_two_regions_are_refused(tmp_path: Path) -> None:
    path = write_spec(tmp_path, zone=None, zones=["us-central2-b", SECOND])
    with pytest.raises(SpecError, match=r"zones: zones span regions us-central1, us-central2"):
        loading.load_spec(path)


def test_first_zone_without_the_tpu_type_is_passed_over(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path) -> None:
    add_first_zone(fake)
    provider, _ = make_provider(zones_spec(tmp_path, "v5p-8", "v2-alpha-tpuv5"), fake, options)
    plan = provider.plan(None)
    assert zone_of(plan.files[config.FILE_NAME]) == SECOND
    notes = "\n".join(plan.notes)
    assert f"zone {SECOND} (from zones: {FIRST}, {SECOND})" in notes
    assert f"skipped {FIRST}: tpu_workers.tpu: v5p-8 is not offered in {FIRST}" in notes
    assert "pre-flight ✗" not in notes and plan.problems == []
    # The same spec with the type offered in the first zone stays there.
    fake.accelerator_types[FIRST].append(("v5p-8", "V5P", "2x2x1"))
    fake.runtime_versions[FIRST].append("v2-alpha-tpuv5")
    provider, _ = make_provider(zones_spec(tmp_path, "v5p-8", "v2-alpha-tpuv5"), fake, options)
    assert zone_of(provider.plan(None).files[config.FILE_NAME]) == FIRST


def test_no_zone_offering_the_type_is_one_line_and_creates_nothing(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path) -> None:
    add_first_zone(fake)
    provider, ray = make_provider(zones_spec(tmp_path, "v4-8", "tpu-ubuntu2204-base"), fake,
                                  options)
    with pytest.raises(GcpError) as caught:
        up(provider)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("gcp-tpu: no zone in zones: offers everything")
    assert f"{FIRST}: tpu_workers.tpu: v4-8 is not offered" in message
    assert ray.calls == [] and fake.nodes_with({"rayfleet-name": "zoned"}) == []


def test_no_zone_with_capacity_is_one_line_and_leaves_nothing_anywhere(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    add_first_zone(fake)
    fake.stockout_zones |= {FIRST, SECOND}
    provider, ray = make_provider(zones_spec(tmp_path, "v5litepod-8", "v2-alpha-tpuv5-lite"),
                                  fake, options)
    with pytest.raises(GcpError) as caught:
        up(provider)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"gcp-tpu: no zone had capacity for the head (tried {FIRST}, "
                              f"{SECOND}: ZONE_RESOURCE_POOL_EXHAUSTED)")
    ups = [c for c in ray.calls if c["args"][1] == "up"]
    assert [zone_of(c["config"]) for c in ups] == [FIRST, SECOND]
    # Each refused zone left a TERMINATED head that only the label sweep removes: it ran in both.
    for zone in (FIRST, SECOND):
        assert fake.calls("DELETE", f"zones/{zone}/instances/"), zone
        assert inventory(fake, zone) == []
    assert f"zone {FIRST} has no capacity for the head" in capsys.readouterr().err
    current = state.read("zoned")
    assert current is None or current.resources() == []


@pytest.mark.slow  # a real sshd plays the head in the second zone
def test_head_refused_for_capacity_moves_to_the_next_zone(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path,
        sshd: Sshd, dashboard: Dashboard, capsys: pytest.CaptureFixture[str]) -> None:
    add_first_zone(fake)
    fake.stockout_zones.add(FIRST)
    path = zones_spec(tmp_path, "v5litepod-8", "v2-alpha-tpuv5-lite",
                      dashboard={"port": dashboard.port})
    provider, ray = make_provider(path, fake, options, sshd, sshd.port)
    endpoint = up(provider)
    ups = [c for c in ray.calls if c["args"][1] == "up"]
    assert [zone_of(c["config"]) for c in ups] == [FIRST, SECOND]
    assert fake.calls("DELETE", f"zones/{FIRST}/instances/")  # the refused head was swept
    assert inventory(fake, FIRST) == []
    assert [n for n in inventory(fake, SECOND) if "head" in n]
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "no capacity for the head" in line]
    assert len(lines) == 1 and f"trying zone {SECOND}" in lines[0]
    current = state.read("zoned")
    assert current is not None
    cluster = current.find(Cluster, "zoned")
    assert cluster is not None and cluster.attrs.zone == SECOND
    assert endpoint.address == "10.128.0.2:6379"
    # Teardown sweeps the zone the cluster ended up in.
    with state.locked("zoned", "gcp-tpu", "teardown") as locked:
        provider.teardown(locked)
    assert fake.nodes_with({"rayfleet-name": "zoned"}) == []


@pytest.mark.slow  # a real sshd plays the head in the second zone
def test_up_works_from_the_plan_alone_and_changes_neither_spec_nor_plan(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path,
        sshd: Sshd, dashboard: Dashboard) -> None:
    add_first_zone(fake)
    fake.stockout_zones.add(FIRST)
    path = zones_spec(tmp_path, "v5litepod-8", "v2-alpha-tpuv5-lite",
                      dashboard={"port": dashboard.port})
    planner, _ = make_provider(path, fake, options)
    with state.locked("zoned", "gcp-tpu", "up") as current:
        plan = planner.plan(current)
        assert plan.extra.zones == (FIRST, SECOND) and plan.extra.report is not None
        # Another provider object, which never planned: the plan is all it gets.
        provider, ray = make_provider(path, fake, options, sshd, sshd.port)
        loaded, before = provider.spec, provider.spec.model_dump()
        cost = provider.cost_range(plan)
        assert cost is not None and cost.max_hourly_usd
        checks = len(fake.calls("GET", "acceleratorTypes"))
        provider.up(current, plan, UpOptions())
    assert len(fake.calls("GET", "acceleratorTypes")) == checks  # no second pre-flight
    ups = [c for c in ray.calls if c["args"][1] == "up"]
    assert [zone_of(c["config"]) for c in ups] == [FIRST, SECOND]  # moved on to SECOND...
    assert provider.spec is loaded and provider.spec.model_dump() == before  # ...in a copy
    assert loaded.zone == FIRST and zone_of(plan.files[config.FILE_NAME]) == FIRST
    with state.locked("zoned", "gcp-tpu", "teardown") as locked:
        provider.teardown(locked)
    assert fake.nodes_with({"rayfleet-name": "zoned"}) == []
