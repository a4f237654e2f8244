"""`invoke env`, `ssh`, `exec`, `sync` on one real local cluster (shared by the module): Ray's own
CLI and a driver work after `eval "$(invoke env)"`, and the head is at hand without knowing where
the cluster keeps its address or token."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_invoke, run_rayfleet
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@dataclass
class Local:
    spec: Path
    env: dict[str, str]
    up_stdout: str

    def invoke(self, *args: str, input: str | None = None,
               cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        return run_invoke("-r", str(ROOT), args[0], "--cluster", str(self.spec), *args[1:],
                          env=self.env, input=input, timeout=120, cwd=cwd)

    def rayfleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`rayfleet VERB` (a job id may be left out there; Invoke's own parser in a checkout
        wants every positional, docs/cli.md)."""
        return run_rayfleet(args[0], "--cluster", str(self.spec), *args[1:], env=self.env,
                            timeout=120)


@pytest.fixture(scope="module")
def local(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    folder = tmp_path_factory.mktemp("access")
    spec = folder / f"acc-{uuid.uuid4().hex[:6]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
    env = {"RAYFLEET_HOME": str(folder / "home")}
    up = run_invoke("up", "--cluster", str(spec), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield Local(spec, env, up.stdout)
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


    # `logs` without a job id: the job just submitted.
    def started() -> subprocess.CompletedProcess[str] | None:
        shown = local.rayfleet("logs")
        assert shown.returncode == 0 and job_id in shown.stderr, shown.stderr
        return shown if "JOB-START" in shown.stdout else None

    shown = wait_until(started, "the job's start in `invoke logs`", timeout=120, interval=1)
    assert "JOB-START" in shown.stdout and "\x1b[" not in shown.stdout
    stopped = local.rayfleet("stop-job")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"job {job_id} STOPPED"


def test_doctor_prints_no_packaging_lines(local: Local) -> None:
    done = local.invoke("doctor")
    assert done.returncode == 0, done.stderr
    assert "packaging" not in done.stderr and "Ignoring upload" not in done.stderr
    assert "all 1 node(s) match this machine" in done.stdout
