"""A shared local cluster end to end: members in their own homes, with Ray's stock `ray job` CLI,
through the real TLS gateway (one cluster for the module).

Each member joins their bundle in a home of their own (HOME and RAYFLEET_HOME), takes the lines
`invoke env` prints, and from then on uses nothing of rayfleet: the same lines the docs give a
member who has only Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import certifi
import pytest
import requests

from infra.node import rayproc, supervise
from tests import forked_cli
from tests.conftest import ROOT, run_invoke, run_rayfleet
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
#: 54 s: long enough for the other tests' sleepers, short enough to watch the head stop one.
MAX_JOB_HOURS = 0.015
SLEEPER = "python -c \"import time; print('RUN' + 'NING', flush=True); time.sleep(300)\""
#: The owner's verbs that start or stop Ray and the head's daemons: a fresh process each. The
#: others answer and return, forked from the CLI's zygote (tests/forked_cli.py: ~0.4 s of CPU of
#: imports less per command).
STARTS = frozenset({"up", "teardown", "rotate-token"})


@dataclass
class Member:
    name: str
    home: Path
    env: dict[str, str]
    answers: list[str]

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Ray's own job CLI, with nothing but the member's exported variables."""
        done = subprocess.run([RAY, "job", *args], env=self.env, cwd=self.home,
                              capture_output=True, text=True, timeout=timeout, check=False)
        self.answers.append(done.stdout + done.stderr)
        return done

    def submit(self, command: str, *flags: str) -> str:
        done = self.ray("submit", "--no-wait", *flags, "--", *shlex.split(command))
        found = re.search(r"raysubmit_\w+", done.stdout + done.stderr)
        assert done.returncode == 0 and found, done.stdout + done.stderr
        return found.group(0)

    def get(self, path: str, token: str | None = None) -> requests.Response:
        token = token if token is not None else Path(self.env["RAY_AUTH_TOKEN_PATH"]).read_text()
        answer = requests.get(self.env["RAY_API_SERVER_ADDRESS"] + path,
                              headers={"Authorization": f"Bearer {token}"} if token else {},
                              verify=self.env["REQUESTS_CA_BUNDLE"], timeout=30)
        self.answers.append(answer.text)
        return answer

    def logged(self, job: str, wanted: str, timeout: float = 120) -> str:
        """The job's log once a whole line of it holds `wanted`, read as `ray job logs` reads it:
        one HTTP call a poll (a `ray job` CLI a poll is 2-3 s of CPU on 2 cores); the tests that
        are about the CLI read it once after."""
        def printed() -> str | None:
            answer = self.get(f"/api/jobs/{job}/logs")
            text = str(answer.json().get("logs", "")) if answer.status_code == 200 else ""
            # A line counts once it has ended: the log is read while the job's output arrives;
            # Ray's own first line repeats the entrypoint, which may hold `wanted` too.
            return text if any(wanted in line for line in text.splitlines(keepends=True)
                               if line.endswith("\n")
                               and not line.startswith("Running entrypoint for job")) else None

        return wait_until(printed, f"{wanted!r} in {self.name}'s job {job}'s logs",
                          timeout=timeout, interval=0.5)

    def ended(self, job: str, timeout: float = 120) -> dict[str, Any]:
        """Ray's record of the job once it ended (one HTTP call a poll)."""
        def record() -> dict[str, Any] | None:
            answer = self.get(f"/api/jobs/{job}")
            found = answer.json() if answer.status_code == 200 else {}
            return found if found.get("status") in ("SUCCEEDED", "FAILED", "STOPPED") else None

        return wait_until(record, f"{self.name}'s job {job} to end", timeout=timeout,
                          interval=0.5)


@dataclass
class Shared:
    spec: Path
    env: dict[str, str]
    port: int
    folder: Path
    up_output: str
    #: `up`'s stderr alone: where issue 29's one-line warning goes.
    up_stderr: str
    members: dict[str, Member] = field(default_factory=dict)
    #: Every command a fresh process (the isolation module's: its process changes namespace, and
    #: a zygote started there would stay in it).
    fresh: bool = False

    def invoke(self, *args: str) -> subprocess.CompletedProcess[str]:
        run = run_invoke if self.fresh or args[0] in STARTS else forked_cli.run_invoke
        return run("-r", str(ROOT), args[0], "--cluster", str(self.spec), *args[1:],
                   env=self.env, timeout=120, cwd=self.folder)

    def cluster_token(self) -> str:
        return (Path(self.env["RAYFLEET_HOME"]) / "keys" / self.spec.stem / "ray-token").read_text()

    def owner_token(self) -> str:
        """The owner's own gateway token (the gateway takes the cluster's Ray token from nobody)."""
        return (Path(self.env["RAYFLEET_HOME"]) / "sharing" / self.spec.stem
                / "owner-token").read_text().strip()

    def add(self, name: str, *flags: str) -> Member:
        bundle = self.folder / f"{name}.json"
        added = self.invoke("member-add", name, "--out", str(bundle), *flags)
        assert added.returncode == 0, added.stdout + added.stderr
        assert oct(bundle.stat().st_mode & 0o777) == "0o600"
        home = self.folder / f"home-{name}"
        home.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "RAYFLEET_HOME": str(home / ".rf"),
               "RAY_USAGE_STATS_ENABLED": "0"}
        run = run_invoke if self.fresh else forked_cli.run_invoke
        joined = run("-r", str(ROOT), "join", str(bundle), env=env, cwd=home)
        assert joined.returncode == 0, joined.stdout + joined.stderr
        printed = run("-r", str(ROOT), "env", "--cluster", self.spec.stem, env=env, cwd=home)
        assert printed.returncode == 0, printed.stderr
        line = printed.stdout.strip()
        assert line.startswith("export ")
        exported = dict(item.split("=", 1) for item in line.removeprefix("export ").split())
        # The member's own shell: only what a stock-Ray member would have, plus the exports.
        member = Member(name, home, {**env, **exported}, [joined.stdout, printed.stdout])
        self.members[name] = member
        return member

    def enrol(self, *names: str) -> list[Member]:
        """Members in homes of their own, added with one `rayfleet member-add --roster` (one
        command for a whole class: `add`'s three `invoke`s per member cost ~3 s each on 2 cores),
        each shell's variables from their folder's env.sh, as a member's `source` sets them."""
        new = [name for name in names if name not in self.members]
        if new:
            roster = self.folder / f"roster-{new[0]}.csv"
            roster.write_text("name,role,expires\n" + "".join(f"{name},,\n" for name in new))
            out = self.folder / f"folders-{new[0]}"
            run = run_rayfleet if self.fresh else forked_cli.run_rayfleet
            added = run("member-add", "--cluster", str(self.spec), "--roster", str(roster),
                        "--out", str(out), env=self.env, cwd=self.folder, timeout=120)
            assert added.returncode == 0, added.stdout + added.stderr
            for name in new:
                home = self.folder / f"home-{name}"
                home.mkdir()
                base = {"PATH": os.environ["PATH"], "HOME": str(home),
                        "RAY_USAGE_STATS_ENABLED": "0"}
                sourced = subprocess.run(["bash", "-c", "source env.sh >/dev/null && env -0"],
                                         cwd=out / f"{self.spec.stem}-{name}", env=base,
                                         capture_output=True, text=True, timeout=30, check=True)
                env = dict(item.split("=", 1) for item in sourced.stdout.split("\0") if "=" in item)
                self.members[name] = Member(name, home, {**base, **{
                    k: v for k, v in env.items() if k.startswith(("RAY_", "REQUESTS_", "SSL_"))}},
                    [])
        return [self.members[name] for name in names]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory, "shr", "max_running_jobs_per_member: 1",
                        f"max_job_hours: {MAX_JOB_HOURS}") as cluster:
        yield cluster
        port = cluster.port
    assert not rayproc.port_answers("127.0.0.1", port), "teardown left the gateway listening"


@contextlib.contextmanager
def shared_cluster(tmp_path_factory: pytest.TempPathFactory, prefix: str,
                   *sharing: str, cpus: int = 4) -> Iterator[Shared]:
    """A shared local cluster for one module (`sharing`: more lines of its `sharing:` block),
    torn down at the end; teardown must succeed."""
    folder = tmp_path_factory.mktemp(prefix)
    spec = folder / f"{prefix}-{uuid.uuid4().hex[:6]}.yaml"
    port = rayproc.free_port()
    lines = "".join(f"  {line}\n" for line in (f"port: {port}", "members_run_as_owner: true",
                                               *sharing))
    spec.write_text(f"provider: local\nnum_cpus: {cpus}\nobject_store_memory_mb: 100\n"
                    f"sharing:\n{lines}")
    env = {"RAYFLEET_HOME": str(folder / "owner-home")}
    up = run_invoke("-r", str(ROOT), "up", "--cluster", str(spec), env=env, cwd=folder)
    cluster = Shared(spec, env, port, folder, up.stdout + up.stderr, up.stderr)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield cluster
    finally:
        down = cluster.invoke("teardown")
        assert down.returncode == 0, down.stdout + down.stderr


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(check, what, timeout=timeout, interval=0.2)


def warns_once(stderr: str) -> None:
    """Issue 29's warning (`members_run_as_owner`), in one line of an `up`'s stderr."""
    warnings = [line for line in stderr.splitlines() if "members_run_as_owner" in line]
    assert len(warnings) == 1 and "run as your own account" in warnings[0], stderr


def test_with_the_acknowledgement_every_up_warns_in_one_line(shared: Shared) -> None:
    """The module's spec says `members_run_as_owner: true`: its first `up` warns in one line and
    starts the gateway. The next `up`s, on the running cluster and after a teardown, are checked
    where tests run them (test_usage_survives_a_gateway_restart here;
    tests/local/test_e2e_term_record.py's teardown and new `up`); the gateway's port is closed
    after the teardown (there and in the `shared` fixture)."""
    warns_once(shared.up_stderr)
    assert rayproc.port_answers("127.0.0.1", shared.port)


def test_members_see_and_act_on_their_own_jobs_only(shared: Shared) -> None:
    alice, bob = shared.add("alice"), shared.add("bob")
    assert "members_run_as_owner" in shared.up_output  # issue 29's warning, at this `up` too
    # Alice claims to be bob: the gateway refuses the claim, naming the field, and records no
    # job; her plain submission is then recorded as hers (the gateway's word stands).
    claimed = alice.ray("submit", "--no-wait", "--metadata-json",
                        json.dumps({"rayfleet_member": "bob"}), "--", *shlex.split(SLEEPER))
    assert claimed.returncode != 0, claimed.stdout + claimed.stderr
    assert "metadata.rayfleet_member" in claimed.stdout + claimed.stderr
    assert not re.search(r"raysubmit_\w+", claimed.stdout + claimed.stderr)
    job = alice.submit(SLEEPER)
    # The running-jobs cap (1), checked at once (the head stops the sleeper after MAX_JOB_HOURS):
    # alice's next submit is refused, naming it; bob's own goes in (below).
    capped = alice.ray("submit", "--no-wait", "--", "python", "-c", "print(1)")
    assert capped.returncode != 0 and "max_running_jobs_per_member" in capped.stdout + capped.stderr
    listed = alice.ray("list")
    assert listed.returncode == 0 and job in listed.stdout
    assert "'rayfleet_member': 'alice'" in listed.stdout
    assert job not in bob.ray("list").stdout
    alice.logged(job, "RUNNING")
    assert "RUNNING" in alice.ray("logs", job).stdout  # alice reads her job's logs with Ray's CLI
    for args in (("logs", job), ("stop", job), ("status", job)):
        # Answered as a job that does not exist: Ray's CLI says so, not "token invalid".
        refused = bob.ray(*args)
        assert refused.returncode != 0 and "does not exist" in refused.stdout + refused.stderr, args
    # The audit log on the head: who, what, when, which job, the answer (refusals included).
    audit = [json.loads(line) for line in (Path(shared.env["RAYFLEET_HOME"]) / "sharing"
                                           / shared.spec.stem / "audit.log").read_text().splitlines()]
    assert any(e.get("who") == "bob" and e.get("method") == "POST" and e.get("job") == job
               and e.get("status") == 404 and e.get("at") and e.get("source") for e in audit)
    assert any(e.get("who") == "alice" and e.get("method") == "POST" and e.get("job") == job
               and e.get("path") == "/api/jobs/" and e.get("status") == 200 for e in audit)
    bobs = bob.submit("python -c print(2)")
    stopped = alice.ray("stop", job)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    from ray.job_submission import JobSubmissionClient

    owner = JobSubmissionClient(shared.invoke("env").stdout.split("RAY_API_SERVER_ADDRESS=")[1]
                                .split()[0], headers={"Authorization":
                                                      f"Bearer {shared.cluster_token()}"})
    details = {j.submission_id: j for j in owner.list_jobs()}
    assert details[job].metadata == {"rayfleet_member": "alice"}
    assert details[bobs].metadata == {"rayfleet_member": "bob"}
    context = json.loads((details[job].runtime_env or {})["env_vars"]["MLFLOW_RUN_CONTEXT"])
    assert context["mlflow.user"] == "alice"


def test_revocation_holds_within_5s_while_others_keep_working(shared: Shared) -> None:
    dave, erin = shared.add("dave"), shared.add("erin")
    job = dave.submit(SLEEPER)
    assert dave.get("/api/jobs/").status_code == 200
    removed = shared.invoke("member-remove", "dave", "--stop-jobs")
    assert removed.returncode == 0, removed.stderr
    started = time.monotonic()
    _wait_for(lambda: dave.get("/api/jobs/").status_code == 403, 5, "dave refused")
    assert time.monotonic() - started < 5
    assert f"job {job} STOPPED" in removed.stdout  # --stop-jobs: the owner stopped dave's job
    assert erin.get("/api/jobs/").status_code == 200
    assert erin.ray("list").returncode == 0


def test_expired_wrong_token_no_token_wrong_ca_and_plain_http_are_refused(shared: Shared) -> None:
    frank = shared.add("frank", "--expires-days", "0.00003")  # about 2.6 s
    _wait_for(lambda: frank.get("/api/jobs/").status_code == 403, 10, "frank expired")
    assert "expired" in frank.get("/api/jobs/").text
    gina = shared.add("gina")
    assert gina.get("/api/jobs/", token="0" * 64).status_code == 403
    assert gina.get("/api/jobs/", token="").status_code == 401
    wrong = dict(gina.env, RAY_AUTH_TOKEN_PATH=str(gina.home / "wrong"))
    (gina.home / "wrong").write_text("f" * 64)
    listed = subprocess.run([RAY, "job", "list"], env=wrong, capture_output=True, text=True,
                            timeout=120, check=False)
    assert listed.returncode != 0
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(gina.env["RAY_API_SERVER_ADDRESS"] + "/api/jobs/", timeout=10,
                     verify=certifi.where())  # the public CAs alone: not the cluster's
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{shared.port}/api/jobs/", timeout=10)
    # TLS 1.2 at least: what the gateway negotiates with a client offering everything.
    context = ssl.create_default_context(cafile=gina.env["REQUESTS_CA_BUNDLE"])
    with socket.create_connection(("127.0.0.1", shared.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_failed_logins_turn_away_their_source_address_only(shared: Shared) -> None:
    """Ten wrong tokens from 127.0.0.2 within a minute: that address gets 429 for a minute for
    anything but a valid token (behind a class's NAT, one address is every member: a good token
    still passes); the members on 127.0.0.1 are not touched (per source address)."""
    import http.client

    nina = shared.add("nina")
    good = Path(nina.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    context = ssl.create_default_context(cafile=nina.env["REQUESTS_CA_BUNDLE"])

    def status_from(source: str, token: str) -> int:
        connection = http.client.HTTPSConnection("127.0.0.1", shared.port, timeout=30,
                                                 context=context, source_address=(source, 0))
        try:
            connection.request("GET", "/api/jobs/", headers={"Authorization": f"Bearer {token}"})
            return connection.getresponse().status
        finally:
            connection.close()

    assert status_from("127.0.0.2", good) == 200
    assert [status_from("127.0.0.2", "e" * 64) for _ in range(10)] == [403] * 10
    assert status_from("127.0.0.2", "e" * 64) == 429
    assert status_from("127.0.0.2", "f" * 64) == 429
    assert status_from("127.0.0.2", good) == 200
    assert status_from("127.0.0.1", good) == 200


def test_cluster_token_reaches_no_member(shared: Shared) -> None:
    hank = shared.add("hank")
    # A job that prints the token file Ray's nodes read: the gateway's answer holds no token.
    job = hank.submit("python -c \"import os; print('T=' + open(os.environ['RAY_AUTH_TOKEN_PATH'])"
                      ".read())\"")
    hank.logged(job, "T=")
    assert "T=<secret>" in hank.ray("logs", job).stdout
    token = shared.cluster_token().strip()
    for member in shared.members.values():
        for answer in member.answers:
            assert token not in answer, member.name
        for path in member.home.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
    for bundle in shared.folder.glob("*.json"):
        assert token not in bundle.read_text()


def test_members_json_counts_jobs_per_member(shared: Shared) -> None:
    ivy = shared.add("ivy")
    # One after the other (the module's cap is one running job a member), each waited for over
    # HTTP (a blocking `ray job submit` tails the job's log until it ends).
    for number in (1, 2):
        assert ivy.ended(ivy.submit(f"python -c print({number})"))["status"] == "SUCCEEDED"
    listed = shared.invoke("members", "--json")
    assert listed.returncode == 0, listed.stderr
    answer = json.loads(listed.stdout)
    rows = {row["name"]: row for row in answer["members"]}
    assert rows["ivy"]["total_jobs"] == 2 and rows["ivy"]["running_jobs"] == 0
    # A local cluster costs $0 (no node prices from the provider): shares and total say so.
    assert rows["ivy"]["cost_share_usd"] == 0.0
    assert answer["cluster_cost"] == {"hourly_usd": 0.0, "accrued_usd": 0.0, "owner_usd": 0.0,
                                      "idle_usd": 0.0}
    assert rows["ivy"]["job_hours"] > 0 and rows["ivy"]["role"] == "member"
    assert rows["ivy"]["last_seen"] is not None
    # A removed member is kept, marked, never counted as active (one of this test's own: the
    # other tests' removals may or may not have run before it).
    added = shared.invoke("member-add", "ivy-gone", "--out", str(shared.folder / "ivy-gone.json"))
    assert added.returncode == 0, added.stdout + added.stderr
    removed = shared.invoke("member-remove", "ivy-gone")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    gone = {row["name"]: row for row in json.loads(shared.invoke("members", "--json").stdout)
            ["members"]}["ivy-gone"]
    assert gone["status"] == "removed" and gone["total_jobs"] == 0, gone
    # The table (a row per person): ivy's row counts her 2 jobs and her hours, by column.
    table = shared.invoke("members")
    assert table.returncode == 0, table.stdout + table.stderr
    lines = table.stdout.splitlines()
    header = next(line for line in lines if line.startswith("name "))
    jobs_at, hours_at, cost_at = (header.index(col) for col in ("jobs", "hours", "cost"))
    ivys = [line for line in lines if line.split()[:1] == ["ivy"]]
    assert len(ivys) == 1, table.stdout
    assert ivys[0][jobs_at:hours_at].strip() == "2", table.stdout
    assert ivys[0][hours_at:cost_at].strip().endswith(" h"), table.stdout


def test_duplicate_and_unknown_member_refused_in_one_line(shared: Shared) -> None:
    shared.add("jack")
    registry = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem / "members.json"
    before = registry.read_bytes()
    again = shared.invoke("member-add", "jack", "--out", str(shared.folder / "jack2.json"))
    assert again.returncode != 0 and "already exists" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert not (shared.folder / "jack2.json").exists() and registry.read_bytes() == before
    unknown = shared.invoke("member-remove", "nobody")
    assert unknown.returncode != 0 and "no member 'nobody'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and registry.read_bytes() == before
    owner_only = run_invoke("-r", str(ROOT), "teardown", "--cluster", shared.spec.stem,
                            env=shared.members["jack"].env, cwd=shared.members["jack"].home)
    assert owner_only.returncode != 0 and "is the owner's" in owner_only.stderr


def test_members_see_the_dashboard_but_no_unfiltered_view_and_change_nothing(shared: Shared) -> None:
    lou = shared.add("lou")
    page = lou.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert lou.get("/nodes?view=summary").status_code == 200
    # Answered 200 in Ray's shape, which keeps the dashboard's pages quiet (a 401 or 403 opens its
    # token dialog, a 404 or 500 an error), but holding only lou's jobs' items: he has none.
    views = {"/api/v0/tasks": lambda a: a["data"]["result"]["result"],
             "/api/v0/actors": lambda a: a["data"]["result"]["result"],
             "/logical/actors": lambda a: a["data"]["actors"],
             "/api/serve/applications/": lambda a: a["applications"]}
    for path, items in views.items():
        answer = lou.get(path)
        assert answer.status_code == 200 and not items(answer.json()), (path, answer.text[:300])
    # What lou does not see is there: the other members' jobs' supervisor actors.
    every = requests.get(lou.env["RAY_API_SERVER_ADDRESS"] + "/logical/actors",
                         headers={"Authorization": f"Bearer {shared.owner_token()}"},
                         verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=60)
    assert every.status_code == 200 and every.json()["data"]["actors"]
    token = Path(lou.env["RAY_AUTH_TOKEN_PATH"]).read_text()
    for method, path in (("PUT", "/api/serve/applications/"), ("DELETE", "/api/serve/applications/"),
                         ("POST", "/api/component_activities")):
        refused = requests.request(method, lou.env["RAY_API_SERVER_ADDRESS"] + path, json={},
                                   headers={"Authorization": f"Bearer {token}"},
                                   verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=30)
        assert refused.status_code == 403, (method, path)
    # The browser's login sets a session cookie: neither the member's token nor the cluster's
    # (tests/node/test_gate_stands_signin.py), and it acts as the member.
    login = requests.post(lou.env["RAY_API_SERVER_ADDRESS"] + "/api/authenticate",
                          headers={"Authorization": f"Bearer {token}"},
                          verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=30)
    session = login.cookies["ray-authentication-token"]
    assert login.status_code == 200 and session and token.strip() not in session
    assert requests.get(lou.env["RAY_API_SERVER_ADDRESS"] + "/api/jobs/",
                        cookies={"ray-authentication-token": session},
                        verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=30).status_code == 200
    owner = requests.get(lou.env["RAY_API_SERVER_ADDRESS"] + "/api/v0/tasks",
                         headers={"Authorization": f"Bearer {shared.owner_token()}"},
                         verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=60)
    assert owner.status_code == 200
    # The cluster's Ray token, which any job can read, is nobody at the gateway.
    ray_token = requests.get(lou.env["RAY_API_SERVER_ADDRESS"] + "/api/v0/tasks",
                             headers={"Authorization": f"Bearer {shared.cluster_token().strip()}"},
                             verify=lou.env["REQUESTS_CA_BUNDLE"], timeout=60)
    assert ray_token.status_code == 403


def test_a_joined_member_uses_rayfleets_own_verbs_from_their_own_folder(shared: Shared) -> None:
    lee = shared.add("lee")
    project = lee.home / "project"
    project.mkdir()
    (project / "hello.py").write_text("print('FROM-' + 'LEE')\n")

    def invoke(*args: str) -> subprocess.CompletedProcess[str]:
        done = forked_cli.run_invoke("-r", str(ROOT), *args, env=lee.env, cwd=project,
                                     timeout=180)
        lee.answers.append(done.stdout + done.stderr)
        return done

    submitted = invoke("submit", "--cluster", shared.spec.stem, "hello.py")
    assert submitted.returncode == 0 and "FROM-LEE" in submitted.stdout, submitted.stderr
    # The last job, lee's own: the job may be left out with the `rayfleet` command.
    logs = forked_cli.run_rayfleet("logs", "--cluster", shared.spec.stem, env=lee.env,
                                   cwd=project, timeout=180)
    lee.answers.append(logs.stdout + logs.stderr)
    assert logs.returncode == 0 and "FROM-LEE" in logs.stdout, logs.stderr
    status = invoke("status", "--cluster", shared.spec.stem, "--json")
    assert status.returncode == 0, status.stderr
    assert [row["status"] for row in json.loads(status.stdout)["jobs"]] == ["SUCCEEDED"]
    for verb in (("up",), ("ssh",), ("member-add", "x"), ("members",)):
        refused = invoke(verb[0], "--cluster", shared.spec.stem, *verb[1:])
        assert refused.returncode != 0 and "is the owner's" in refused.stderr, verb
        assert len(refused.stderr.strip().splitlines()) == 1


def test_usage_survives_a_gateway_restart(shared: Shared) -> None:
    mo = shared.add("mo")
    job = mo.submit("python -c print(3)")
    folder = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem
    usage = folder / "usage.json"

    def recorded() -> bool:
        data = json.loads(usage.read_text()) if usage.exists() else {}
        return (data.get("jobs", {}).get(job, {}).get("status") == "SUCCEEDED"
                and "mo" in data.get("members", {}))

    _wait_for(recorded, 120, "the gateway records mo's job and visit")
    before = json.loads(usage.read_text())
    pidfile = folder / "rayfleet-gateway.json.pid"
    child = supervise.read(pidfile)["child"]
    assert child is not None and child.running()
    os.kill(child.pid, 9)  # no chance to save on the way out: what survives is what was on disk
    _wait_for(lambda: not child.running(), 10, "the gateway gone")

    def restarted() -> bool:
        now = supervise.read(pidfile)["child"]
        return now is not None and now.pid != child.pid and now.running()

    # Its supervisor starts it again by itself, as every head daemon's.
    _wait_for(restarted, 30, "the gateway started again by its supervisor")
    again = shared.invoke("up")
    assert again.returncode == 0, again.stdout + again.stderr
    warns_once(again.stderr)  # issue 29's warning, at an `up` on the running cluster too
    assert rayproc.port_answers("127.0.0.1", shared.port)
    assert mo.get("/api/jobs/").status_code == 200
    rows = {row["name"]: row for row in json.loads(shared.invoke("members", "--json").stdout)["members"]}
    assert rows["mo"]["total_jobs"] == 1
    assert rows["mo"]["last_seen"] >= before["members"]["mo"]["last_seen"]
    # Written once, when mo submitted: Ray's job list (which the gateway re-reads) does not have it.
    assert json.loads(usage.read_text())["jobs"][job]["submitted"] == before["jobs"][job]["submitted"]


def test_a_members_folder_is_all_stock_ray_needs(shared: Shared) -> None:
    """The folder `member-add` writes, moved into a student's home: `source env.sh`, then Ray's
    own CLI, with nothing of rayfleet (issue 37: a student's path in one step)."""
    added = shared.invoke("member-add", "nia")
    assert added.returncode == 0, added.stdout + added.stderr
    folder = shared.folder / f"{shared.spec.stem}-nia"
    assert f"source {folder.name}/env.sh" in added.stdout
    home = shared.folder / "home-nia"
    (home / "course").mkdir(parents=True)
    shutil.move(str(folder), home / "course" / folder.name)
    line = (f"source course/{folder.name}/env.sh && {RAY} job submit -- python -c "
            f"\"print('FROM-' + 'NIA')\" && {RAY} job list")
    done = subprocess.run(["bash", "-c", line], cwd=home, env={
        "PATH": os.environ["PATH"], "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"},
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0 and "FROM-NIA" in done.stdout + done.stderr, \
        done.stdout + done.stderr
