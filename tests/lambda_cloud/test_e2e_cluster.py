"""End to end on the test bed: the fake Lambda API hands out the test-bed hosts' addresses, and
`invoke up` / `submit` / `status` / `teardown` run for real (real `ray up`, real SSH, real Ray)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import ROOT, run_invoke
from tests.lambda_cloud.autoscale_bed import RAY_PROCESSES, power_off
from tests.lambda_cloud.conftest import API_KEY, SCALE, assert_clean, read_state
from tests.lambda_cloud.fake_api import FakeLambda
from tests.testbed import Testbed

CLUSTER = "lte2e"


@pytest.mark.slow
def test_up_submit_status_teardown_on_the_testbed(
        make_testbed: Callable[[int], Testbed], rf_home: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infra import ssh

    bed = make_testbed(2)
    fake = FakeLambda(API_KEY, scale=SCALE, boot_delay=0.5, terminate_delay=0.2,
                      capacity={("cpu_4x_general", "us-west-1"): 2},
                      ip_pool=[host.ip for host in bed.hosts])
    fake.add_foreign_instance("prod-db")
    by_ip = {host.ip: host for host in bed.hosts}
    # Terminating an instance powers the machine off: Ray on that host stops with it.
    fake.on_terminate = lambda inst: power_off(by_ip[str(inst.ip)])
    with fake:
        monkeypatch.setenv("LAMBDA_API_URL", fake.url)
        monkeypatch.setenv("LAMBDA_API_KEY", API_KEY)
        monkeypatch.setenv("LAMBDA_RATE_SCALE", str(SCALE))
        spec = tmp_path / f"{CLUSTER}.yaml"
        spec.write_text(yaml.safe_dump({
            "provider": "lambda",
            "head": {"choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "workers": {"count": 1,
                        "choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "ssh_user": "root", "ssh_proxy_command": bed.proxy_command,
            "env": "none", "object_store_memory_mb": 100, "boot_timeout_s": 60, "ray_timeout_s": 300,
        }))
        # The instances "boot" with the cluster's key authorized, as Lambda's would.
        bed.authorize_key(ssh.ensure_keypair(CLUSTER).public_key)

        up = run_invoke("up", "--cluster", str(spec), timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(rf_home, CLUSTER)
        assert state and state["info"]["head_ip"] == bed.hosts[0].ip

        # Enough tasks (~10 s on one node) that the worker gets its workers started and takes some.
        submit = run_invoke("submit", "--cluster", str(spec), "examples/cpu_example.py", "--", "1000",
                            timeout=300)
        assert submit.returncode == 0, submit.stdout + submit.stderr
        result = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
        assert sorted(result["hosts"]) == sorted(host.hostname for host in bed.hosts), result

        status = run_invoke("status", "--cluster", str(spec), "--json", timeout=120)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["running"] and not report["warnings"]
        assert sorted(n["ip"] for n in report["nodes"] if n["state"] == "ALIVE") == \
            sorted(host.ip for host in bed.hosts)

        # `invoke dashboard` keeps a tunnel to the head's dashboard open until Ctrl+C.
        tunnel = subprocess.Popen([sys.executable, "-m", "invoke", "dashboard", "--cluster", str(spec)],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert tunnel.stdout is not None
            url = tunnel.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), url
            # Token auth: without the cluster's token the job API refuses; with it, it answers.
            assert requests.get(f"{url}/api/jobs/", timeout=10).status_code == 401
            token = rf_home / "keys" / CLUSTER / "ray-token"
            assert token.stat().st_mode & 0o777 == 0o600
            headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
            jobs = requests.get(f"{url}/api/jobs/", headers=headers, timeout=10).json()
            assert [j["status"] for j in jobs] == ["SUCCEEDED"]
        finally:
            tunnel.send_signal(signal.SIGINT)
            tunnel.wait(timeout=30)

        down = run_invoke("teardown", "--cluster", str(spec), timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        fake.wait_powered_off()
        for host in bed.hosts:
            left = host.run(RAY_PROCESSES).stdout.strip()
            assert left == "", f"Ray still running on {host.name}: {left}"
        assert_clean(fake, CLUSTER)
        assert read_state(rf_home, CLUSTER) is None
