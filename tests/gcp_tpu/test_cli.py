"""`invoke ... --provider=gcp-tpu` as a user runs it (subprocesses).

A real job through the provider's SSH tunnel to a real Ray head is not repeated here (it started
a local Ray of its own): test_e2e_cluster.py::test_ray_autoscales_tpu_nodes_against_offline_google
submits its jobs through `invoke`'s tunnel to the head's token-checking Ray (refused without the
token), and test_provider.py::test_connect_gives_each_cluster_its_own_local_port holds the
endpoint tunneled."""

from __future__ import annotations

import json
import time
from pathlib import Path

from infra.core import node_start
from infra.providers.gcp_tpu import config
from tests.forked_cli import run_invoke
from tests.gcp_tpu.conftest import assert_nothing_created, write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {"RAYFLEET_HOME": str(home), "CLOUDSDK_CONFIG": str(home / "no-gcloud"), **extra}
    return env


def test_up_without_credentials_fails_fast_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    started = time.monotonic()
    result = run_invoke("up", "--provider=gcp-tpu", env=_env(home))
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == ("error: gcp-tpu: no Google credentials found; run `gcloud auth "
                         "application-default login` or set credentials_file: in "
                         "clusters/gcp-tpu.yaml"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert_nothing_created(home, "gcp-tpu")
    assert elapsed < 30, f"took {elapsed:.1f}s"  # seconds, not a metadata-server timeout


def test_plan_runs_preflight_against_the_endpoint(tmp_path: Path, fake: FakeGcp,
                                                  key_file: Path) -> None:
    spec_path = write_spec(tmp_path, name="cli")
    result = run_invoke("plan", "--cluster", str(spec_path), env=_env(
        tmp_path / "home", RAYFLEET_GCP_API_ENDPOINT=fake.url,
        GOOGLE_APPLICATION_CREDENTIALS=str(key_file)))
    assert result.returncode == 0, result.stderr
    assert "pre-flight ✓ Cloud TPU API enabled; offered in us-central2-b: v4-8" in result.stdout
    assert (tmp_path / "home" / "rendered" / "cli" / config.FILE_NAME).exists()
    assert_nothing_created(tmp_path / "home", "cli")
    assert fake.requests and all(r["method"] == "GET" for r in fake.requests)


def test_up_stops_at_preflight_with_one_line_and_creates_nothing(
        tmp_path: Path, fake: FakeGcp, key_file: Path) -> None:
    fake.disabled.add("tpu")
    spec_path = write_spec(tmp_path, name="cli")
    home = tmp_path / "home"
    result = run_invoke("up", "--cluster", str(spec_path), env=_env(
        home, RAYFLEET_GCP_API_ENDPOINT=fake.url, GOOGLE_APPLICATION_CREDENTIALS=str(key_file)))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: gcp-tpu: the Cloud TPU API is not enabled in project test-project; run `gcloud "
        "services enable tpu.googleapis.com --project test-project`")
    assert "Traceback" not in result.stderr
    assert [r for r in fake.requests if r["method"] != "GET"] == []
    assert_nothing_created(home, "cli")


def test_teardown_and_status_without_state(tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    result = run_invoke("teardown", "--provider=gcp-tpu", env=env)
    assert result.returncode == 0 and "nothing to tear down" in result.stdout
    result = run_invoke("status", "--provider=gcp-tpu", env=env)
    # One mention of the cluster, not "gcp-tpu (gcp-tpu): gcp-tpu cluster 'gcp-tpu' is not up".
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "gcp-tpu: not up"
    result = run_invoke("dashboard", "--provider=gcp-tpu", env=env)
    assert result.returncode == 1 and "has no state" in result.stderr


def test_plan_of_the_shipped_example_renders_without_an_account_and_exits_1(
        tmp_path: Path) -> None:
    """No credentials: the plan is still shown (and rendered), but a failed pre-flight check is
    a failed plan: exit 1, naming the fix."""
    result = run_invoke("plan", "--provider=gcp-tpu", "--json", env=_env(tmp_path / "home"))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: 1 pre-flight check failed")
    planned = json.loads(result.stdout)
    assert planned["provider"] == "gcp-tpu"
    assert planned["files"] == sorted([config.FILE_NAME, node_start.CONF_NAME])
    assert any("no Google credentials found" in p for p in planned["problems"])
    assert [r["name"] for r in planned["resources"]][:2] == ["ray-gcp-tpu-head", "cpu"]


def test_autodown_default_and_null_warning(tmp_path: Path) -> None:
    """GCP specs remove themselves after 60 idle minutes unless `autodown: null`, which `up`
    warns about; the setting is enforced (no "not enforced" warning)."""
    import yaml

    from tests.gcp_tpu.conftest import BASE_SPEC

    env = _env(tmp_path / "home")
    default = tmp_path / "gdef.yaml"
    default.write_text(yaml.safe_dump(BASE_SPEC))
    plan = run_invoke("plan", "--cluster", str(default), env=env)
    assert plan.returncode == 1 and "no Google credentials" in plan.stderr, plan.stderr
    assert "autodown: the whole cluster removes itself after 60 idle minutes" in plan.stdout
    off = tmp_path / "goff.yaml"
    off.write_text(yaml.safe_dump({**BASE_SPEC, "autodown": None}))
    assert "autodown: off (autodown: null)" in run_invoke("plan", "--cluster", str(off),
                                                          env=env).stdout
    up = run_invoke("up", "--cluster", str(off), env=env)
    assert up.returncode != 0  # no credentials: nothing is created
    assert "autodown: null — this cluster never removes itself" in up.stderr, up.stderr
    up = run_invoke("up", "--cluster", str(default), env=env)
    assert up.returncode != 0 and "autodown:" not in up.stderr and "enforce" not in up.stderr, \
        up.stderr
    assert_nothing_created(tmp_path / "home", "gdef")
