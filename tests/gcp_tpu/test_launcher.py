"""The real `ray` runner (output streamed to the log and the progress line) and how failures of
`ray up` become one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra.node.gcp_tpu.api import (
    GcpApiDisabledError,
    GcpError,
    GcpPermissionError,
    GcpQuotaError,
)
from infra.providers.gcp_tpu import launcher


def test_run_ray_streams_output_and_returns_the_exit_code(tmp_path: Path) -> None:
    seen: list[str] = []
    log = tmp_path / "logs" / "ray-up.log"
    script = "import sys\nprint('Cluster: lab')\nprint('  ')\nprint('boom', file=sys.stderr)\nsys.exit(3)"
    code = launcher.run_ray([sys.executable, "-c", script], launcher.ray_env(None), log, seen.append)
    assert code == 3
    assert seen == ["Cluster: lab", "boom"]
    assert log.read_text() == "Cluster: lab\n  \nboom\n"


def test_ray_env_never_reports_usage_and_passes_only_a_key_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    env = launcher.ray_env("/keys/sa.json")
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/keys/sa.json"
    assert env["RAY_UP_enable_autoscaler_v2"] == "0" and env["PYTHONUNBUFFERED"] == "1"
    monkeypatch.setenv("RAY_UP_enable_autoscaler_v2", "1")
    assert launcher.ray_env(None)["RAY_UP_enable_autoscaler_v2"] == "1"


@pytest.mark.parametrize(("output", "error", "expected"), [
    ("googleapiclient.errors.HttpError: <HttpError 403 ... \"Quota 'TPUV4S_PER_PROJECT' exceeded."
     " Limit: 0.0\">", GcpQuotaError, "request more quota"),
    ("Exception: {'errors': [{'code': 'ZONE_RESOURCE_POOL_EXHAUSTED', 'message': 'The zone "
     "does not have enough resources'}]}", GcpError, "no capacity for it now"),
    ("<HttpError 429 \"RESOURCE_EXHAUSTED: too many requests per minute for tpu.googleapis.com\">",
     GcpError, "rate limit"),
    ("{'code': 8, 'message': 'RESOURCE_EXHAUSTED: There is no more capacity in the zone'}",
     GcpError, "no capacity for it now"),
    ("<HttpError 403 \"Identity and Access Management (IAM) API has not been used in project "
     "123 before or it is disabled.\" details: SERVICE_DISABLED>", GcpApiDisabledError,
     "gcloud services enable"),
    ("<HttpError 403 \"Permission 'iam.serviceAccounts.create' denied on resource\">",
     GcpPermissionError, "Service Account Admin"),
    ("something else went wrong\n\n", GcpError, "exited 1: something else went wrong"),
])
def test_failures_become_one_line_with_the_fix(tmp_path: Path, output: str, error: type,
                                                expected: str) -> None:
    log = tmp_path / "ray-up.log"
    log.write_text("Cluster: lab\nChecking GCP environment settings\n" + output + "\n")
    found = launcher.failure("up", 1, log)
    assert type(found) is error
    assert expected in str(found) and str(log) in str(found) and "\n" not in str(found)
    # Only a stockout moves `up` to another zone; quota and rate limits would fail there too.
    assert launcher.is_capacity(found) == (expected == "no capacity for it now")


def test_a_hanging_ray_is_stopped_by_the_watchdog(tmp_path: Path) -> None:
    log = tmp_path / "ray-up.log"
    code = launcher.run_ray([sys.executable, "-c", "print('waiting for SSH', flush=True)\n"
                             "import time; time.sleep(60)"], launcher.ray_env(None), log,
                            lambda _: None, timeout=0.5)
    assert code < 0
    assert log.read_text().splitlines()[-1].endswith("after 0.5 s")
    found = launcher.failure("up", code, log)
    assert "after 0.5 s" in str(found)
