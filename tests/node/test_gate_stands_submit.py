"""The submit body by allow-list: what a member's submission may carry is named, the rest refused
in one line naming it, and what Ray's own clients send still passes.

The real gateway over TLS in front of the bed's recording upstream (tests/node/gateway_bed.py);
stock bodies are made by Ray's own JobSubmissionClient and `ray job submit`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_packages as gk
from tests.node.gateway_bed import ANN, IDS, Bed, gateway_bed


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:
        yield started


def _refused(bed: Bed, body: dict[str, Any]) -> str:
    """The gateway's one line for a submission of `body` it refused (400); nothing reached Ray."""
    posted = len([m for m, p, _ in bed.upstream.seen if m == "POST"])
    status, text = bed.send("POST", "/api/jobs/", body=json.dumps(body).encode())
    line = text.decode().strip()
    assert status == 400 and "\n" not in line, (body, status, text)
    assert len([m for m, p, _ in bed.upstream.seen if m == "POST"]) == posted
    return line


def _env(**runtime_env: Any) -> dict[str, Any]:
    return {"entrypoint": "python x.py", "runtime_env": runtime_env}


def test_runtime_env_keys_off_the_list_are_refused_each_by_name(bed: Bed) -> None:
    for key, value in (("py_executable", "bash /tmp/x.sh;"),
                       ("worker_process_setup_hook", "evil.hook"),
                       ("container", {"image": "x"}), ("image_uri", "docker.io/x"),
                       ("conda", {"dependencies": ["x"]}), ("java_jars", ["gcs://x.jar"]),
                       ("_nsight", "default"), ("_inject_current_ray", True),
                       ("_ray_release", "x"), ("_ray_commit", "x"), ("my_plugin", {})):
        line = _refused(bed, _env(**{key: value}))
        assert line.startswith(f"runtime_env.{key}: members may not set it"), line
    for key in ("pip", "uv"):
        line = _refused(bed, _env(**{key: ["requests"]}))
        assert line.startswith(f"runtime_env.{key}:") and "sharing.members_may_pip" in line, line
    for key, value, named in (
            ("config", {"log_files": ["/etc/shadow"]}, "runtime_env.config.log_files"),
            ("config", {"setup_timeout_seconds": 60, "py_executable": "x"},
             "runtime_env.config.py_executable"),
            ("working_dir", "file:///home/owner/.rayfleet", "runtime_env.working_dir"),
            ("working_dir", "http://169.254.169.254/latest.zip", "runtime_env.working_dir"),
            ("py_modules", ["/usr/lib/python3/dist-packages"], "runtime_env.py_modules"),
            ("excludes", "*.pyc", "runtime_env.excludes")):
        line = _refused(bed, _env(**{key: value}))
        assert line.startswith(named), line


def test_env_vars_that_change_how_the_job_runs_are_refused_ignoring_case(bed: Bed) -> None:
    for name in ("BASH_ENV", "ENV", "PATH", "LD_PRELOAD", "ld_library_path", "PYTHONPATH",
                 "pythonstartup", "PYTHONWARNINGS", "PYTHONHOME", "RAY_ADDRESS",
                 "ray_job_stop_wait_time_s", "RAY_AUTH_TOKEN_PATH", "IFS", "PS4", "SHELLOPTS",
                 "BASHOPTS", "PROMPT_COMMAND", "HOME", "MLFLOW_TRACKING_PASSWORD",
                 "mlflow_tracking_uri"):
        line = _refused(bed, _env(env_vars={name: "x"}))
        assert line.startswith(f"runtime_env.env_vars.{name}: members may not set it"), line
    line = _refused(bed, _env(env_vars={"OMP_NUM_THREADS": 4}))
    assert line.startswith("runtime_env.env_vars.OMP_NUM_THREADS: its value must be a string")
    line = _refused(bed, _env(env_vars={"A=B": "x"}))
    assert line.startswith("runtime_env.env_vars: 'A=B' is not a variable name"), line
    # What a job may set passes, and the gateway's own run context wins over the member's.
    given = {"OMP_NUM_THREADS": "4", "MLFLOW_RUN_CONTEXT": '{"mlflow.user": "bo", "t": "1"}'}
    assert bed.send("POST", "/api/jobs/", body=json.dumps(_env(env_vars=given)).encode())[0] == 200
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "4"
    context = json.loads(sent["runtime_env"]["env_vars"]["MLFLOW_RUN_CONTEXT"])
    assert context == {"mlflow.user": "ann", "t": "1", "rayfleet.member": "ann"}


def test_fields_numbers_and_metadata_off_the_list_are_refused_each_by_name(bed: Bed) -> None:
    base = {"entrypoint": "python x.py"}
    for body, named in (
            ({**base, "entrypoint_shell": "/bin/sh"}, "entrypoint_shell: not a field"),
            ({"entrypoint": ""}, "entrypoint:"), ({"entrypoint": ["python"]}, "entrypoint:"),
            ({**base, "entrypoint_num_cpus": -1}, "entrypoint_num_cpus:"),
            ({**base, "entrypoint_num_cpus": float("inf")}, "entrypoint_num_cpus:"),
            ({**base, "entrypoint_num_gpus": float("nan")}, "entrypoint_num_gpus:"),
            ({**base, "entrypoint_num_gpus": "2"}, "entrypoint_num_gpus:"),
            ({**base, "entrypoint_num_gpus": True}, "entrypoint_num_gpus:"),
            ({**base, "entrypoint_memory": 1.5}, "entrypoint_memory:"),
            ({**base, "entrypoint_resources": {"GPU": 1}}, "entrypoint_resources: 'GPU'"),
            ({**base, "entrypoint_resources": {"node:__internal_head__": 0.01}},
             "entrypoint_resources: 'node:__internal_head__'"),
            ({**base, "entrypoint_resources": {"CPU_group_0_" + "ab" * 14: 1}},
             "entrypoint_resources: 'CPU_group_0_"),
            ({**base, "entrypoint_resources": {"bundle_group_" + "ab" * 14: 1}},
             "entrypoint_resources: 'bundle_group_"),
            ({**base, "entrypoint_resources": {"accelerator_type:A100": 1}},
             "entrypoint_resources: 'accelerator_type:A100'"),
            ({**base, "entrypoint_resources": {"licence": -1}}, "entrypoint_resources.licence:"),
            ({**base, "entrypoint_label_selector": {"zone": 1}}, "entrypoint_label_selector:"),
            ({**base, "metadata": {"job_submission_id": "raysubmit_bo1"}},
             "metadata.job_submission_id: Ray or the gateway sets it"),
            ({**base, "metadata": {"rayfleet_member": "bo"}}, "metadata.rayfleet_member:"),
            ({**base, "metadata": {"n": 1}}, "metadata: a JSON object of string keys"),
            ({**base, "metadata": {"notes": "x" * 17_000}}, "metadata: 17013 bytes")):
        line = _refused(bed, body)
        assert line.startswith(named), (named, line)
    # Within the list: forwarded as sent, with the gateway's own id and tags added.
    fine = {**base, "entrypoint_num_cpus": 0.5, "entrypoint_num_gpus": 0,
            "entrypoint_memory": 2 ** 30, "entrypoint_resources": {"licence": 1},
            "entrypoint_label_selector": {"zone": "a"}, "metadata": {"course": "ml"},
            "job_id": "hw1-ann", "runtime_env": None}
    assert bed.send("POST", "/api/jobs/", body=json.dumps(fine).encode())[0] == 200
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["submission_id"] == "hw1-ann" and "job_id" not in sent
    assert sent["metadata"] == {"course": "ml", "rayfleet_member": "ann"}
    assert {k: sent[k] for k in ("entrypoint_num_cpus", "entrypoint_memory",
                                 "entrypoint_resources")} == \
        {"entrypoint_num_cpus": 0.5, "entrypoint_memory": 2 ** 30,
         "entrypoint_resources": {"licence": 1}}


def test_pip_only_where_the_spec_allows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _env(pip={"packages": ["requests"], "pip_check": False}, _ray_commit="b7f4259e")
    with gateway_bed(tmp_path / "off", monkeypatch) as off:
        assert "sharing.members_may_pip" in _refused(off, body)
    with gateway_bed(tmp_path / "on", monkeypatch, members_may_pip=True) as on:
        assert on.send("POST", "/api/jobs/", body=json.dumps(body).encode())[0] == 200
        sent = json.loads([b for m, p, b in on.upstream.seen if m == "POST"][-1])
        assert sent["runtime_env"]["pip"] == body["runtime_env"]["pip"]
        assert "runtime_env.conda" in _refused(on, _env(conda={"dependencies": ["x"]}))


def _member_project(tmp_path: Path) -> Path:
    folder = tmp_path / "hw1"
    folder.mkdir()
    (folder / "x.py").write_text("print('hello')\n")
    return folder


def test_ray_job_sdk_and_cli_bodies_pass_and_the_same_sdk_with_a_hook_does_not(
        bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner
    from ray.dashboard.modules.job.cli import job_cli_group
    from ray.job_submission import JobSubmissionClient

    folder = _member_project(tmp_path)
    url, headers = f"https://127.0.0.1:{bed.port}", {"Authorization": f"Bearer {ANN}"}
    client = JobSubmissionClient(url, headers=headers, verify=bed.ca)
    # Everything Ray's SDK takes that a member may use, as Ray's SDK builds the body.
    job = client.submit_job(
        entrypoint="python x.py", metadata={"course": "ml"}, entrypoint_num_cpus=1,
        entrypoint_resources={"licence": 1}, entrypoint_label_selector={"zone": "a"},
        runtime_env={"working_dir": str(folder), "excludes": ["*.log"],
                     "env_vars": {"OMP_NUM_THREADS": "2"},
                     "config": {"setup_timeout_seconds": 60, "eager_install": False}})
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["submission_id"] == job and job.startswith("raysubmit_")
    assert sent["runtime_env"]["config"] == {"setup_timeout_seconds": 60, "eager_install": False,
                                             "log_files": []}
    uploaded = sent["runtime_env"]["working_dir"].removeprefix("gcs://")
    assert uploaded.startswith(gk.scoped(IDS["ann"], "")) and uploaded in bed.upstream.packages
    # The stock CLI, as a member types it in their folder.
    monkeypatch.chdir(folder)
    run = CliRunner().invoke(job_cli_group, [
        "submit", "--address", url, "--verify", bed.ca, "--headers", json.dumps(headers),
        "--working-dir", ".", "--no-wait", "--", "python", "x.py"])
    assert run.exit_code == 0, run.output
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["entrypoint"] == "python x.py" and sent["submission_id"] in run.output
    # The same SDK asked for what a member may not set: refused, in the gateway's one line.
    with pytest.raises(RuntimeError) as refused:
        client.submit_job(entrypoint="python x.py", runtime_env={
            "working_dir": str(folder), "worker_process_setup_hook": "x.setup"})
    assert "400: runtime_env.worker_process_setup_hook: members may not set it" in \
        str(refused.value)
