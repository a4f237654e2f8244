"""What a member's own cluster uses, and the limits that act on it (`isolation: cluster`, issue
48), without Ray: node time at the head machine's price share, budgets that stop the cluster,
jobs past max_job_hours stopped whatever they say, the running-jobs and upload caps counted on
the member's own cluster."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.node import gateway_isolated as gi
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt
from infra.node import member_clusters as mc
from infra.node import member_usage as mu

ALICE = gs.Member("alice", "member", id="0123456789abcdef")
HOUR = 3600.0


def clusters(tmp_path: Path, cpus: float = 1.0, **limits: Any) -> mc.MemberClusters:
    config = tmp_path / mc.CONFIG_FILE
    mc.write_starter_config(config, mc.StarterConfig(
        cluster="iso", tmp_root="/tmp", token_dir=str(tmp_path / "tokens"), gateway_uid=0,
        gateway_gid=0, python_bin="/usr/bin", cpus=cpus))
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / f"{ALICE.id}.token").write_text("member-cluster-token")
    made = mc.MemberClusters(str(config), mu.Limits(**limits), str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    made.verbs = []  # type: ignore[attr-defined]

    async def starter(verb: str, member_id: str, *args: str) -> dict[str, Any]:
        made.verbs.append((verb, member_id))  # type: ignore[attr-defined]
        return {}

    made.starter = starter  # type: ignore[method-assign]
    return made


def running(made: mc.MemberClusters, at: float) -> None:
    """Alice's cluster runs since `at` (what a start through the starter leaves)."""
    made.running[ALICE.id] = mc.Running(32000, 32001, time.monotonic())
    made.usage.started(ALICE.id, at)


def test_a_members_cost_is_their_clusters_node_time_at_the_head_machines_price_share(
        tmp_path: Path) -> None:
    cpus = float(os.cpu_count() or 1)
    made = clusters(tmp_path, cpus=cpus / 2, head_price_per_hour=3.0)
    running(made, 1000.0)
    made.usage.stopped(ALICE.id, "idle", 1000.0 + 1800)
    entry = made.usage.view(1000.0 + 5 * HOUR)[ALICE.id]  # stopped: no more time counts
    assert entry["state"] == "stopped" and entry["reason"] == "idle"
    assert entry["hours"] == pytest.approx(0.5)
    assert entry["usd"] == pytest.approx(0.5 * 3.0 * (cpus / 2) / cpus)
    # Kept on disk (0600) for the next gateway.
    again = mu.MemberUsage(made.usage.path, made.usage.limits, made.usage.share)
    assert again.view(1000.0 + 9 * HOUR)[ALICE.id]["hours"] == pytest.approx(0.5)
    assert made.usage.path.stat().st_mode & 0o777 == 0o600


def test_a_member_budget_reached_stops_their_cluster_and_refuses_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = clusters(tmp_path, member_budget_hours=1.0)
    monkeypatch.setattr(mu, "list_jobs", lambda url, token: [])
    running(made, time.time() - 1.5 * HOUR)
    asyncio.run(made.idle_check({ALICE.id}))
    assert ("stop", ALICE.id) in made.verbs  # type: ignore[attr-defined]
    assert ALICE.id not in made.running
    entry = made.usage.view()[ALICE.id]
    assert entry["state"] == "stopped" and "sharing.member_budget_hours" in entry["reason"]
    with pytest.raises(mc.Refused) as refused:
        asyncio.run(made.reach(ALICE.id))
    assert "\n" not in str(refused.value) and "member_budget_hours" in str(refused.value)


def test_the_clusters_budget_refuses_every_member_cluster(tmp_path: Path) -> None:
    reached: list[bool] = [False]
    made = clusters(tmp_path, budget_reached=lambda: reached[0])
    assert made.usage.refusal(ALICE.id) is None
    reached[0] = True
    assert "sharing.budget_usd" in (made.usage.refusal(ALICE.id) or "")


def test_a_job_past_max_job_hours_is_stopped_whatever_it_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On her own cluster every job is hers: one that claims another member in its metadata and
    environment is stopped all the same; a recent one and an ended one are not."""
    now_ms = time.time() * 1000
    jobs = [{"submission_id": "raysubmit_old", "status": "RUNNING",
             "start_time": now_ms - 3 * HOUR * 1000, "metadata": {"rayfleet_member": "bob"},
             "runtime_env": {"env_vars": {"RAYFLEET_MEMBER": "bob"}}},
            {"submission_id": "raysubmit_new", "status": "RUNNING", "start_time": now_ms},
            {"submission_id": "raysubmit_done", "status": "SUCCEEDED",
             "start_time": now_ms - 9 * HOUR * 1000}]
    stopped: list[str] = []
    monkeypatch.setattr(mu, "list_jobs", lambda url, token: jobs)
    monkeypatch.setattr(mu, "stop_job", lambda url, token, job_id: stopped.append(job_id))
    made = clusters(tmp_path, max_job_hours=2.0)
    running(made, time.time())
    asyncio.run(made.idle_check({ALICE.id}))
    assert stopped == ["raysubmit_old"]
    assert ALICE.id in made.running  # the cluster itself runs on (it was just started)


def request(method: str, length: int | None = None) -> Any:
    return SimpleNamespace(method=method, headers={}, content_length=length)


def test_the_running_jobs_cap_counts_the_members_own_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = clusters(tmp_path, max_running_jobs_per_member=2)
    jobs = [{"submission_id": "a", "status": "RUNNING"}, {"submission_id": "b",
                                                           "status": "SUCCEEDED"}]
    monkeypatch.setattr(mu, "list_jobs", lambda url, token: jobs)

    def submit() -> Any:
        return asyncio.run(gi.capped(made, ALICE, request("POST"), gt.read("/api/jobs/"),
                                     "http://127.0.0.1:1"))

    assert submit() is None
    jobs.append({"submission_id": "c", "status": "PENDING"})
    refused = submit()
    assert refused.status == 429
    assert "sharing.max_running_jobs_per_member" in refused.text and "\n" not in \
        refused.text.strip()


def test_the_upload_caps_hold_by_content_length_and_the_members_total(tmp_path: Path) -> None:
    made = clusters(tmp_path, max_upload_mb=1.0, max_member_upload_mb=1.5)
    path = gt.read("/api/packages/gcs/_ray_pkg_x.zip")
    mb = 1024 * 1024

    def upload(size: int | None) -> Any:
        return asyncio.run(gi.capped(made, ALICE, request("PUT", size), path,
                                     "http://127.0.0.1:1"))

    assert "sharing.max_upload_mb" in upload(2 * mb).text
    assert upload(None).status == 413  # no length: nothing to check it by
    assert upload(mb) is None
    assert "sharing.max_member_upload_mb" in upload(mb).text  # 2 MB in all is past 1.5


def test_a_previous_gateways_running_record_is_closed_at_its_last_accrual(
        tmp_path: Path) -> None:
    made = clusters(tmp_path, head_price_per_hour=1.0)
    made.usage.started(ALICE.id, 1000.0)
    made.usage.accrue(ALICE.id, 1000.0 + HOUR)
    made.usage.close_stale(set())
    entry = made.usage.view(1000.0 + 10 * HOUR)[ALICE.id]
    assert entry["state"] == "stopped" and entry["hours"] == pytest.approx(1.0)


def test_each_idle_check_saves_what_members_and_status_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = clusters(tmp_path)
    monkeypatch.setattr(mu, "list_jobs", lambda url, token: [])
    running(made, time.time() - HOUR / 2)
    asyncio.run(made.idle_check({ALICE.id}))
    assert ALICE.id in made.running  # busy just now: not idle
    on_disk = mu.MemberUsage(made.usage.path, mu.Limits(), 1.0).data[ALICE.id]
    assert on_disk["state"] == "running" and on_disk["hours"] == pytest.approx(0.5, abs=0.01)


def test_a_members_own_usage_view_counts_their_clusters_node_time(tmp_path: Path) -> None:
    """`rayfleet usage` and the dashboard's banner: the hours their budget is counted by."""
    from infra.node import gateway_usage_view as uv

    made = clusters(tmp_path)
    made.usage.started(ALICE.id, 1000.0)
    made.usage.stopped(ALICE.id, "idle", 1000.0 + 3 * HOUR)
    gateway = SimpleNamespace(
        config=SimpleNamespace(cluster="iso", member_budget_hours=4.0, member_budget_usd=None,
                               max_running_jobs_per_member=2),
        usage=gs.Usage(tmp_path / "usage.json"),
        members=SimpleNamespace(person_ids=lambda who: (who.id,)), member_clusters=made)
    found = uv.view(gateway, ALICE)
    assert found["job_hours"] == pytest.approx(3.0) and found["used"] == pytest.approx(0.75)
    assert "3.00 job-hours" in uv.banner_line(gateway, ALICE)


def test_a_log_tail_past_max_member_tails_is_refused_before_reaching_the_cluster(
        tmp_path: Path) -> None:
    """`ray job logs -f` relayed to her own cluster holds one of her tails, as on a shared
    cluster: past `max_member_tails`, 429 in one line and nothing relayed."""
    from infra.node import gateway_limits as gl

    made = clusters(tmp_path)
    running(made, time.time())
    caps = gl.Caps(SimpleNamespace(max_member_tails=1))
    assert caps.take(gl.TAILS, ALICE.id)  # her one tail, open elsewhere
    gateway = SimpleNamespace(member_clusters=made, caps=caps)
    socket = SimpleNamespace(method="GET", headers={"Upgrade": "websocket"})
    answered = asyncio.run(gi.route(gateway, socket, ALICE,
                                    gt.read("/api/jobs/raysubmit_x/logs/tail")))
    assert answered is not None
    refused, _ = answered
    assert refused.status == 429 and "sharing.max_member_tails" in refused.text
