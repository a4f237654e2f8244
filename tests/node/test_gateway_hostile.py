"""The gateway against a member who sends any bytes: a recording upstream stands where Ray's
dashboard would, behind the real gateway over real TLS, and sees only what the rules authorized.

Requests are written byte for byte on a TLS socket (a client library would normalize them first,
which is exactly what an attacker does not do)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import gateway_packages as gk
from infra.node import gateway_state as gs
from tests.node.gateway_bed import BO, IDS, OWNER, RAY, Bed, gateway_bed


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:
        yield started


#: Paths a member's request may reach Ray at (the rules' allow list, written out again here).
_OWN = "|".join(IDS.values())
ALLOWED = re.compile(
    r"/api/jobs/(?:[A-Za-z0-9_-]{1,64}(?:/logs|/stop)?)?"
    rf"|/api/packages/gcs/_ray_pkg_rf(?:{_OWN})_[0-9a-f]{{16,64}}\.zip"
    r"|/api/version|/api/authentication_mode|/|/index\.html|/favicon\.ico|/logo\.svg|/timezone"
      r"|/api/cluster_status|/api/v0/cluster_metadata|/usage_stats_enabled"
      r"|/api/v0/runtime_env_redaction|/static/[A-Za-z0-9_.~/-]+"
    # The dashboard's own calls (gateway_dashboard.py), each id in Ray's hex form.
    r"|/nodes|/nodes/[0-9a-f]{56}|/logical/actors|/logical/actors/[0-9a-f]{32}|/events"
    r"|/api/v0/(?:tasks|tasks/summarize|tasks/timeline|actors|placement_groups|logs|logs/file)"
    r"|/api/data/datasets/[0-9a-f]{8}")
#: Every way of writing a dot segment, a separator or an escape that a path may carry.
TRICKS = ["..", ".", "%2E%2E", "%2e%2e", ".%2E", "%2E.", "%252E%252E", "%2E", "..%2F..", "%2F",
          "%2f", "", ";", "..;", "\\..", "%5C..", "%5c", "%3F", "%3f", "%23", "%25", "%00",
          "%2E%2E%2F", "..%252F", "%C0%AE%C0%AE", "...."]
#: Where a member is allowed something, so that a trick there could reach elsewhere.
BASES = ["/static/{t}/api/jobs/", "/static/js/{t}/{t}/api/v0/tasks", "/api/jobs/{t}/logs",
         "/api/jobs/raysubmit_ann1/{t}/{t}/raysubmit_bo1/logs", "/api/packages/gcs/{t}/x.zip",
         "/api/packages/gcs/_ray_pkg_0123456789abcdef{t}.zip", "/nodes/{t}/api/jobs/", "/{t}/api/jobs/",
         "/api/jobs/{t}", "/api/jobs/{t}?x=1", "/api/version/{t}/api/jobs/",
         "/logical/actors/{t}", "/api/data/datasets/{t}", "/nodes/{t}",
         "/api/data/datasets/01000000/{t}/api/jobs/"]


def _fuzz_targets() -> list[str]:
    return [base.replace("{t}", trick) for base in BASES for trick in TRICKS]


def test_the_upstream_sees_only_allow_listed_paths_whatever_a_member_sends(bed: Bed) -> None:
    sent = [(method, target) for target in _fuzz_targets()
            for method in ("GET", "POST", "PUT", "DELETE")]
    # Kept-alive connections (a member's client keeps them too): 1,560 TLS handshakes were ~4 CPU-s.
    statuses = {f"{method} {target}": status
                for (method, target), status in zip(sent, bed.send_all(sent), strict=True)}
    reached = [(m, p) for m, p, _ in bed.upstream.seen]
    wrong = [(m, p) for m, p in reached if not ALLOWED.fullmatch(p.partition("?")[0])]
    assert wrong == [], wrong
    # Nothing that reached Ray holds a dot segment, an escape or an empty segment.
    assert not [p for _, p in reached if re.search(r"/\.\.?(/|$)|%|//|;|\\", p)]
    # Dot segments in any encoding are refused before any rule, never collapsed into another path.
    assert statuses["GET /static/%2E%2E/api/jobs/"] == 400
    assert statuses["GET /static/../api/jobs/"] == 400
    assert statuses["GET /api/jobs/raysubmit_ann1/../../raysubmit_bo1/logs"] == 400
    # Ray's job list itself is asked by the gateway (filtered), never forwarded for a trick.
    listed = [p for m, p, _ in bed.upstream.seen if m == "GET" and p == "/api/jobs/"]
    assert len(listed) == sum(1 for k, v in statuses.items() if v == 200 and k.startswith(
        "GET ") and k.split(" ", 1)[1].partition("?")[0] in ("/api/jobs/", "/api/jobs"))


def test_a_submission_id_that_is_not_a_plain_name_is_refused(bed: Bed) -> None:
    for job in ("x?y", "a/../raysubmit_bo1", "x y", "x#y", "é", "a" * 65, 7):
        body = json.dumps({"entrypoint": "python -c 1", "submission_id": job}).encode()
        status, text = bed.send("POST", "/api/jobs/", body=body)
        assert (status, job) == (400, job) and b"submission_id" in text
    for target in ("/api/jobs/x%3Fy/stop", "/api/jobs/x%20y", "/api/jobs/" + "a" * 65 + "/logs"):
        assert bed.send("POST" if target.endswith("stop") else "GET", target)[0] == 400
    assert not [p for m, p, _ in bed.upstream.seen if m == "POST"]


def test_the_cluster_token_is_nobody_at_the_gateway(bed: Bed) -> None:
    for headers in ({"Authorization": f"Bearer {RAY}"}, {"X-Ray-Authorization": RAY},
                    {"Cookie": f"ray-authentication-token={RAY}"}):
        status, text = bed.send("GET", "/api/jobs/", token=None, headers=headers)
        assert status == 403 and b"unknown or revoked token" in text
    # The owner's own gateway token sees every job, the one started inside the cluster included.
    status, text = bed.send("GET", "/api/jobs/", token=OWNER)
    assert status == 200 and len(json.loads(text)) == 3


def test_a_member_sees_only_jobs_the_gateway_recorded_as_theirs(bed: Bed) -> None:
    status, text = bed.send("GET", "/api/jobs/")
    # The job started inside the cluster claims ann in its metadata: not evidence, not shown.
    assert status == 200 and [j["submission_id"] for j in json.loads(text)] == ["raysubmit_ann1"]
    # Another member's job is answered as Ray answers a job that does not exist.
    for method, target in (("GET", "/api/jobs/raysubmit_bo1"), ("GET", "/api/jobs/raysubmit_bo1/logs"),
                           ("POST", "/api/jobs/raysubmit_bo1/stop"),
                           ("DELETE", "/api/jobs/raysubmit_bo1")):
        status, text = bed.send(method, target)
        assert (status, text.strip()) == (404, b"Job raysubmit_bo1 does not exist")
    assert not [p for _, p, _ in bed.upstream.seen if "raysubmit_bo1" in p]


def test_a_member_cannot_replace_or_read_another_members_package(bed: Bed) -> None:
    name = "_ray_pkg_0123456789abcdef.zip"
    assert bed.send("PUT", f"/api/packages/gcs/{name}", token=BO, body=b"bo's starter")[0] == 200
    # ann asks for the same name: she does not see bo's, so her client uploads her own...
    assert bed.send("GET", f"/api/packages/gcs/{name}")[0] == 404
    assert bed.send("PUT", f"/api/packages/gcs/{name}", body=b"ann's code")[0] == 200
    # ...and a second PUT over a package that exists is refused, bo's own included.
    status, text = bed.send("PUT", f"/api/packages/gcs/{name}", token=BO, body=b"evil")
    assert status == 409 and b"never replaced" in text
    assert bed.upstream.packages == {gk.scoped(IDS["bo"], name): b"bo's starter",
                                     gk.scoped(IDS["ann"], name): b"ann's code"}
    # A submit names the member's own package, whatever URI it sends.
    body = json.dumps({"entrypoint": "python x.py",
                       "runtime_env": {"working_dir": f"gcs://{name}"}}).encode()
    assert bed.send("POST", "/api/jobs/", body=body)[0] == 200
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["runtime_env"]["working_dir"] == f"gcs://{gk.scoped(IDS['ann'], name)}"


def test_an_upload_past_its_cap_is_refused_and_nothing_is_stored(bed: Bed) -> None:
    status, text = bed.send("PUT", "/api/packages/gcs/_ray_pkg_0123456789abcdef00.zip",
                            body=b"x" * (1024 ** 2 + 1))
    assert status == 413 and b"sharing.max_upload_mb" in text
    assert bed.upstream.packages == {}


def test_a_member_may_not_set_how_ray_stops_their_job(bed: Bed) -> None:
    for name in ("RAY_JOB_STOP_WAIT_TIME_S", "RAY_JOB_STOP_SIGNAL", "ray_job_stop_wait_time_s"):
        body = json.dumps({"entrypoint": "python x.py",
                           "runtime_env": {"env_vars": {name: "1000000000"}}}).encode()
        status, text = bed.send("POST", "/api/jobs/", body=body)
        assert status == 400 and name.encode() in text
    assert not [p for m, p, _ in bed.upstream.seen if m == "POST"]


def test_every_audit_line_names_its_source_address(bed: Bed) -> None:
    bed.send("GET", "/api/jobs/", token=None)  # 401
    bed.send("GET", "/api/jobs/", token="wrong")  # 403
    bed.send("GET", "/static/%2E%2E/x")  # 400
    bed.send("GET", "/api/jobs/")  # 200
    lines = [json.loads(line) for line in
             (Path(bed.gateway.config.data_dir) / gs.AUDIT_FILE).read_text().splitlines()]
    assert [line["status"] for line in lines] == [401, 403, 400, 200]
    assert {line["source"] for line in lines} == {"127.0.0.1"}


def test_the_reaper_is_a_program_python_compiles() -> None:
    """The reaper runs as a Ray job's entrypoint (`python -c`): a syntax error would only show
    on a cluster, after a stop."""
    import ast

    from infra.node import gateway_stops

    tree = ast.parse(gateway_stops.REAPER)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert {"PlacementGroup", "remove_placement_group", "NodeAffinitySchedulingStrategy"} <= imported


def test_the_gateways_own_calls_keep_their_query(bed: Bed) -> None:
    """A path the gateway builds with a query (Ray's node table for the cost share) reaches Ray
    with that query, not with its `?` encoded into the path (the cost share then saw no node)."""
    from infra.node import gateway_prices as gp

    status, _ = bed.on_gateway(bed.gateway.upstream_raw("GET", gp.NODES_PATH))
    assert status == 200
    assert bed.upstream.seen[-1][1] == gp.NODES_PATH
