"""GCP cost estimates from the dated price table: labelled as estimates, the range of a spec from
min to max size, and what listed VMs/TPU nodes cost now."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from infra import providers
from infra.cli import loading
from infra.core import spec
from infra.providers.gcp_tpu import config, prices
from infra.providers.gcp_tpu.spec import Spec

#: A head, a CPU type (1 to 3 workers) and a TPU type (0 to 2 v4-8 slices).
HEAD_CPU_TPU: dict[str, object] = {
    "head": {"machine_type": "n2-standard-4"},
    "cpu_workers": {"cpu": {"machine_type": "n2-standard-8", "provisioning": "standard",
                            "min_workers": 1, "max_workers": 3}},
    "tpu_workers": {"tpu": {"accelerator_type": "v4-8", "min_workers": 0, "max_workers": 2}}}


def _spec(tmp_path: Path, extra: dict[str, object]) -> spec.ClusterSpec:
    data = {"provider": "gcp-tpu", "project": "test-project", "zone": "us-central2-b", **extra}
    return loading.parse_spec(tmp_path / "c.yaml", data)


def test_range_from_min_to_max(tmp_path: Path) -> None:
    selected = _spec(tmp_path, HEAD_CPU_TPU)
    cost = providers.create(selected).cost_range(None)
    assert cost is not None
    assert (cost.min_nodes, cost.max_nodes) == (2, 6)
    assert abs(cost.min_hourly_usd - (0.1942 + 0.3885)) < 1e-9  # type: ignore[operator]
    # v4-8: 4 chips at $3.22.
    assert abs(cost.max_hourly_usd - (0.1942 + 3 * 0.3885 + 2 * 4 * 3.22)) < 1e-9  # type: ignore[operator]
    assert cost.source.startswith("estimate:") and prices.AS_OF in cost.source


def test_max_workers_caps_the_maximum_at_one_size(tmp_path: Path) -> None:
    """max_workers below the types' sum: the maximum is the capped size, the dearest types first
    (not the sum of every type's max_workers next to a note that it cannot be reached)."""
    selected = _spec(tmp_path, {
        "head": {"machine_type": "n2-standard-4"}, "max_workers": 3,
        "cpu_workers": {"cpu": {"machine_type": "n2-standard-8", "provisioning": "standard",
                                "min_workers": 1, "max_workers": 3}},
        "tpu_workers": {"tpu": {"accelerator_type": "v4-8", "min_workers": 0, "max_workers": 2}}})
    cost = providers.create(selected).cost_range(None)
    assert cost is not None and (cost.min_nodes, cost.max_nodes) == (2, 4)
    assert abs(cost.max_hourly_usd - (0.1942 + 1 * 0.3885 + 2 * 4 * 3.22)) < 1e-9  # type: ignore[operator]
    assert "caps" not in cost.source


def test_node_prices_name_the_rendered_configs_types(tmp_path: Path) -> None:
    """The sharing gateway prices each node Ray's autoscaler reports by its type's name in the
    rendered cluster config: `head` and the spec's worker type names."""
    selected = _spec(tmp_path, HEAD_CPU_TPU)
    found = providers.create(selected).cost_range(None).node_prices
    assert found is not None and found.head_type == "head"
    assert dict(found.by_type) == {"head": 0.1942, "cpu": 0.3885, "tpu": 4 * 3.22}
    assert abs(found.floor_usd - (0.1942 + 0.3885)) < 1e-9
    assert isinstance(selected, Spec)
    rendered = yaml.safe_load(config.render_cluster_yaml(selected, "ssh-ed25519 AAAA x", "/k"))
    assert set(rendered["available_node_types"]) == set(found.by_type)
    assert rendered["head_node_type"] == found.head_type
    unknown = _spec(tmp_path, {"head": {"machine_type": "m3-ultramem-32"}})
    assert providers.create(unknown).cost_range(None).node_prices is None


def test_unknown_type_gives_no_price(tmp_path: Path) -> None:
    selected = _spec(tmp_path, {"head": {"machine_type": "m3-ultramem-32"}})
    cost = providers.create(selected).cost_range(None)
    assert cost is not None and cost.max_hourly_usd is None and "not in the table" in cost.source


def test_current_cost_of_listed_resources() -> None:
    hour_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).isoformat()
    vms = [{"name": "h", "status": "RUNNING", "machineType": "zones/z/machineTypes/n2-standard-4",
            "creationTimestamp": hour_ago, "labels": {}},
           {"name": "tpu-vm", "status": "RUNNING", "machineType": "x/n2-standard-4",
            "creationTimestamp": hour_ago, "labels": {"tpu_cores": "8"}},
           {"name": "off", "status": "TERMINATED", "machineType": "x/n2-standard-4"}]
    tpus = [{"name": "t", "state": "READY", "acceleratorType": "v4-8", "createTime": hour_ago,
             "schedulingConfig": {"spot": True}}]
    cost = prices.current_cost(vms, tpus)
    assert cost.nodes == 2
    assert abs(cost.hourly_usd - (0.1942 + 4 * 3.22 * prices.DISCOUNTED_FACTOR)) < 1e-3  # type: ignore[operator]
    assert abs(cost.accrued_usd - cost.hourly_usd) < 0.01  # type: ignore[operator]
    assert cost.uptime_s is not None and 3590 < cost.uptime_s < 3700
    assert cost.source.startswith("estimate:")
