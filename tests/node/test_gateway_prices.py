"""The cluster's $/h for the gateway's cost share (infra/node/gateway_prices.py), from Ray's answers.

The files in tests/data/ray-answers/ are answers of a real Ray 2.60 head's dashboard, recorded on
this machine: `ray start --head` and one `ray start --address` worker, each with
`RAY_NODE_TYPE_NAME` set as Ray's v2 autoscaler sets it (`head`, `gpu_a100`), the head once with
`RAY_enable_autoscaler_v2=1` (its monitor is then v2: the `_v2` files) and once without (v1, in
read-only mode as there is no cluster config: `cluster_status_v1_readonly.json`);
`nodes_one_dead_v1.json` is the unfiltered node list after the worker's raylet was killed. The v1
autoscaler's full report is made by Ray's own code (`_dashboard_answer`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_prices as gp

ANSWERS = Path(__file__).parent.parent / "data" / "ray-answers"
PRICES = {"head": 0.196, "gpu_a100": 0.75, "cpu_small": 0.1}
NOW = 1_795_659_900.0  # when the answers were recorded (their start_time_ms), in seconds


def _recorded(name: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((ANSWERS / name).read_text())
    return answer


def _dashboard_answer(summary: Any, at: float = NOW) -> dict[str, Any]:
    """What Ray's dashboard answers at /api/cluster_status, made by Ray's own code: the monitor
    stores `asdict(AutoscalerSummary)` as JSON (monitor.py), the dashboard's handler answers it
    through `rest_response`, which camel-cases every key (reporter_head.py)."""
    from dataclasses import asdict

    from ray.dashboard.routes import rest_response
    from ray.dashboard.utils import HTTPStatusCode

    stored = json.loads(json.dumps({"autoscaler_report": asdict(summary), "time": at}))
    response = rest_response(HTTPStatusCode.OK, "Got cluster status.", autoscaling_status=None,
                             autoscaling_error=None, cluster_status=stored)
    answer: dict[str, Any] = json.loads(response.text or "")
    return answer


def test_the_clusters_price_is_that_of_the_nodes_rays_v1_autoscaler_reports() -> None:
    from ray.autoscaler._private.autoscaler import AutoscalerSummary

    prices = {"head": 0.5, "gpu_a100": 1.25, "cpu_small": 0.1}
    answer = _dashboard_answer(AutoscalerSummary(
        active_nodes={"head": 1, "gpu_a100": 2}, idle_nodes=None,
        pending_nodes=[("10.0.0.9", "gpu_a100", "setting-up")],  # launched: billed already
        pending_launches={"cpu_small": 3},  # not launched yet: not billed
        failed_nodes=[]))
    # What the camel-casing does to a type's name:
    assert "gpuA100" in answer["data"]["clusterStatus"]["autoscalerReport"]["activeNodes"]
    assert gp.cluster_hourly(answer, None, prices, "head", 9.0, NOW) == pytest.approx(0.5 + 3 * 1.25)
    # A provider that does not list the head: its price counts all the same (the gateway runs
    # on it); a type without a price counts nothing.
    answer = _dashboard_answer(AutoscalerSummary(
        active_nodes={"gpu_a100": 1, "mystery": 4}, idle_nodes=None, pending_nodes=[],
        pending_launches={}, failed_nodes=[]))
    assert gp.cluster_hourly(answer, None, prices, "head", 9.0, NOW) == pytest.approx(0.5 + 1.25)
    # The v1 report, when current, wins over the node table (it counts launching nodes too).
    nodes = _recorded("nodes_alive_v2.json")
    assert gp.cluster_hourly(answer, nodes, prices, "head", 9.0, NOW) == pytest.approx(0.5 + 1.25)
    # No autoscaler (its report absent), or no answer: the fixed price.
    from ray.dashboard.routes import rest_response
    from ray.dashboard.utils import HTTPStatusCode

    bare = json.loads(rest_response(HTTPStatusCode.OK, "Got cluster status.",
                                    autoscaling_status=None, autoscaling_error=None,
                                    cluster_status=None).text or "")
    assert gp.cluster_hourly(bare, None, prices, "head", 9.0, NOW) == 9.0
    assert gp.cluster_hourly(None, None, prices, "head", 9.0, NOW) == 9.0


def test_with_rays_v2_autoscaler_the_price_comes_from_the_node_table() -> None:
    """The bug this module fixes: with v2 the report is null, and the price was the fixed one
    (the head alone) while a worker ran."""
    status = _recorded("cluster_status_v2.json")
    assert status["data"]["clusterStatus"] is None  # what v2 gives at /api/cluster_status
    assert gp.report_counts(status, NOW) is None
    nodes = _recorded("nodes_alive_v2.json")
    assert gp.cluster_hourly(status, nodes, PRICES, "head", 0.196, NOW) == pytest.approx(
        0.196 + 0.75)
    # Without the worker: the head alone.
    head_only = copy.deepcopy(nodes)
    rows = head_only["data"]["result"]["result"]
    rows[:] = [row for row in rows if row["is_head_node"]]
    assert gp.cluster_hourly(status, head_only, PRICES, "head", 9.0, NOW) == pytest.approx(0.196)


def test_the_node_table_counts_alive_nodes_the_head_by_its_flag_and_a_tpu_slice_once() -> None:
    listing = _recorded("nodes_one_dead_v1.json")
    states = sorted(row["state"] for row in listing["data"]["result"]["result"])
    assert states == ["ALIVE", "DEAD"]
    # The dead worker counts nothing; the head counts under the configured head type whatever
    # its label says (`ray up` with v1 gives it none).
    assert gp.table_counts(listing, "lambda_head") == {"lambda_head": 1}
    nodes = _recorded("nodes_alive_v2.json")
    rows = nodes["data"]["result"]["result"]
    worker = next(row for row in rows if not row["is_head_node"])
    # A two-host TPU slice: two Ray nodes of one type with the slice's label, billed once; a
    # node of a type without a label (a v1 worker) or without a price counts nothing.
    hosts = []
    for host in range(2):
        row = copy.deepcopy(worker)
        row["node_id"] = f"tpu-host-{host}"
        row["labels"] = {gp.NODE_TYPE_LABEL: "tpu_v4_16", gp.TPU_SLICE_LABEL: "slice-a"}
        hosts.append(row)
    unlabelled = copy.deepcopy(worker)
    unlabelled["node_id"], unlabelled["labels"] = "plain", {}
    rows.extend([*hosts, unlabelled])
    assert gp.table_counts(nodes, "head") == {"head": 1, "gpu_a100": 1, "tpu_v4_16": 1}
    prices = {**PRICES, "tpu_v4_16": 12.88}
    assert gp.cluster_hourly(None, nodes, prices, "head", 0.0, NOW) == pytest.approx(
        0.196 + 0.75 + 12.88)


def test_a_read_only_or_stale_v1_report_gives_way_to_the_node_table() -> None:
    from ray.autoscaler._private.autoscaler import AutoscalerSummary

    nodes = _recorded("nodes_alive_v2.json")
    # `ray start --head` without a cluster config: a read-only v1 monitor that names nodes by id.
    readonly = _recorded("cluster_status_v1_readonly.json")
    assert readonly["data"]["clusterStatus"]["autoscalerReport"]["legacy"] is True
    assert gp.cluster_hourly(readonly, nodes, PRICES, "head", 9.0, NOW) == pytest.approx(0.946)
    # A monitor that stopped writing: its last report is old, the node table is now.
    old = _dashboard_answer(AutoscalerSummary(
        active_nodes={"head": 1}, idle_nodes=None, pending_nodes=[], pending_launches={},
        failed_nodes=[]), at=NOW - gp.STALE_REPORT_S - 1)
    assert gp.report_counts(old, NOW) is None
    assert gp.cluster_hourly(old, nodes, PRICES, "head", 9.0, NOW) == pytest.approx(0.946)
    assert gp.report_counts(old, NOW - 2) == {"head": 1}
