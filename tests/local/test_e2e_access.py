"""`invoke env`, `ssh`, `exec`, `sync` on one real local cluster (shared by the module): Ray's own
CLI and a driver work after `eval "$(invoke env)"`, and the head is at hand without knowing where
the cluster keeps its address or token. The module's cluster also carries the checks that need no
cluster of their own: a failed job's exit, `--no-wait`/`logs`/`stop-job` with a runtime env, and
token auth (listeners, no token in any output, file or command line)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.node import rayproc
from tests import forked_cli
from tests.conftest import ROOT, run_invoke
from tests.local.cluster_info import cluster_pids, dashboard_client, read_state
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@dataclass
class Local:
    spec: Path
    env: dict[str, str]
    #: What `up` printed, both streams: the tests check what it says, and that it holds no token.
    up_stdout: str
    up_stderr: str

    @property
    def home(self) -> Path:
        return Path(self.env["RAYFLEET_HOME"])

    def invoke(self, *args: str, input: str | None = None, cwd: Path = ROOT,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`invoke VERB` on the module's cluster, forked from the CLI's zygote (tests/forked_cli.py:
        ~0.4 s of CPU of imports less per command; none of these starts or stops Ray)."""
        return forked_cli.run_invoke("-r", str(ROOT), args[0], "--cluster", str(self.spec),
                                     *args[1:], env=self.env, input=input, timeout=timeout,
                                     cwd=cwd)

    def rayfleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`rayfleet VERB` (a job id may be left out there; Invoke's own parser in a checkout
        wants every positional, docs/cli.md)."""
        return forked_cli.run_rayfleet(args[0], "--cluster", str(self.spec), *args[1:],
                                       env=self.env, timeout=120)


@pytest.fixture(scope="module")
def local(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    folder = tmp_path_factory.mktemp("access")
    spec = folder / f"acc-{uuid.uuid4().hex[:6]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
    env = {"RAYFLEET_HOME": str(folder / "home")}
    up = run_invoke("up", "--cluster", str(spec), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield Local(spec, env, up.stdout, up.stderr)
    finally:
        down = run_invoke("teardown", "--cluster", str(spec), env=env)
        assert down.returncode == 0, down.stdout + down.stderr


def test_eval_env_makes_ray_status_job_submit_and_a_driver_work(local: Local,
                                                                tmp_path: Path) -> None:
    assert f'eval "$(invoke env --cluster={local.spec})"' in local.up_stdout
    assert "autodown: off; the cluster runs until `invoke teardown`" in local.up_stdout
    printed = local.invoke("env")
    assert printed.returncode == 0, printed.stderr
    line = printed.stdout.strip()
    assert line.startswith("export RAY_ADDRESS=127.0.0.1:") and "RAY_AUTH_MODE=token" in line
    assert "RAY_API_SERVER_ADDRESS=http://127.0.0.1:" in line and "RAY_AUTH_TOKEN_PATH=" in line
    token = Path(line.split("RAY_AUTH_TOKEN_PATH=")[1].split()[0]).read_text().strip()
    assert token not in printed.stdout + printed.stderr, "the token itself is never printed"
    driver = tmp_path / "driver.py"
    driver.write_text("import ray\nray.init()\n"
                      "print('DRIVER', ray.get(ray.remote(lambda: 6 * 7).remote()))\n")
    bin_dir = Path(sys.executable).parent
    # Stock Ray tools only, in a shell that knows nothing of the cluster but the evaluated line.
    script = (f'eval "{line}"\nset -e\n{bin_dir}/ray status >/dev/null\necho STATUS-OK\n'
              f"{bin_dir}/ray job submit -- python -c \"print('JOB' + 'OK')\"\n"
              f"{sys.executable} {driver}\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    done = subprocess.run(["bash", "-c", script], env=clean, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "STATUS-OK" in done.stdout and "JOBOK" in done.stdout and "DRIVER 42" in done.stdout


def test_ssh_gives_a_shell_in_the_clusters_environment(local: Local) -> None:
    done = local.invoke("ssh", input='echo "addr=$RAY_ADDRESS mode=$RAY_AUTH_MODE"\nexit 3\n')
    assert done.returncode == 3, done.stderr
    assert "addr=127.0.0.1:" in done.stdout and "mode=token" in done.stdout


def test_exec_passes_the_exit_code_through(local: Local) -> None:
    done = local.invoke("exec", "--", "echo on-head; exit 7")
    assert (done.returncode, done.stdout.strip()) == (7, "on-head")
    empty = local.invoke("exec")
    assert empty.returncode == 2 and "invoke exec -- " in empty.stderr


def test_sync_up_and_down(local: Local, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("payload\n")
    up = local.invoke("sync", "up", f"{source}/", str(tmp_path / "there"))
    assert up.returncode == 0, up.stderr
    assert (tmp_path / "there" / "sub" / "f.txt").read_text() == "payload\n"
    down = local.invoke("sync", "down", str(tmp_path / "back"), str(tmp_path / "there" / "sub"))
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "payload\n"
    wrong = local.invoke("sync", "sideways", "a", "b")
    assert wrong.returncode == 2 and "`up`" in wrong.stderr


def test_submit_shows_the_job_not_rays_noise_and_logs_stop_job_take_the_last_job(
        local: Local, tmp_path: Path) -> None:
    # A working dir like a user's checkout: VCS data and ignore files make Ray's packaging chatty.
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("*.tmp\n")
    (tmp_path / "job.py").write_text("import time\nprint('\\x1b[32mJOB-START\\x1b[0m', "
                                     "flush=True)\ntime.sleep(300)\n")
    submitted = local.invoke("submit", "--no-wait", "job.py", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    for noise in ("Ignoring upload", "working_dir.py", "WebSocket closed", "INFO", "WARNING"):
        assert noise not in submitted.stderr, f"{noise!r} reached the terminal"
    home = Path(local.env["RAYFLEET_HOME"])
    kept = (home / "logs" / local.spec.stem / "ray-client.log").read_text()
    assert "Ignoring upload" in kept, "Ray's lines are kept in the log file"


    # `logs` without a job id: the job just submitted, once its start is in its log (waited for
    # over Ray's HTTP API: a `rayfleet` a poll is 1-2 s of CPU).
    from ray.job_submission import JobSubmissionClient

    url, headers = dashboard_client(local.home, local.spec.stem)
    client = JobSubmissionClient(url, headers=headers)
    wait_until(lambda: "JOB-START" in client.get_job_logs(job_id), "the job's start in its log",
               timeout=120, interval=0.5)
    shown = local.rayfleet("logs")
    assert shown.returncode == 0 and job_id in shown.stderr, shown.stderr
    assert "JOB-START" in shown.stdout and "\x1b[" not in shown.stdout
    stopped = local.rayfleet("stop-job")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"job {job_id} STOPPED"


def test_doctor_prints_no_packaging_lines(local: Local) -> None:
    done = local.invoke("doctor")
    assert done.returncode == 0, done.stderr
    assert "packaging" not in done.stderr and "Ignoring upload" not in done.stderr
    assert "all 1 node(s) match this machine" in done.stdout


def test_failed_job_gives_nonzero_exit(local: Local) -> None:
    script = ROOT / "tests" / "data" / "failing_job.py"
    failed = local.invoke("submit", str(script.relative_to(ROOT)), timeout=300)
    assert failed.returncode == 1
    assert "deliberate failure" in failed.stdout + failed.stderr
    assert "FAILED" in failed.stderr


def test_no_wait_logs_stop_job_and_runtime_env(local: Local, tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    env_file = tmp_path / "runtime.yaml"
    env_file.write_text("env_vars: {GREETING: hello-from-runtime-env}\n")
    submitted = local.invoke("submit", "--runtime-env", str(env_file), "--no-wait",
                             "tests/data/sleeper.py", timeout=300)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    assert f"invoke stop-job {job}" in submitted.stderr

    url, headers = dashboard_client(local.home, local.spec.stem)
    client = JobSubmissionClient(url, headers=headers)
    wait_until(lambda: "GREETING=" in client.get_job_logs(job), "the job's greeting in its log",
               timeout=60, interval=0.2)
    logs = local.invoke("logs", job, timeout=300)
    assert logs.returncode == 0 and "GREETING=hello-from-runtime-env" in logs.stdout

    stopped = local.invoke("stop-job", job, timeout=300)
    assert stopped.returncode == 0, stopped.stderr
    assert client.get_job_status(job).value == "STOPPED"

    missing = local.invoke("submit", "--runtime-env", "nope.yaml", "tests/data/sleeper.py",
                           timeout=300)
    assert missing.returncode == 2 and "--runtime-env nope.yaml: no such file" in missing.stderr


def _listeners(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by `pids` (from `ss -ltnp`)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & set(pids):
            local_address = line.split()[3]
            host, port = local_address.rsplit(":", 1)
            found.append((host.strip("[]").removeprefix("::ffff:"), int(port)))
    return found


def test_token_auth_listeners_and_no_secret_leaks(local: Local, tmp_path: Path) -> None:
    """Token on, job API on loopback, anything on other interfaces refuses requests without the
    token, and the token shows up nowhere but its 0600 file (the module's `up` included)."""
    import requests
    from ray.job_submission import JobSubmissionClient

    rf_home, name = local.home, local.spec.stem
    url, headers = dashboard_client(rf_home, name)
    token_file = Path(read_state(rf_home, name)["info"]["auth_token_path"])
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token_file.stat().st_mode & 0o777 == 0o600

    assert requests.get(f"{url}/api/jobs/", timeout=5).status_code == 401
    assert requests.get(f"{url}/api/jobs/", headers={"Authorization": "Bearer wrong"},
                        timeout=5).status_code == 403
    assert requests.get(f"{url}/api/jobs/", headers=headers, timeout=5).status_code == 200
    with pytest.raises(Exception, match="Authentication"):
        JobSubmissionClient(url).list_jobs()

    port_base = read_state(rf_home, name)["resources"][0]["attrs"]["port_base"]
    pids = cluster_pids(name)
    listeners = _listeners(pids)
    dashboard = port_base + 1
    assert {h for h, p in listeners if p == dashboard} == {"127.0.0.1"}, listeners
    # Whatever Ray binds beyond loopback must not serve anyone without the token: an HTTP request
    # to each such port without it is refused or not understood (gRPC), never served.
    for host, port in listeners:
        if host in ("127.0.0.1", "::1"):
            continue
        target = "127.0.0.1" if host in ("*", "0.0.0.0", "::") else host
        try:
            answer = requests.get(f"http://{target}:{port}/api/jobs/", timeout=3)
        except requests.RequestException:
            continue
        assert answer.status_code != 200 or "submission_id" not in answer.text, (host, port)

    # Ray's own client, on the address Ray advertises (not loopback): refused without the token.
    # (Read from Ray's state API over HTTP: an `invoke status` is 1-2 s of CPU.)
    nodes = requests.get(f"{url}/api/v0/nodes", headers=headers, timeout=30).json()
    node_ip = nodes["data"]["result"]["result"][0]["node_ip"]
    probe = ("import ray, sys\ntry:\n    ray.init(address=sys.argv[1], log_to_driver=False)\n"
             "except ConnectionError:\n    sys.exit(3)\nprint(ray.cluster_resources()['CPU'])\n")
    # In an empty folder of its own: `python -c` puts its working directory first on sys.path, and
    # a stray grp.py in the machine's /tmp once shadowed the standard library's module here.
    for env, expected in (({"RAY_AUTH_MODE": "disabled"}, 3),
                          ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}, 0)):
        driver = subprocess.run([sys.executable, "-c", probe, f"{node_ip}:{port_base}"],
                                env={**os.environ, **env}, capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
        assert driver.returncode == expected, (env, driver.stderr[-500:])

    submitted = local.invoke("submit", "examples/cpu_example.py", "--", "2", timeout=300)
    assert submitted.returncode == 0, submitted.stderr
    status = local.invoke("status")
    dashboard_out = local.invoke("dashboard")
    assert str(token_file) in dashboard_out.stderr and "RAY_AUTH_TOKEN_PATH=" in dashboard_out.stderr
    outputs = [local.up_stdout, local.up_stderr, submitted.stdout, submitted.stderr,
               status.stdout, status.stderr, dashboard_out.stdout, dashboard_out.stderr]
    assert not [o for o in outputs if token in o]
    leaks = [f for f in rf_home.rglob("*") if f.is_file() and f != token_file
             and token in f.read_text(errors="replace")]
    assert leaks == []
    cmdlines = [rayproc.cmdline(pid) for pid in cluster_pids(name)]
    assert cmdlines and not [c for c in cmdlines if token in c]
