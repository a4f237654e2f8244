"""`metrics: prometheus` on the 2-host Slurm test bed, through its login host (issue 31): the head's
job runs the distribution's real Prometheus under the head daemons' supervisor, Ray's own
discovery file brings in the workers Ray's autoscaler submits, `invoke top` and `invoke report`
reach it through the cluster's SSH tunnel, and teardown keeps its history before the job goes.

One autoscaling cluster serves every scenario: a head (1 CPU) and worker type `cpu` (1 CPU,
0..2); a job wanting 3 nodes scales it 0 -> 2 -> 0 workers (the `scaled` fixture, once per
cluster, for the tests that need it); Prometheus killed comes back; teardown keeps the history,
whose worker series shows the 0 -> 2 -> 0, and the report drawn from it opens in a real headless
Chromium. A test that tore the cluster down leaves it to be brought up again for the next, so
each test runs alone or in any order. Assertions are on what Prometheus, Ray, Slurm and the
browser report.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

from infra.node import rayproc
from infra.providers.slurm.script import HEAD_TYPE
from tests.browser_metrics import check_report_page, docs_screenshot, terminal_screenshot
from tests.kept_history import check_workers_went_0_2_0, kept_run
from tests.slurm.conftest import LoginCluster, login_spec, ok, ray_left_on_hosts
from tests.testbed.hosts import Host
from tests.testbed.slurm import SlurmCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

NAME = "gauged"
#: Workers live seconds here: scraped every 2 s so that the history sees them.
SPEC = """idle_timeout_minutes: 0.1
metrics: prometheus
metrics_history: {days: 2, size_mb: 256, scrape_interval_s: 2}
worker_types:
  cpu: {cpus_per_node: 1, max_workers: 2}
environment:
  env_vars: {AUTOSCALER_UPDATE_INTERVAL_S: '1'}
"""


@dataclass(frozen=True)
class Round:
    """What one 0 -> 2 -> 0 round of the autoscaler showed, each figure taken as it happened."""

    #: Prometheus's node targets once the two workers were scraped.
    nodes: list[dict[str, Any]]
    #: `top`'s frame once it showed the job's bundles reserved, and Ray's alive nodes then.
    frame: dict[str, Any]
    alive: int
    #: `top`'s frame once the workers' targets had gone, and Ray's alive nodes then.
    after: dict[str, Any]
    after_alive: int


@dataclass
class Gauged(LoginCluster):
    #: This cluster's 0 -> 2 -> 0 round (the `scaled` fixture); None until it ran.
    scaled: Round | None = None

    @property
    def block(self) -> rayproc.PortBlock:
        return rayproc.PortBlock(int(self.job["port_base"]))

    def head_host(self) -> Host:
        return next(h for h in self.slurm.nodes if h.hostname == self.job["head_node"])

    def prometheus(self, path: str) -> Any:
        """Prometheus's own HTTP API, asked on the head's node, on its loopback where it
        listens: the parsed answer, or None while it does not answer."""
        url = f"http://127.0.0.1:{self.block.prometheus}{path}"
        done = self.head_host().run(f"curl -sf --max-time 5 '{url}'", timeout=30)
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None

    def top(self) -> dict[str, Any]:
        return dict(json.loads(ok(self.invoke("top", "--once", "--json", timeout=120))))

    def prometheus_processes(self) -> list[str]:
        """`pid args` of the head node's Prometheus of this cluster (its config names the
        head's private dir)."""
        temp = str(self.job["temp_dir"])
        out = self.head_host().run("ps -eo pid=,args=", check=True).stdout
        return [line.strip() for line in out.splitlines()
                if "prometheus --config.file=" in line and temp in line]


@pytest.fixture(scope="module")
def module_gauged(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Gauged]:
    work = tmp_path_factory.mktemp("gauged")
    cluster = Gauged(login_spec(work, slurm_cluster, NAME, SPEC), work / "home", slurm_cluster)
    try:
        yield cluster
    finally:
        if (cluster.home / "state" / f"{NAME}.json").exists():
            cluster.invoke("teardown")


@pytest.fixture
def gauged(module_gauged: Gauged) -> Gauged:
    """The module's cluster, up: built by the first test that needs it, and again after a test
    that tore it down (so a test never depends on which ran before it)."""
    if not (module_gauged.home / "state" / f"{NAME}.json").exists():
        started = time.monotonic()
        up = module_gauged.invoke("up")
        ok(up)
        print(f"\n[slurm metrics] up in {time.monotonic() - started:.1f}s")
        assert "metrics: Prometheus starting in the head's job" in up.stderr, up.stderr
        module_gauged.scaled = None
    return module_gauged


@pytest.fixture
def scaled(gauged: Gauged) -> Round:
    """The cluster's 0 -> 2 -> 0 round, run once per cluster: three nodes wanted (one CPU each,
    STRICT_SPREAD, held 40 s), the head alone, so two workers from zero, which the autoscaler
    cancels once done and idle for 0.1 min."""
    if gauged.scaled is None:
        gauged.scaled = _scale_0_2_0(gauged)
    return gauged.scaled


def _scale_0_2_0(gauged: Gauged) -> Round:
    ok(gauged.invoke("submit", "--no-wait", "tests/data/spread_job.py", "--", "3", "40"))
    started = time.monotonic()

    def three() -> list[dict[str, Any]] | None:
        found = _node_targets(gauged)
        return found if found is not None and len(found) == 3 else None

    nodes = wait_until(three, "3 Ray nodes' targets up in Prometheus", timeout=240, interval=1)
    print(f"\n[slurm metrics] 2 workers scraped {time.monotonic() - started:.1f}s after the demand")

    def reserved() -> dict[str, Any] | None:
        """A frame once it shows the job's bundles reserved: a raylet reports its resources
        every few seconds, behind its node's joining."""
        frame = gauged.top()
        got = {t["type"]: t["cpu_reserved"] for t in frame["nodes"]}
        return frame if got == {HEAD_TYPE: 1, "cpu": 2} else None

    frame = wait_until(reserved, "top to show 1 CPU reserved on the head, 2 on the workers",
                       timeout=120, interval=1)
    alive = gauged.alive_nodes()
    # Prometheus follows Ray's file as the workers go.
    wait_until(lambda: (found := _node_targets(gauged)) is not None and len(found) == 1,
               "the workers' targets gone from Prometheus", timeout=240, interval=1)
    after = gauged.top()
    return Round(nodes=nodes, frame=frame, alive=alive, after=after,
                 after_alive=gauged.alive_nodes())


def _node_targets(gauged: Gauged) -> list[dict[str, Any]] | None:
    """Prometheus's active targets once all are up, without the head's autoscaler and dashboard
    (their own metrics ports of the block): one per Ray node."""
    found = gauged.prometheus("/api/v1/targets?state=active")
    if not found:
        return None
    targets = found["data"]["activeTargets"]
    if not targets or any(t["health"] != "up" for t in targets):
        return None
    own = {f"{gauged.job['head_ip']}:{p}" for p in (gauged.block.autoscaler_metrics,
                                                   gauged.block.dashboard_metrics)}
    instances = {t["labels"]["instance"] for t in targets}
    return [t for t in targets if t["labels"]["instance"] not in own] if own <= instances else None


def test_prometheus_scrapes_every_node_and_top_agrees_with_ray(gauged: Gauged) -> None:
    # Not an empty list: Prometheus can list the head's own ports before Ray's discovery file
    # names the head's node (a run at load ~9 saw `[]`, which is an answer to wait_until).
    nodes = wait_until(lambda: _node_targets(gauged) or None,
                       "every Prometheus target up, the head's node among them", timeout=120)
    alive = gauged.alive_nodes()
    assert len(nodes) == alive == 1, (nodes, alive)
    # On the head's loopback, like the dashboard: another host of the cluster's network gets
    # nothing (Prometheus has no login). Bounded by the spec, its database on the shared work
    # dir, per cluster name.
    [process] = gauged.prometheus_processes()
    other = next(h for h in gauged.slurm.nodes if h.hostname != gauged.job["head_node"])
    probe = other.run(f"curl -s --max-time 5 http://{gauged.job['head_ip']}:"
                      f"{gauged.block.prometheus}/-/ready", timeout=30)
    assert probe.returncode == 7, (probe.returncode, probe.stdout)  # 7: could not connect
    store = gauged.slurm.jobs_dir / "metrics" / NAME
    for flag in (f"--web.listen-address=127.0.0.1:{gauged.block.prometheus}",
                 "--storage.tsdb.retention.time=2d", "--storage.tsdb.retention.size=256MB",
                 f"--storage.tsdb.path={store}/tsdb"):
        assert flag in process.split(), process
    # Ray's dashboard was told where it is (RAY_PROMETHEUS_HOST): its health check passes.
    health = gauged.head_host().run(
        f"curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $(cat "
        f"{gauged.slurm.jobs_dir}/keys/{gauged.job['cluster_id']}/ray-token)\" "
        f"http://127.0.0.1:{gauged.job['dashboard_port']}/api/prometheus_health", timeout=30)
    assert health.stdout.strip() == "200", health.stdout + health.stderr
    frame = gauged.top()
    assert sum(t["count"] for t in frame["nodes"]) == alive
    assert sum(t["cpu_total"] for t in frame["nodes"]) == 1


def test_autoscaled_workers_appear_in_prometheus_and_top_then_go(scaled: Round,
                                                                  gauged: Gauged) -> None:
    assert len({t["labels"]["instance"] for t in scaled.nodes}) == 3
    frame = scaled.frame
    assert sum(t["count"] for t in frame["nodes"]) == scaled.alive == 3, (frame, scaled.alive)
    # Three Ray nodes on the two hosts (the head's has one CPU left), each agent measuring its
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
                        terminal_screenshot(console.export_text(), gauged.home, 330))
    # Done and idle for 0.1 min: the autoscaler cancelled both; Prometheus followed Ray's file.
    after = scaled.after
    assert sum(t["count"] for t in after["nodes"]) == scaled.after_alive == 1
    # Nothing is launching any more: no resources shown as pending (Ray's gauge keeps the last
    # launch's value; top counts it only while a node is pending).
    assert after["pending"] == {"resources": {}, "launching": {},
                                "removed_last_5m": after["pending"]["removed_last_5m"]}, after


def test_killed_prometheus_is_said_in_one_line_and_comes_back(gauged: Gauged) -> None:
    [process] = gauged.prometheus_processes()
    pid = process.split()[0]
    head = gauged.head_host()
    pidfile = f"{gauged.job['temp_dir']}/rayfleet-metrics.json.pid"
    supervisor = json.loads(head.run(f"cat {pidfile}", check=True).stdout)["supervisor"]["pid"]
    # Held still while Prometheus is killed, so that `top` meets it gone (its restart takes ~1 s).
    head.run(f"kill -STOP {supervisor} && kill -KILL {pid}", check=True)
    try:
        wait_until(lambda: gauged.prometheus("/-/ready") is None and not any(
            p.split()[0] == pid for p in gauged.prometheus_processes()),
            "the killed Prometheus gone", timeout=30, interval=0.5)
        for verb in (("top", "--once"), ("report", "--out", str(gauged.home / "x.html"))):
            said = gauged.invoke(*verb)
            assert said.returncode != 0, said.stdout
            lines = said.stderr.strip().splitlines()
            assert len(lines) == 1 and "Prometheus" in lines[0] and "supervisor" in lines[0], lines
    finally:
        head.run(f"kill -CONT {supervisor}", check=True)
    # The same supervisor starts it again: no `up` needed on Slurm.
    wait_until(lambda: gauged.invoke("top", "--once", "--json", timeout=120).returncode == 0,
               "`top` to answer again", timeout=120, interval=2)
    [again] = gauged.prometheus_processes()
    assert again.split()[0] != pid
    assert json.loads(head.run(f"cat {pidfile}", check=True).stdout)["supervisor"]["pid"] == \
        supervisor


def test_teardown_keeps_the_history_with_the_workers_0_2_0_and_the_report_draws_it(
        gauged: Gauged, scaled: Round) -> None:
    job = gauged.job
    down = ok(gauged.invoke("teardown"))
    data = check_workers_went_0_2_0(kept_run(gauged.home, NAME), down,
                                    HEAD_TYPE)
    assert [j["status"] for j in data["jobs"]] == ["SUCCEEDED"], data["jobs"]
    # Resources of launching nodes: 2 CPUs while the two workers were on their way, none after.
    pending = data["series"]["pending_resources"]
    assert max(v for s in pending for _, v in s["values"]) == 2.0, pending
    assert all(s["values"][-1][1] == 0 for s in pending), pending
    # Nothing of the cluster runs on any host, Prometheus included; its database stays on the
    # shared work dir for the next `up` of the cluster.
    assert ray_left_on_hosts(gauged.slurm, job) == {}
    assert (gauged.slurm.jobs_dir / "metrics" / NAME / "tsdb").is_dir()
    out = gauged.home / "kept.html"
    ok(gauged.invoke("report", "--out", str(out)))
    docs_screenshot("report-slurm.png", check_report_page(out).screenshot)
    assert "from the copy kept at teardown" in out.read_text()
