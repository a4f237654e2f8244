"""A student's path, one step each way: the folder `member-add` writes (sourcing its env.sh is all
stock Ray needs), the one line the owner sends, `join` where the class's repository ships a spec of
the cluster's name (the shadowing case: the joined cluster wins), and the hints a member gets."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import certifi
import pytest

from infra.cli import commands
from infra.cli import sharing as commands_sharing
from infra.core import jobs
from infra.core.endpoint import Endpoint
from infra.core.sharing import membership
from infra.node import gateway_state
from tests.classroom_owner import URL, book, owner_cluster
from tests.conftest import ROOT
from tests.forked_cli import run_invoke


def _sourced(env_sh: Path, cwd: Path) -> dict[str, str]:
    """The variables a shell has after `source env.sh`, run from `cwd` with a relative path."""
    line = f'source {os.path.relpath(env_sh, cwd)} && env -0'
    done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, check=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(cwd)})
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def test_member_add_writes_a_folder_whose_env_sh_is_all_stock_ray_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    out = capfd.readouterr().out.strip().splitlines()
    folder = tmp_path / "class-alice"
    assert out[0] == f"member 'alice' added; folder: {folder}"
    # One line to send, and every command in it exists for a student with only pip.
    assert len(out) == 2
    assert out[1].startswith("send the folder class-alice/ privately to alice")
    assert 'pip install "ray[default]==' in out[1] and "source class-alice/env.sh" in out[1]
    assert "invoke" not in out[1]
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    bundle = json.loads((folder / "class-alice.rayfleet.json").read_text())
    token = (folder / "ray-token").read_text()
    for private in ("ray-token", "class-alice.rayfleet.json"):
        assert oct((folder / private).stat().st_mode & 0o777) == "0o600", private
    assert bundle["token"] == token and bundle["address"] == URL
    assert book()["members"]["alice"]["token_sha256"] == gateway_state.token_hash(token)
    ca = (folder / "ca.pem").read_text()
    assert ca == bundle["ca_cert"]
    both = (folder / "ca-bundle.pem").read_text()
    public = Path(certifi.where()).read_text().split("-----END CERTIFICATE-----")[0]
    assert both.startswith(ca.rstrip()) and public.strip() in both

    # The student moves the folder anywhere and sources it from elsewhere.
    moved = tmp_path / "student" / "courses" / "class-alice"
    moved.parent.mkdir(parents=True)
    shutil.move(str(folder), moved)
    env = _sourced(moved / "env.sh", tmp_path / "student")
    expected = {"RAY_API_SERVER_ADDRESS": URL, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(moved / "ray-token"),
                "REQUESTS_CA_BUNDLE": str(moved / "ca-bundle.pem"),
                "SSL_CERT_FILE": str(moved / "ca-bundle.pem")}
    assert {k: env.get(k) for k in expected} == expected
    assert set(expected) == set(membership.ENV_NAMES)  # what `rayfleet env` prints, no more
    assert "_rayfleet_dir" not in env


def test_a_bundle_alone_is_still_written_where_out_names_a_json_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "bob", False, None, str(tmp_path / "bob.json"))
    assert json.loads((tmp_path / "bob.json").read_text())["member"] == "bob"
    assert not (tmp_path / "class-bob").exists()
    assert "rayfleet join bob.json" in capfd.readouterr().out


def test_the_student_command_is_rayfleet_and_the_readme_says_how_to_install_it() -> None:
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1]
    assert re.search(r'^rayfleet = "infra.cli.tasks:main"$', scripts, flags=re.M)
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A student of a shared cluster", 1)[1].split("\n## ", 1)[0]
    assert "source" in section and "env.sh" in section and "rayfleet join" in section
    assert "pip install" in section


def test_a_joined_cluster_wins_over_a_spec_of_the_same_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shadowing case: a class repository ships clusters/class.yaml; a student who joined
    `class` reaches the gateway with `--cluster class`, the spec by its path."""
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    repo = tmp_path / "class-repo"
    (repo / "clusters").mkdir(parents=True)
    shipped = repo / "clusters" / "class.yaml"
    shipped.write_text("provider: local\n")
    env = {"RAYFLEET_HOME": str(tmp_path / "student-home"),
           "RAYFLEET_CLUSTERS": str(repo / "clusters")}
    joined = run_invoke("-r", str(ROOT), "join", str(tmp_path / "class-alice"), env=env, cwd=repo)
    assert joined.returncode == 0, joined.stderr
    assert f"joined 'class' as member 'alice' ({URL})" in joined.stdout
    assert "None" not in joined.stdout
    said = joined.stderr.strip().splitlines()
    assert len(said) == 1 and str(shipped) in said[0] and "now means the cluster you joined" \
        in said[0], joined.stderr
    printed = run_invoke("-r", str(ROOT), "env", "--cluster", "class", env=env, cwd=repo)
    assert printed.returncode == 0, printed.stderr
    assert f"RAY_API_SERVER_ADDRESS={URL}" in printed.stdout
    assert str(tmp_path / "student-home" / "joined" / "class" / "ray-token") in printed.stdout
    refused = run_invoke("-r", str(ROOT), "up", "--cluster", "class", env=env, cwd=repo)
    assert refused.returncode != 0 and "is the owner's" in refused.stderr
    assert "--cluster clusters/class.yaml" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def _joined_as_alice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine joined cluster `class` as member alice (what `join` leaves), nothing else."""
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAYFLEET_CLUSTERS", str(tmp_path / "clusters"))
    target = membership.folder("class")
    target.mkdir(parents=True)
    (target / membership.INFO_FILE).write_text(json.dumps(
        {"cluster": "class", "address": URL, "member": "alice"}))


class _Client:
    def submit_job(self, **_: object) -> str:
        return "raysubmit_abc"


def test_submit_no_wait_on_a_joined_cluster_hints_rayfleet_logs_with_its_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    _joined_as_alice(tmp_path, monkeypatch)
    monkeypatch.setattr(jobs, "job_client", lambda endpoint: _Client())
    (tmp_path / "train.py").write_text("print(1)\n")
    monkeypatch.setattr(membership, "endpoint", lambda cluster: Endpoint(URL, URL))
    assert commands.submit(None, "class", str(tmp_path / "train.py"), [], None, False) == 0
    err = capfd.readouterr().err
    assert "`rayfleet logs raysubmit_abc --cluster class`" in err, err
    assert "`rayfleet stop-job raysubmit_abc --cluster class`" in err


def test_the_members_folder_stays_out_of_the_working_dir_the_sent_line_uploads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The line sent with the folder is `source class-alice/env.sh && ray job submit --working-dir
    . -- ...`: the folder lies in the uploaded project. Ray's own packing (what stock `ray job
    submit` runs) must leave it out, token and bundle included, and so must rayfleet's submit."""
    from zipfile import ZipFile

    from ray._private.runtime_env.packaging import create_package

    spec = owner_cluster(tmp_path, monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    commands_sharing.member_add(None, str(spec), "alice", False, None,
                                str(project / "class-alice"))
    commands_sharing.member_add(None, str(spec), "bob", False, None,
                                str(project / "bob.rayfleet.json"))
    assert (project / "class-alice" / "ray-token").is_file()
    for gitignore in (True, False):  # RAY_RUNTIME_ENV_IGNORE_GITIGNORE either way
        package = tmp_path / f"pkg-{gitignore}.zip"
        create_package(str(project), package, include_gitignore=gitignore)
        shipped = {name for name in ZipFile(package).namelist() if not name.endswith("/")}
        assert not any(n.startswith("class-alice/") for n in shipped), shipped
        assert "train.py" in shipped
    from pathspec import PathSpec  # what Ray reads `excludes` with

    _, env = jobs.prepare(str(project / "train.py"), [], None)
    excluded = PathSpec.from_lines("gitwildmatch", env["excludes"])
    for private in ("bob.rayfleet.json", "class-alice/ray-token",
                    "class-alice/class-alice.rayfleet.json"):
        assert excluded.match_file(private), private


class _Listing:
    """Ray's JobSubmissionClient.list_jobs as the gateway answers a member: their jobs, a stopped
    one carrying the gateway's reason in its message."""

    def list_jobs(self) -> list[object]:
        from ray.job_submission import JobDetails, JobStatus, JobType
        reason = "stopped by the cluster: it ran past sharing.max_job_hours (0.01 h)"
        return [JobDetails(type=JobType.SUBMISSION, submission_id="raysubmit_long",
                           entrypoint="python train.py 120", status=JobStatus.STOPPED,
                           message=reason),
                JobDetails(type=JobType.SUBMISSION, submission_id="raysubmit_ok",
                           entrypoint="python train.py", status=JobStatus.SUCCEEDED,
                           message="Job finished successfully.")]


def test_a_members_status_says_who_stopped_their_job_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Stock `ray job status` prints only "was stopped"; the member's `rayfleet status` names why."""
    _joined_as_alice(tmp_path, monkeypatch)
    monkeypatch.setattr(jobs, "job_client", lambda endpoint: _Listing())
    monkeypatch.setattr(membership, "endpoint", lambda cluster: Endpoint(URL, URL))
    assert commands_sharing.status("class", False) == 0
    lines = capfd.readouterr().out.splitlines()
    assert ("  raysubmit_long  STOPPED  python train.py 120  (stopped by the cluster: it ran past "
            "sharing.max_job_hours (0.01 h))") in lines, lines
    assert "  raysubmit_ok  SUCCEEDED  python train.py" in lines, lines
    assert commands_sharing.status("class", True) == 0
    shown = json.loads(capfd.readouterr().out)["jobs"]
    assert shown[0]["stopped"].endswith("(0.01 h)") and shown[1]["stopped"] == ""


def test_an_installed_rayfleet_keeps_a_students_files_in_their_home_not_in_site_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install ./rayfleet` (the README's line for a student) puts the package in
    site-packages: `join` must keep the token under ~/.rayfleet, and specs come from the folder
    the student works in; a checkout keeps its own .rayfleet/ and clusters/."""
    import importlib.util

    from infra.core import paths

    package = tmp_path / "site-packages" / "infra"
    (package / "core").mkdir(parents=True)
    (package / "_shipped" / "templates").mkdir(parents=True)  # what only a wheel carries
    shutil.copy2(paths.__file__, package / "core" / "paths.py")
    loaded = importlib.util.spec_from_file_location("installed_paths", package / "core" / "paths.py")
    assert loaded is not None and loaded.loader is not None
    installed = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(installed)
    monkeypatch.delenv("RAYFLEET_HOME", raising=False)
    monkeypatch.delenv("RAYFLEET_CLUSTERS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "student"))
    work = tmp_path / "class-repo"
    work.mkdir()
    monkeypatch.chdir(work)
    assert installed.home() == tmp_path / "student" / ".rayfleet"
    assert installed.clusters_dir() == work / "clusters"
    assert paths.home() == ROOT / ".rayfleet" and paths.clusters_dir() == ROOT / "clusters"
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "chosen"))
    assert installed.home() == tmp_path / "chosen"


def test_a_refused_member_reads_the_gateways_words_not_cannot_reach(tmp_path: Path) -> None:
    """An expired or removed member's `rayfleet status`/`submit`: the gateway answers 403 with its
    reason, which Ray's SDK wraps as "Authentication failed: ..."; we reached it, it refused."""
    import http.server
    import threading

    from infra.core.errors import JobError

    said = b"member bob's access expired on 2026-11-27T00:00:00+00:00; ask the cluster's owner"

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(403)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(said)))
            self.end_headers()
            self.wfile.write(said)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        token = tmp_path / "ray-token"
        token.write_text("t" * 64)
        with pytest.raises(JobError) as refused:
            jobs.job_client(Endpoint(url, url, token_path=token))
    finally:
        server.shutdown()
    assert str(refused.value) == f"{url} refused: {said.decode()}", refused.value


class _Refusing:
    """Ray's JobSubmissionClient.submit_job as a gateway's 429 reaches it (Ray's own words first)."""

    def submit_job(self, **_: object) -> str:
        raise RuntimeError("Request failed with status code 429: member bob has used 0.02 "
                           "job-hours of their budget (sharing.member_budget_hours 0.01); ask the "
                           "cluster's owner for more\n.")


def test_a_refused_submit_is_one_line_in_the_gateways_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.core.errors import JobError

    monkeypatch.setattr(jobs, "job_client", lambda endpoint: _Refusing())
    (tmp_path / "train.py").write_text("print(1)\n")
    command, env = jobs.prepare(str(tmp_path / "train.py"), [], None, None)
    with pytest.raises(JobError) as refused:
        jobs.submit(Endpoint(URL, URL), command, env, False)
    assert str(refused.value) == (
        "submit refused: member bob has used 0.02 job-hours of their budget "
        "(sharing.member_budget_hours 0.01); ask the cluster's owner for more"), refused.value
