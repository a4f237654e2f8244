"""`metrics: prometheus` on a real local Ray head with the distribution's real Prometheus: the
targets, `invoke top`, `invoke report` in a real headless Chromium, a killed Prometheus, and the
history kept at teardown. One cluster for the module, brought up again for the next test when one
tore it down, and one busy job on it that the tests needing it share: each test runs alone, or in
any order.

Assertions are on what Prometheus, Ray and the browser report.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from bench import metrics as metrics_bench
from infra.node import rayproc
from tests.browser_metrics import (
    check_report_page,
    docs_screenshot,
    open_page,
    terminal_screenshot,
)
from tests.conftest import run_invoke
from tests.kept_history import kept_run
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

@dataclass
class Cluster:
    spec: Path
    home: Path
    work: Path
    #: `top`'s frame while this cluster's busy job ran (the `busy` fixture); None until then.
    busy: dict | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"RAYFLEET_HOME": str(self.home)}

    def invoke(self, verb: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_invoke(verb, "--cluster", str(self.spec), *args, env=self.env, timeout=timeout)

    @property
    def state(self) -> dict:
        return json.loads((self.home / "state" / f"{self.spec.stem}.json").read_text())

    @property
    def block(self) -> rayproc.PortBlock:
        return rayproc.PortBlock(int(self.state["resources"][0]["attrs"]["port_base"]))

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.block.prometheus}"

    def headers(self) -> dict[str, str]:
        token = Path(self.state["info"]["auth_token_path"]).read_text().strip()
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("metrics")
    name = f"m{uuid.uuid4().hex[:8]}"
    spec = work / f"{name}.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 100\n"
                    "metrics: prometheus\nmetrics_history: {scrape_interval_s: 2}\n")
    found = Cluster(spec, work / "home", work)
    yield found
    found.invoke("teardown")
    leftovers = rayproc.cluster_processes([f"/tmp/rayfleet/{name}-"])
    rayproc.terminate(leftovers)
    assert not leftovers, f"test left processes behind: {leftovers}"


@pytest.fixture
def cluster(module_cluster: Cluster) -> Cluster:
    """The module's cluster, up: built by the first test that needs it, and again after a test
    that tore it down (so a test never depends on which ran before it)."""
    if not (module_cluster.home / "state" / f"{module_cluster.spec.stem}.json").exists():
        up = module_cluster.invoke("up")
        assert up.returncode == 0, up.stdout + up.stderr
        module_cluster.busy = None
    return module_cluster


@pytest.fixture
def busy(cluster: Cluster) -> dict:
    """`top`'s frame while a job keeps both CPUs of the cluster busy for 30 s
    (tests/data/burn_cpus.py), submitted once per cluster and shared by the tests that need it.
    30 s: Ray's agent reports every 5 s and Prometheus scrapes every 2 s, so the busy CPUs are
    seen within about 10 s of the burn's start, and `top` then takes a few; every second more
    burns two CPUs of CI's two, and the teardown test waits for the job's end."""
    if cluster.busy is None:
        # Scraped from the start: a job that ran before Prometheus saw the node is no history.
        _all_scraped(cluster)
        submitted = cluster.invoke("submit", "--no-wait", "tests/data/burn_cpus.py", "--", "2", "30")
        assert submitted.returncode == 0, submitted.stderr

        def seen() -> dict | None:
            # Asked of Prometheus over HTTP until it holds what `top` would show (an `invoke top`
            # a poll is 1-2 s of CPU); then `top` itself, whose frame is what is checked.
            if not _busy_in_prometheus(cluster):
                return None
            shown = cluster.invoke("top", "--once", "--json", timeout=120)
            assert shown.returncode == 0, shown.stderr
            frame = json.loads(shown.stdout)
            head = frame["nodes"][0]
            # The job RUNNING too: `cpu_used` is the machine's, and a reservation the scrape
            # still holds from an earlier job's tasks once met the rest while it was PENDING.
            running = bool(frame["jobs"]) and frame["jobs"][0]["status"] == "RUNNING"
            return frame if head["cpu_used"] >= 1.5 and head["cpu_reserved"] >= 2 and running \
                else None

        cluster.busy = wait_until(seen, "2 busy CPUs in `top --once --json`", timeout=150, interval=1)
    return cluster.busy


def _busy_in_prometheus(cluster: Cluster) -> bool:
    """Both CPUs used and reserved, in the series `top` reads (infra/cli/metrics.py)."""
    def value(promql: str) -> float:
        try:
            answer = requests.get(f"{cluster.prometheus}/api/v1/query", params={"query": promql},
                                  timeout=5)
            rows = answer.json()["data"]["result"] if answer.status_code == 200 else []
        except requests.RequestException:
            return 0.0
        return sum(float(row["value"][1]) for row in rows)

    return (value("sum(ray_node_cpu_utilization * ray_node_cpu_count / 100)") >= 1.5
            and value('sum(ray_resources{State="USED",Name="CPU"})') >= 2)


def _targets(cluster: Cluster) -> list[dict]:
    answer = requests.get(f"{cluster.prometheus}/api/v1/targets", timeout=5)
    answer.raise_for_status()
    return list(answer.json()["data"]["activeTargets"])


def _all_scraped(cluster: Cluster) -> list[dict]:
    """Prometheus's targets once every one is up: Ray's own discovery file names the node's agent
    and the head's autoscaler and dashboard."""
    block = cluster.block
    wanted = {block.base + rayproc.PORT_NAMES.index("metrics-export-port"),
              block.autoscaler_metrics, block.dashboard_metrics}

    def all_up() -> list[dict] | None:
        try:
            found = _targets(cluster)
        except requests.RequestException:
            return None
        ports = {int(t["labels"]["instance"].rsplit(":", 1)[1]) for t in found}
        return found if ports == wanted and all(t["health"] == "up" for t in found) else None

    return wait_until(all_up, f"Prometheus targets on ports {sorted(wanted)} all up", timeout=120)


def test_prometheus_scrapes_every_node_and_the_dashboard_knows_it(cluster: Cluster) -> None:
    block = cluster.block
    _all_scraped(cluster)
    # Listens on loopback only, like the dashboard.
    assert not rayproc.port_answers(_non_loopback_address(), block.prometheus)
    # Ray's dashboard was told where Prometheus is (RAY_PROMETHEUS_HOST): its health check passes.
    health = requests.get(f"{cluster.state['info']['dashboard_url']}/api/prometheus_health",
                          headers=cluster.headers(), timeout=10)
    assert health.status_code == 200, health.text[:300]
    # Bounded history, in the cluster's own dir.
    command = " ".join(_prometheus_cmdline(cluster))
    assert "--storage.tsdb.retention.time=30d" in command
    assert "--storage.tsdb.retention.size=1024MB" in command
    assert f"--storage.tsdb.path={cluster.home / 'metrics' / cluster.spec.stem / 'tsdb'}" in command


def _non_loopback_address() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the route's address
        return str(probe.getsockname()[0])


def test_bench_metrics_job_pair_on_this_cluster(cluster: Cluster,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """bench/metrics.py's job pair (tests/test_bench.py's ON_E2E): a small CPU-bound job with
    this cluster's Prometheus scraping and with it held still (SIGSTOP); its summary printed, and
    Prometheus running again after. (Before the busy job: that one would hold both CPUs.)"""
    jobs = metrics_bench.measure_jobs(cluster.spec, {**os.environ, **cluster.env}, cluster.home,
                                      2_000_000, range(0, 1), warm=False)
    jobs.summary(1)
    printed = capsys.readouterr().out
    print(printed)  # the numbers, for -s and for the log of a failing run
    assert len(jobs.ratios) == 1 and jobs.ratios[0] > 0 and jobs.scraped_s > 0
    assert re.search(r"median ratio CPU-bound job with scraping / without: [0-9.]+ \(target",
                     printed), printed
    assert _prometheus_cmdline(cluster), "Prometheus no longer runs after the bench"


def _prometheus_cmdline(cluster: Cluster) -> list[str]:
    import psutil

    temp_dir = cluster.state["resources"][0]["id"]
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].endswith("prometheus") and any(temp_dir in a for a in cmdline):
            return list(cmdline)
    return []


def _ray_status(cluster: Cluster) -> tuple[int, float]:
    """(alive nodes, CPUs) as Ray's own `ray status` prints them."""
    printed = cluster.invoke("env")
    assert printed.returncode == 0, printed.stderr
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(["bash", "-c", f'eval "{printed.stdout.strip()}"\n'
                           f"{bin_dir}/ray status"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-1000:]
    text = done.stdout
    active = text.split("Active:")[1].split("Pending:")[0]
    nodes = sum(int(line.split()[0]) for line in active.strip().splitlines()
                if line.strip() and line.split()[0].isdigit())
    cpu_line = next(line for line in text.splitlines() if line.strip().endswith(" CPU"))
    return nodes, float(cpu_line.split("/")[1].split()[0])


def test_top_shows_a_busy_job_and_agrees_with_ray_status(cluster: Cluster, busy: dict) -> None:
    frame = busy
    nodes, cpus = _ray_status(cluster)
    assert sum(t["count"] for t in frame["nodes"]) == nodes == 1
    assert sum(t["cpu_total"] for t in frame["nodes"]) == cpus == 2
    assert frame["jobs"][0]["status"] == "RUNNING"
    assert frame["cost"]["hourly_usd"] == 0
    # The live view prints a table too.
    table = cluster.invoke("top", "--once")
    assert table.returncode == 0 and "nodes by type" in table.stdout, table.stderr
    if os.environ.get("RAYFLEET_DOCS_SCREENSHOTS"):
        # docs/metrics.md shows what a terminal shows: the frame, drawn by the same browser.
        docs_screenshot("top.png", terminal_screenshot(table.stdout, cluster.work, 330))


def test_report_renders_in_a_real_browser(cluster: Cluster) -> None:
    out = cluster.work / "live-report.html"
    made = cluster.invoke("report", "--out", str(out))
    assert made.returncode == 0, made.stderr
    docs_screenshot("report.png", check_report_page(out).screenshot)


def test_killed_prometheus_is_said_in_one_line_and_up_brings_it_back(cluster: Cluster) -> None:
    import psutil

    command = _prometheus_cmdline(cluster)
    victims = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == command]
    assert command and victims
    # Its runner (infra/node/metrics.py) and their supervisor first: left alive, the supervisor
    # would start it again within seconds (tests/node/test_supervise.py shows that part).
    for victim in victims:
        runner = victim.parent()
        supervisor = runner.parent() if runner else None
        assert supervisor and "infra.node.supervise" in " ".join(supervisor.cmdline())
        for process in (supervisor, runner, victim):
            process.send_signal(signal.SIGKILL)
    wait_until(lambda: not rayproc.port_answers("127.0.0.1", cluster.block.prometheus),
               "the killed Prometheus's port to close", timeout=30)
    for verb in (("top", "--once"), ("report", "--out", str(cluster.work / "x.html"))):
        said = cluster.invoke(*verb)
        assert said.returncode != 0
        lines = said.stderr.strip().splitlines()
        assert len(lines) == 1 and "Prometheus" in lines[0] and "invoke up" in lines[0], lines
    again = cluster.invoke("up")
    assert again.returncode == 0, again.stderr
    # Prometheus answering a query over HTTP (an `invoke top` a poll is 1-2 s of CPU), then
    # `top` itself, once.
    wait_until(lambda: _prometheus_answers(cluster), "Prometheus to answer after `up`",
               timeout=120, interval=0.5)
    shown = cluster.invoke("top", "--once", "--json")
    assert shown.returncode == 0, shown.stderr


def _prometheus_answers(cluster: Cluster) -> bool:
    try:
        return requests.get(f"{cluster.prometheus}/api/v1/query", params={"query": "1"},
                            timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_teardown_keeps_the_history_and_the_report_draws_it(cluster: Cluster, busy: dict) -> None:
    listed: list[dict] = []

    def ended() -> bool:
        """Every job over, as Ray's job API says (an `invoke top` a poll is 1-2 s of CPU)."""
        answer = requests.get(f"{cluster.state['info']['dashboard_url']}/api/jobs/",
                              headers=cluster.headers(), timeout=10)
        listed[:] = answer.json() if answer.status_code == 200 else []
        return bool(listed) and all(
            j["status"] in ("SUCCEEDED", "FAILED", "STOPPED") for j in listed)

    wait_until(ended, "the busy job to finish", timeout=120, interval=1)
    shown = cluster.invoke("top", "--once", "--json", timeout=120)
    assert shown.returncode == 0 and not json.loads(shown.stdout)["jobs"], shown.stdout[-500:]
    gone = cluster.invoke("teardown")
    assert gone.returncode == 0, gone.stderr
    kept = kept_run(cluster.home, cluster.spec.stem)
    assert f"metrics history kept in {kept}" in gone.stdout
    data = json.loads(gzip.decompress(kept.read_bytes()))
    # Every job the cluster ran (the bench's pair, when this module ran it, and the busy job).
    assert sorted(j["status"] for j in data["jobs"]) == sorted(j["status"] for j in listed)
    assert [j["status"] for j in data["jobs"] if "burn_cpus" in j["entrypoint"]] == ["SUCCEEDED"]
    assert max(v for s in data["series"]["cpu_used"] for _, v in s["values"]) >= 1.5
    out = cluster.work / "kept-report.html"
    made = cluster.invoke("report", "--out", str(out))
    assert made.returncode == 0, made.stderr
    check_report_page(out)
    assert "from the copy kept at teardown" in out.read_text()


def test_report_of_a_cluster_that_never_ran_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / f"n{uuid.uuid4().hex[:8]}.yaml"
    spec.write_text("provider: local\nmetrics: prometheus\n")
    said = run_invoke("report", "--cluster", str(spec),
                      env={"RAYFLEET_HOME": str(tmp_path / "home")})
    assert said.returncode != 0
    assert len(said.stderr.strip().splitlines()) == 1 and "no metrics history" in said.stderr
    assert not list(tmp_path.glob("*.html"))


def test_the_browser_check_sees_a_request_leaving_the_page(tmp_path: Path) -> None:
    """The harness itself can fail: a page that loads a script from elsewhere is caught."""
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><html><body><script src="http://127.0.0.1:9/x.js"></script>'
                    "<script>console.error('boom')</script></body></html>")
    visit = open_page(page)
    assert any(url.startswith("http://127.0.0.1:9/") for url in visit.requests)
    assert visit.console_errors


def test_no_system_prometheus_was_left_running() -> None:
    """The Debian package may start its own service on install; none may hold port 9090."""
    assert shutil.which("prometheus"), "apt-get install prometheus (.ci/run does)"
    assert not rayproc.port_answers("127.0.0.1", 9090), \
        "something (the package's own service?) listens on 9090: stop it by its PID"
