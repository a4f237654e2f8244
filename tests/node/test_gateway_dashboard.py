"""A member's dashboard through the real gateway: every background call of Ray's dashboard pages is
answered 200 in the shape the page reads, with the member's own jobs' items and none of another
member's, and what reaches Ray is the query the gateway built (tests/node/dashboard_fake.py
stands where Ray's dashboard would)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from tests.node import dashboard_fake as ray
from tests.node.gateway_bed import BO, OWNER, Bed, gateway_bed

SUMMARY = "/api/v0/tasks/summarize?filter_keys=job_id&filter_predicates=%3D&filter_values={job}"
DRIVER_LOG = "/api/v0/logs/file?node_id={node}&filename={name}&lines=50000&filter_ansi_code=true"
#: What the dashboard's Overview, Jobs (list and a job), Cluster (list and a node), Actors, Serve,
#: Metrics, Logs and platform-events pages call on their own (Ray 2.60's client, seen in Chromium).
PAGE_CALLS = [
    "/api/jobs/", "/api/jobs/raysubmit_ann1", "/nodes?view=summary", f"/nodes/{ray.NODE}",
    "/api/cluster_status?format=1", "/api/v0/cluster_metadata", "/timezone",
    "/usage_stats_enabled", "/api/v0/runtime_env_redaction", "/api/profiling_enabled",
    "/api/grafana_health", "/api/prometheus_health", "/api/serve/applications/",
    "/events", f"/events?job_id={ray.ANN_JOB}",
    SUMMARY.format(job=ray.ANN_JOB), SUMMARY.format(job=ray.ANN_JOB) + "&summary_by=lineage",
    f"/api/v0/tasks?detail=1&limit=10000&filter_keys=job_id&filter_predicates=%3D"
    f"&filter_values={ray.ANN_JOB}", "/api/v0/placement_groups?detail=1&limit=10000",
    "/logical/actors", f"/logical/actors/{ray.ANN_ACTOR}", f"/api/data/datasets/{ray.ANN_JOB}",
    f"/api/v0/logs?node_id={ray.NODE}",
    DRIVER_LOG.format(node=ray.NODE, name="job-driver-raysubmit_ann1.log"),
    f"/api/v0/logs/file?actor_id={ray.ANN_ACTOR}&lines=1000",
    f"/api/v0/tasks/timeline?download=1&job_id={ray.ANN_JOB}",
]


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:
        yield started


def _json(bed: Bed, target: str, token: str | None = None) -> object:
    status, body = bed.send("GET", target, **({"token": token} if token else {}))
    assert status == 200, (target, status, body)
    return json.loads(body)


def _other_members(body: bytes) -> list[str]:
    """What of bo's job, the driver started inside the cluster, or Ray's own processes shows."""
    marks = [ray.BO_JOB, ray.INSIDE_JOB, ray.BO_ACTOR, ray.INSIDE_ACTOR, ray.BO_TASK, "bo_task",
             "BoModel", "Inside", "DashboardAgent", "raysubmit_bo1", "bo's", "gcs_server",
             "raylet.out", "-ffffffff-", "bo_app"]
    return [m for m in marks if m.encode() in body]


def test_every_call_of_the_dashboards_pages_is_answered_200_and_shows_only_the_members_jobs(
        bed: Bed) -> None:
    for target in PAGE_CALLS:
        status, body = bed.send("GET", target)
        assert status == 200, (target, status, body)
        assert _other_members(body) == [], (target, body[:300])
    # The platform events page is looked for with HEAD: 404, as Ray answers without any configured
    # (the owner's dashboard below), so the member's page hides the tab as the owner's does.
    assert bed.send("HEAD", "/api/v0/platform_events")[0] == 404
    # What Ray answered for ann's own job is there, not an empty stand-in.
    summary = _json(bed, SUMMARY.format(job=ray.ANN_JOB))
    assert summary["data"]["result"]["total"] == 1  # type: ignore[index]
    ann_log = DRIVER_LOG.format(node=ray.NODE, name="job-driver-raysubmit_ann1.log")
    assert bed.send("GET", ann_log)[1] == b"the log job-driver-raysubmit_ann1.log\n"


def test_node_actor_task_and_event_views_hold_the_members_items_only(bed: Bed) -> None:
    summary = _json(bed, "/nodes?view=summary")
    stats = summary["data"]["summary"][0]["raylet"]["coreWorkersStats"]  # type: ignore[index]
    assert [s["jobId"] for s in stats] == [ray.ANN_JOB]
    detail = _json(bed, f"/nodes/{ray.NODE}")["data"]["detail"]  # type: ignore[index]
    assert [w["cmdline"] for w in detail["workers"]] == [["ray::AnnModel"]]
    assert list(detail["actors"]) == [ray.ANN_ACTOR]
    assert detail["hostname"] == "head"  # the node itself stays, as the docs say
    assert list(_json(bed, "/logical/actors")["data"]["actors"]) == [ray.ANN_ACTOR]  # type: ignore[index]
    tasks = _json(bed, "/api/v0/tasks?detail=1&limit=10000")["data"]["result"]  # type: ignore[index]
    assert [t["task_id"] for t in tasks["result"]] == [ray.ANN_TASK] and tasks["total"] == 1
    groups = _json(bed, "/api/v0/actors?detail=1")["data"]["result"]["result"]  # type: ignore[index]
    assert [g["actor_id"] for g in groups] == [ray.ANN_ACTOR]
    assert list(_json(bed, "/events")["data"]["events"]) == [ray.ANN_JOB]  # type: ignore[index]
    files = _json(bed, f"/api/v0/logs?node_id={ray.NODE}")["data"]["result"]  # type: ignore[index]
    assert sorted(f for names in files.values() for f in names) == sorted(ray.ANN_LOGS)
    # bo sees his own, and not ann's.
    bos = _json(bed, "/logical/actors", token=BO)["data"]["actors"]  # type: ignore[index]
    assert list(bos) == [ray.BO_ACTOR]


def test_another_members_job_is_answered_empty_and_never_asked_of_ray(bed: Bed) -> None:
    before = len(bed.upstream.seen)
    empty = {
        SUMMARY.format(job=ray.BO_JOB):
            lambda a: a["data"]["result"]["result"]["node_id_to_summary"]["cluster"]["summary"] == {},
        f"/events?job_id={ray.BO_JOB}": lambda a: a["data"]["events"] == [],
        f"/events?job_id={ray.INSIDE_JOB}": lambda a: a["data"]["events"] == [],
        f"/api/data/datasets/{ray.BO_JOB}": lambda a: a == {"datasets": []},
        f"/logical/actors/{ray.BO_ACTOR}": lambda a: a["data"]["detail"] is None,
        f"/api/v0/tasks/timeline?download=1&job_id={ray.BO_JOB}": lambda a: a == [],
        # A second filter would have Ray summarize more than the one job checked.
        SUMMARY.format(job=ray.ANN_JOB)
        + f"&filter_keys=job_id&filter_predicates=%21%3D&filter_values={ray.ANN_JOB}":
            lambda a: a["data"]["result"]["total"] == 0,
    }
    for target, is_empty in empty.items():
        assert is_empty(_json(bed, target)), target
    for target in (DRIVER_LOG.format(node=ray.NODE, name="job-driver-raysubmit_bo1.log"),
                   DRIVER_LOG.format(node=ray.NODE, name="gcs_server.out"),
                   DRIVER_LOG.format(node=ray.NODE, name="../job-driver-raysubmit_ann1.log"),
                   f"/api/v0/logs/file?actor_id={ray.BO_ACTOR}",
                   f"/api/v0/logs/file?task_id={ray.BO_TASK}"):
        status, text = bed.send("GET", target)
        # The log viewer shows this line in place of the file: the page says why.
        assert status == 200 and b"not open to members" in text, (target, text)
    asked = [p for _, p, _ in bed.upstream.seen[before:]]
    assert not [p for p in asked if ray.BO_JOB in p or "bo1" in p or "gcs_server" in p
                or ("/logs/file" in p and ray.BO_ACTOR in p)], asked


def test_what_reaches_ray_is_the_query_the_gateway_built(bed: Bed) -> None:
    before = len(bed.upstream.seen)
    bed.send("GET", DRIVER_LOG.format(node=ray.NODE, name="job-driver-raysubmit_ann1.log")
             + "&filename=job-driver-raysubmit_bo1.log&node_ip=10.0.0.1&lines=1;x")
    bed.send("GET", f"/api/v0/logs/file?task_id={ray.ANN_TASK}&suffix=err&stream=1")
    bed.send("GET", f"/events?job_id={ray.ANN_JOB}&x=1")
    logs = [(p, parse_qsl(p.partition("?")[2])) for _, p, _ in bed.upstream.seen[before:]
            if p.startswith("/api/v0/logs/file")]
    # Of two `filename`s the last is the one checked (bo's: not sent at all); of the task's
    # log, the id checked and the parameters the gateway knows, nothing else of the member's.
    assert [q for _, q in logs] == [[("task_id", ray.ANN_TASK), ("suffix", "err")]], logs
    assert not [p for _, p, _ in bed.upstream.seen[before:] if "x=1" in p or "node_ip" in p]


def test_a_log_file_shows_no_secret(bed: Bed) -> None:
    status, text = bed.send("GET", DRIVER_LOG.format(node=ray.NODE, name=ray.ANN_LOGS[1]))
    assert status == 200 and text == b"the log " + ray.ANN_LOGS[1].encode() + b"\nRAY_AUTH_TOKEN=<secret>\n"


def test_the_owner_gets_rays_own_answers(bed: Bed) -> None:
    status, body = bed.send("GET", "/api/serve/applications/", token=OWNER)
    assert status == 200 and b"bo_app" in body
    assert bed.send("GET", "/api/v0/platform_events", token=OWNER)[0] == 404  # Ray's own


def test_without_members_see_dashboard_the_views_stay_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch, members_see_dashboard=False) as closed:
        for target in ("/logical/actors", "/nodes?view=summary", "/api/serve/applications/"):
            status, text = closed.send("GET", target)
            assert status == 404 and b"not open to members" in text, target
        assert closed.upstream.seen == []


def test_a_members_dashboard_page_says_which_tabs_show_them_nothing(bed: Bed) -> None:
    status, page = bed.send("GET", "/")
    assert status == 200 and page.startswith(b"ray's answer to /")
    assert b"Signed in as ann" in page and b"Serve, Metrics and profiling are not open" in page
    assert b"your own jobs" in page
    status, page = bed.send("GET", "/", token=OWNER)
    assert status == 200 and b"rayfleet-member" not in page
