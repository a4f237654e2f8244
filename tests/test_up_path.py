"""What a local `up` loads before `ray start` runs, and its readiness check (issue 38: every
millisecond of rayfleet's own start is on top of Ray's, bench/local_up.py). No cluster runs: a
probe stops `up` where it would start Ray, and `teardown` then removes what it had recorded."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import jobs
from tests.conftest import ROOT

#: Libraries `up` does not need before a local head's `ray start`; those it loaded on the way
#: cost it ~55 ms (requests) and ~20 ms (rich) on a 2-core machine. (filelock, ~10 ms, takes the
#: cluster's lock before it: a maintained library rather than our own flock.)
NOT_BEFORE_RAY = ("requests", "urllib3", "rich", "paramiko", "googleapiclient",
                  "google", "cryptography", "aiohttp", "ray")
#: What only a feature the probe's spec leaves off needs (local defaults: no metrics, no autodown).
FEATURES_OFF = ("infra.core.metrics.prometheus", "infra.node.metrics", "infra.node.autodown")
#: The front door loads no verb and none of what a verb needs: `--list` and `--help` stay fast.
NOT_AT_THE_DOOR = ("infra.cli.commands", "infra.providers.base", "pydantic", "jinja2",
                   "filelock", *NOT_BEFORE_RAY)

# Runs `up` of a local spec in this process until it would exec `ray start`: the probe writes what
# is loaded then and the temp dir the head was given, and refuses to start Ray, as a failed start.
PROBE = """
import json, subprocess, sys
from pathlib import Path
from invoke import Context

spec, out = sys.argv[1], Path(sys.argv[2])
real = subprocess.Popen

class Probe(real):
    def __init__(self, args, *rest, **options):
        if list(args[:2]) == ["bash", "-c"] and "ray" in args[2] and args[3:4] == ["start.sh"]:
            out.write_text(json.dumps({"modules": sorted(sys.modules), "temp_dir": args[4]}))
            raise OSError("probe: this is where `ray start` runs")
        super().__init__(args, *rest, **options)

subprocess.Popen = Probe
from infra.cli import tasks
try:
    tasks.up(Context(), cluster=spec)
except OSError as exc:
    print(exc)
"""


def _modules_in(names: list[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in roots or n.startswith(tuple(f"{r}." for r in roots)))


def test_the_front_door_loads_no_verb() -> None:
    loaded = subprocess.run([sys.executable, "-c", "import json, sys, infra.cli.tasks; "
                             "print(json.dumps(sorted(sys.modules)))"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    assert _modules_in(json.loads(loaded), NOT_AT_THE_DOOR) == []


def test_a_local_up_reaches_ray_start_without_libraries_it_does_not_need(
        rf_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "probe.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n")
    loaded = tmp_path / "loaded.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(spec), str(loaded)], cwd=ROOT,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "probe: this is where `ray start` runs", done.stderr
    probed = json.loads(loaded.read_text())
    assert "infra.providers.local.provider" in probed["modules"]  # it stopped the real `up`
    assert _modules_in(probed["modules"], NOT_BEFORE_RAY) == []
    assert _modules_in(probed["modules"], FEATURES_OFF) == []
    # The failed start was recorded before it ran, and taken down again: nothing is left.
    assert probed["temp_dir"].endswith("/probe")
    assert not Path(probed["temp_dir"]).parent.exists()
    assert not (rf_home / "state" / "probe.json").exists()


class _JobApi(http.server.BaseHTTPRequestHandler):
    """Ray's job API as token auth answers it: the job list with the token, 401 without."""

    def do_GET(self) -> None:
        allowed = self.headers.get("Authorization") == "Bearer sesame"
        body = b"[]" if allowed and self.path == "/api/jobs/" else b"{}"
        self.send_response(200 if allowed and self.path == "/api/jobs/" else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def job_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JobApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_dashboard_is_ready_when_the_job_api_answers_with_the_token(
        job_api: str, tmp_path: Path) -> None:
    token = tmp_path / "ray-token"
    token.write_text("sesame")
    wrong = tmp_path / "wrong-token"
    wrong.write_text("open")
    assert jobs.dashboard_ready(job_api, token)
    assert not jobs.dashboard_ready(job_api, wrong)  # 401
    assert not jobs.dashboard_ready(job_api)  # no token: 401
    assert not jobs.dashboard_ready(f"{job_api}/elsewhere", token)  # 401 at another path


def test_the_dashboard_is_not_ready_when_nothing_answers(tmp_path: Path) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert not jobs.dashboard_ready(f"http://127.0.0.1:{port}", timeout=1)
    assert not jobs.dashboard_ready("not a url")


def test_the_readiness_check_after_ray_start_loads_no_http_library() -> None:
    # `up` asks it the moment `ray start` returns: what it loads is on `up`'s time.
    probe = ("import json, sys\nfrom infra.core import jobs\n"
             "jobs.dashboard_ready('http://127.0.0.1:9', timeout=1)\n"
             "print(json.dumps(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    assert _modules_in(json.loads(loaded), ("requests", "urllib3", "aiohttp", "httpx")) == []
