"""An autoscaling Ray cluster on the 2-host Slurm test bed, through its login host (issue 14), who
can reach its Ray (issue 11), its MLflow server seen from an autoscaled worker (issue 24), and its
`metrics: prometheus` (issue 31): the head's job runs the distribution's real Prometheus under the
head daemons' supervisor, Ray's own discovery file brings in the workers Ray's autoscaler submits,
`invoke top` and `invoke report` reach it through the cluster's SSH tunnel, and teardown keeps its
history before the job goes.

One cluster serves every scenario (tests/slurm/elastic.py): its head's job holds all of one host;
worker type `cpu` (1 CPU, 0..2) fits twice on the other, once while another user's job holds the
rest of it (a second worker job then stays PENDING: the partition is full). Ray's own autoscaler
(v2, on the head) submits and cancels the worker jobs through our node provider; nothing is
patched. A job wanting 3 nodes, each logging an MLflow run, scales it 0 -> 2 -> 0 workers (the
`scaled` fixture, once per cluster); Prometheus killed comes back; the last test tears it down
with a worker running, and the history kept then shows the 0 -> 2 -> 0 and opens in a real
headless Chromium. Each test can run alone (the `elastic` fixture hands it the cluster up with
its head alone, and brings it up again after the teardown scenario).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from bench import slurm_autoscale
from infra.node.slurm import queue
from infra.providers.slurm.script import HEAD_TYPE
from tests.browser_metrics import check_report_page, docs_screenshot, terminal_screenshot
from tests.kept_history import check_workers_went_0_2_0, kept_run
from tests.slurm.conftest import login_spec, ok, ray_left_on_hosts, temp_marker
from tests.slurm.elastic import NAME, SPEC, Elastic, Round, node_targets, scale_0_2_0
from tests.testbed.hosts import Host, ray_bin_dir
from tests.testbed.slurm import SlurmCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def module_cluster(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Elastic]:
    work = tmp_path_factory.mktemp("elastic")
    cpus = int(slurm_cluster.run("sinfo -h -o %c", check=True).stdout.split()[0].rstrip("+"))
    assert cpus >= 2, f"the bed's nodes have {cpus} CPU: two workers must fit on one"
    cluster = Elastic(login_spec(work, slurm_cluster, NAME, SPEC.format(cpus=cpus)),
                      work / "home", slurm_cluster, cpus=cpus)
    try:
        yield cluster
    finally:
        if (cluster.home / "state" / f"{NAME}.json").exists():
            cluster.invoke("teardown")


@pytest.fixture
def elastic(module_cluster: Elastic) -> Elastic:
    """The module's cluster, up (again, after the teardown scenario) with its head alone."""
    if not (module_cluster.home / "state" / f"{NAME}.json").exists():
        started = time.monotonic()
        up = module_cluster.invoke("up")
        ok(up)
        print(f"\n[elastic] up in {time.monotonic() - started:.1f}s")
        assert "metrics: Prometheus starting in the head's job" in up.stderr, up.stderr
        module_cluster.scaled, module_cluster.ran = None, []
    wait_until(lambda: module_cluster.workers() == [] or None, "the head alone (no worker job)")
    return module_cluster


@pytest.fixture
def scaled(elastic: Elastic) -> Round:
    """The cluster's 0 -> 2 -> 0 round (tests/slurm/elastic.py), run once per cluster."""
    if elastic.scaled is None:
        elastic.scaled = scale_0_2_0(elastic)
    return elastic.scaled


PROBE = """
import json, os, socket, sys
head, gcs, client, agent, dashboard = sys.argv[1], *map(int, sys.argv[2:6])
result = {}
for name, port in (("gcs", gcs), ("client", client), ("agent", agent), ("dashboard", dashboard)):
    try:
        socket.create_connection((head, port), timeout=3).close()
        result[name] = "open"
    except OSError as exc:
        result[name] = type(exc).__name__
import requests
token = os.environ.get("PROBE_TOKEN_FILE")
headers = {"Authorization": "Bearer " + open(token).read().strip()} if token else {}
answer = requests.get(f"http://{head}:{agent}/api/job_agent/jobs/nosuchjob/logs",
                      headers=headers, timeout=10)
result["job_api"] = answer.status_code
from ray._raylet import GcsClient
try:
    nodes = GcsClient(address=f"{head}:{gcs}").get_all_node_info(timeout=10)
    result["gcs_nodes"] = len(nodes)
except Exception as exc:
    result["gcs_nodes"] = str(exc).splitlines()[0][:200]
print("PROBE " + json.dumps(result))
"""


def probe(host: Host, job: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    base = int(job["port_base"])
    args = [job["head_ip"], job["gcs_port"], job["client_port"], base + 5, job["dashboard_port"]]
    done = host.run(f"python3 - {' '.join(str(a) for a in args)} <<'EOF'\n{PROBE}\nEOF",
                    env={"RAY_USAGE_STATS_ENABLED": "0", **env}, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, f"{done.stdout}\n{done.stderr}"
    return dict(json.loads(lines[-1].removeprefix("PROBE ")))


def test_another_host_reaches_the_ports_but_not_ray_without_the_token(elastic: Elastic) -> None:
    job = elastic.job
    other = elastic.other_host()
    token = elastic.slurm.jobs_dir / "keys" / job["cluster_id"] / "ray-token"
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    without = probe(other, job, {"RAY_AUTH_MODE": "disabled"})
    # TCP reaches Ray's ports (the GCS must be reachable for workers), the dashboard is loopback.
    assert without["gcs"] == without["client"] == without["agent"] == "open", without
    assert without["dashboard"] == "ConnectionRefusedError", without
    # ...but neither the job API nor the GCS (Ray's own client) answers without the token.
    assert without["job_api"] == 401, without
    assert not isinstance(without["gcs_nodes"], int), without
    with_token = probe(other, job, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                                    "PROBE_TOKEN_FILE": str(token)})
    assert with_token["job_api"] != 401 and with_token["gcs_nodes"] == 1, with_token


def test_prometheus_scrapes_every_node_and_top_agrees_with_ray(elastic: Elastic) -> None:
    # Not an empty list: Prometheus can list the head's own ports before Ray's discovery file
    # names the head's node (a run at load ~9 saw `[]`, which is an answer to wait_until).
    nodes = wait_until(lambda: node_targets(elastic) or None,
                       "every Prometheus target up, the head's node among them", timeout=120)
    alive = elastic.alive_nodes()
    assert len(nodes) == alive == 1, (nodes, alive)
    # On the head's loopback, like the dashboard: another host of the cluster's network gets
    # nothing (Prometheus has no login). Bounded by the spec, its database on the shared work
    # dir, per cluster name.
    [process] = elastic.prometheus_processes()
    probe = elastic.other_host().run(f"curl -s --max-time 5 http://{elastic.job['head_ip']}:"
                                     f"{elastic.block.prometheus}/-/ready", timeout=30)
    assert probe.returncode == 7, (probe.returncode, probe.stdout)  # 7: could not connect
    store = elastic.slurm.jobs_dir / "metrics" / NAME
    for flag in (f"--web.listen-address=127.0.0.1:{elastic.block.prometheus}",
                 "--storage.tsdb.retention.time=2d", "--storage.tsdb.retention.size=256MB",
                 f"--storage.tsdb.path={store}/tsdb"):
        assert flag in process.split(), process
    # Ray's dashboard was told where it is (RAY_PROMETHEUS_HOST): its health check passes.
    health = elastic.head_host().run(
        f"curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $(cat "
        f"{elastic.slurm.jobs_dir}/keys/{elastic.job['cluster_id']}/ray-token)\" "
        f"http://127.0.0.1:{elastic.job['dashboard_port']}/api/prometheus_health", timeout=30)
    assert health.stdout.strip() == "200", health.stdout + health.stderr
    frame = elastic.top()
    assert sum(t["count"] for t in frame["nodes"]) == alive
    # The head's job holds every CPU of its host.
    assert sum(t["cpu_total"] for t in frame["nodes"]) == elastic.cpus


def test_scale_from_zero_runs_the_job_on_both_hosts_then_the_idle_worker_goes(
        elastic: Elastic) -> None:
    assert elastic.workers() == [] and elastic.alive_nodes() == 1
    started = time.monotonic()
    # The job, timed by bench/slurm_autoscale.py's own arm (CI measures that bench here).
    env = {**os.environ, "PATH": f"{ray_bin_dir()}:{os.environ['PATH']}",
           "RAYFLEET_HOME": str(elastic.home)}
    placed, result = slurm_autoscale.run_ours(env, elastic.spec)
    elastic.ran.append("SUCCEEDED")
    print(f"\n[elastic] 2-node job from zero workers: {time.monotonic() - started:.1f}s; "
          f"bench/slurm_autoscale.py: demand -> worker joined {placed:.1f}s")
    assert 0 < placed < time.monotonic() - started, placed
    assert result["hosts"] == sorted(h.hostname for h in elastic.slurm.nodes)
    workers = elastic.workers()
    assert len(workers) == 1 and workers[0]["state"] == "RUNNING", workers
    assert workers[0]["name"].startswith(f"rf-elastic-{elastic.job['cluster_id']}-w-cpu-")
    # The worker's walltime ends before the head's (spec: 1:00:00 for both).
    limits = dict(line.split() for line in elastic.slurm.run(
        "squeue -h -o '%i %L'", check=True).stdout.splitlines())
    head_left = queue.time_limit_seconds(limits[str(elastic.job["job_id"])])
    assert queue.time_limit_seconds(limits[workers[0]["id"]]) < head_left
    # Idle, the worker's job is cancelled; the head stays.
    started = time.monotonic()
    wait_until(lambda: elastic.workers() == [] or None, "the idle worker's job to be cancelled")
    print(f"\n[elastic] idle worker gone after {time.monotonic() - started:.1f}s")
    assert [j["state"] for j in elastic.jobs()] == ["RUNNING"]
    assert elastic.alive_nodes() == 1
    # bench/slurm_autoscale.py's other arm on the freed host: a plain `ray start` in a bare sbatch
    # job, cancelled once started; the head is alone again after it.
    job = elastic.job
    token = elastic.slurm.jobs_dir / "keys" / job["cluster_id"] / "ray-token"
    bare = slurm_autoscale.run_bare(elastic.slurm, f"{job['head_ip']}:{job['gcs_port']}", token)
    print(f"[elastic] bench/slurm_autoscale.py: bare sbatch -> running + ray start {bare:.1f}s")
    assert bare > 0
    wait_until(lambda: elastic.ray_alive() == 1 or None, "the bare node to leave Ray")


def test_autoscaled_workers_appear_in_prometheus_and_top_then_go(scaled: Round,
                                                                  elastic: Elastic) -> None:
    assert len({t["labels"]["instance"] for t in scaled.nodes}) == 3
    frame = scaled.frame
    assert sum(t["count"] for t in frame["nodes"]) == scaled.alive == 3, (frame, scaled.alive)
    # Three Ray nodes on the two hosts (both workers on the other host), each agent measuring its
    # whole host (here: this machine): every host's memory counted once, not once per agent.
    hosts = 2 * psutil.virtual_memory().total
    assert sum(t["mem_total"] for t in frame["nodes"]) == pytest.approx(hosts, rel=0.01), frame
    if os.environ.get("RAYFLEET_DOCS_SCREENSHOTS"):
        # This very frame as `top --once` prints it (the cluster may shrink while a second `top`
        # runs).
        from rich.console import Console

        from infra.cli.metrics import render_frame

        console = Console(width=130, record=True, file=io.StringIO())
        console.print(render_frame(frame))
        docs_screenshot("top-slurm.png",
                        terminal_screenshot(console.export_text(), elastic.home, 330))
    # Done and idle for 0.2 min: the autoscaler cancelled both; Prometheus followed Ray's file.
    after = scaled.after
    assert sum(t["count"] for t in after["nodes"]) == scaled.after_alive == 1
    # Nothing is launching any more: no resources shown as pending (Ray's gauge keeps the last
    # launch's value; top counts it only while a node is pending).
    assert after["pending"] == {"resources": {}, "launching": {},
                                "removed_last_5m": after["pending"]["removed_last_5m"]}, after


def test_autoscaled_workers_log_to_the_heads_tracking_server(scaled: Round,
                                                            elastic: Elastic) -> None:
    """The round's job logged a run from each of its three nodes (the head and two autoscaled
    workers, tests/slurm/elastic.py's TRACKED_ROUND) with nothing about MLflow in its code."""
    # Every run is in the server's store on the shared work dir, each from the host it ran on.
    store = elastic.slurm.jobs_dir / "tracking" / NAME / "mlflow.db"
    with contextlib.closing(sqlite3.connect(store)) as db:
        hosts = sorted(row[0] for row in db.execute(
            "SELECT p.value FROM params p JOIN metrics m ON m.run_uuid = p.run_uuid "
            "WHERE p.key = 'host' AND m.key = 'on_node' AND m.value = 1.0"))
    other = elastic.other_host().hostname
    assert hosts == sorted([elastic.head_host().hostname, other, other]), hosts
    # The workers read the password from its file: it did not come with the autoscaler's sbatch
    # environment, which slurmctld keeps (the cluster id did, which shows the check looks).
    password = (elastic.home / "keys" / NAME / "mlflow-password").read_text().strip()
    assert len(scaled.environments) == 2, scaled.environments.keys()
    for environment in scaled.environments.values():
        assert f"RF_CLUSTER_ID={elastic.job['cluster_id']}" in environment
        assert password not in environment


def test_killed_prometheus_is_said_in_one_line_and_comes_back(elastic: Elastic) -> None:
    [process] = elastic.prometheus_processes()
    pid = process.split()[0]
    head = elastic.head_host()
    pidfile = f"{elastic.job['temp_dir']}/rayfleet-metrics.json.pid"
    supervisor = json.loads(head.run(f"cat {pidfile}", check=True).stdout)["supervisor"]["pid"]
    # Held still while Prometheus is killed, so that `top` meets it gone (its restart takes ~1 s).
    head.run(f"kill -STOP {supervisor} && kill -KILL {pid}", check=True)
    try:
        wait_until(lambda: elastic.prometheus("/-/ready") is None and not any(
            p.split()[0] == pid for p in elastic.prometheus_processes()),
            "the killed Prometheus gone", timeout=30, interval=0.5)
        for verb in (("top", "--once"), ("report", "--out", str(elastic.home / "x.html"))):
            said = elastic.invoke(*verb)
            assert said.returncode != 0, said.stdout
            lines = said.stderr.strip().splitlines()
            assert len(lines) == 1 and "Prometheus" in lines[0] and "supervisor" in lines[0], lines
    finally:
        head.run(f"kill -CONT {supervisor}", check=True)
    # The same supervisor starts it again: no `up` needed on Slurm. Seen ready on the head's
    # loopback first (a poll there costs no `invoke`), then `top` answers through the tunnel.
    ready = f"curl -sf --max-time 5 http://127.0.0.1:{elastic.block.prometheus}/-/ready"
    wait_until(lambda: head.run(ready, timeout=30).returncode == 0, "Prometheus ready again",
               timeout=120, interval=0.5)
    assert elastic.invoke("top", "--once", "--json", timeout=120).returncode == 0
    [again] = elastic.prometheus_processes()
    assert again.split()[0] != pid
    assert json.loads(head.run(f"cat {pidfile}", check=True).stdout)["supervisor"]["pid"] == \
        supervisor


def test_a_pending_worker_is_shown_and_cancelled_when_nobody_needs_it(elastic: Elastic) -> None:
    with elastic.crowded():
        _pending_worker_shown_and_cancelled(elastic)


def _pending_worker_shown_and_cancelled(elastic: Elastic) -> None:
    # Three nodes wanted, room for one worker: the second worker job waits (partition full).
    job_id = ok(elastic.invoke("submit", "--no-wait", "tests/data/spread_job.py", "--", "3"))
    job_id = job_id.strip().splitlines()[-1]
    # What the queue went through, for a failure's message: a CI run at load ~8 timed out here
    # once, not reproduced on a quiet machine (2 of 2 there).
    seen: list[list[str]] = []

    def one_running_one_pending() -> bool | None:
        states = sorted(w["state"] for w in elastic.workers())
        if not seen or seen[-1] != states:
            seen.append(states)
        return states == ["PENDING", "RUNNING"] or None

    try:
        elastic.wait(one_running_one_pending, "one running and one pending worker job")
    except AssertionError as exc:
        raise AssertionError(f"the worker jobs' states, in order: {seen}; {exc}") from None
    rows = elastic.status()["provider_resources"]
    pending = [r for r in rows if r["state"] == "PENDING"]
    assert len(pending) == 1 and pending[0]["role"] == "worker (cpu)", rows
    assert pending[0]["queue position"].endswith("of 1"), rows
    ok(elastic.invoke("stop-job", job_id))
    elastic.ran.append("STOPPED")
    started = time.monotonic()
    wait_until(lambda: elastic.workers() == [] or None, "both worker jobs to be cancelled")
    print(f"\n[elastic] pending and idle workers cancelled {time.monotonic() - started:.1f}s "
          "after the demand went")


def test_a_worker_cancelled_outside_is_replaced_and_teardown_keeps_only_the_history(
        elastic: Elastic, scaled: Round) -> None:
    """The cluster's end, its 0 -> 2 -> 0 round (`scaled`) behind it: teardown with a worker
    running leaves nothing of it on any host, and keeps its metrics history, which the report
    draws."""
    job_id = ok(elastic.invoke("submit", "--no-wait", "tests/data/spread_job.py", "--", "2",
                               "600")).strip().splitlines()[-1]
    elastic.ran.append("RUNNING")
    first = elastic.wait(lambda: [w for w in elastic.workers() if w["state"] == "RUNNING"] or None,
                         "a running worker")[0]
    wait_until(lambda: elastic.ray_alive() == 2 or None, "the worker to join")
    elastic.slurm.run(f"scancel {first['id']}", check=True)
    started = time.monotonic()
    second = wait_until(lambda: [w for w in elastic.workers() if w["id"] != first["id"]
                                 and w["state"] == "RUNNING"] or None, "a replacement worker")[0]
    wait_until(lambda: elastic.ray_alive() == 2 or None, "the replacement to join")
    print(f"\n[elastic] worker {first['id']} cancelled outside, {second['id']} joined "
          f"{time.monotonic() - started:.1f}s later (Ray job {job_id} still needs it)")

    job = elastic.job
    down = ok(elastic.invoke("teardown"))
    assert elastic.slurm.run("squeue -h -o '%k'", check=True).stdout.count(
        f"rayfleet-cluster={job['cluster_id']}") == 0
    for host in elastic.slurm.nodes:
        marker = temp_marker(job).replace(".", "[.]")
        assert host.run(f"pgrep -af '{marker}' || true").stdout.strip() == "", host.name
    # Nothing of the cluster runs on any host, Prometheus included.
    assert ray_left_on_hosts(elastic.slurm, job) == {}
    assert not (elastic.home / "state" / f"{NAME}.json").exists()
    assert not (elastic.slurm.jobs_dir / "keys" / job["cluster_id"]).exists()
    _history_kept(elastic, down)


def _history_kept(elastic: Elastic, down: str) -> None:
    """What teardown kept: the worker series went 0 -> 2 -> 0, every Ray job run since `up`
    with the status it had then; the database stays on the shared work dir for the next `up`
    of the cluster; the report draws the kept copy in Chromium."""
    data = check_workers_went_0_2_0(kept_run(elastic.home, NAME), down, HEAD_TYPE)
    assert sorted(j["status"] for j in data["jobs"]) == sorted(elastic.ran), data["jobs"]
    # Resources of launching nodes: 2 CPUs while two workers were on their way (never more:
    # max_workers), none at the end (the replacement had joined).
    pending = data["series"]["pending_resources"]
    assert max(v for s in pending for _, v in s["values"]) == 2.0, pending
    assert all(s["values"][-1][1] == 0 for s in pending), pending
    assert (elastic.slurm.jobs_dir / "metrics" / NAME / "tsdb").is_dir()
    out = elastic.home / "kept.html"
    ok(elastic.invoke("report", "--out", str(out)))
    docs_screenshot("report-slurm.png", check_report_page(out).screenshot)
    assert "from the copy kept at teardown" in out.read_text()
