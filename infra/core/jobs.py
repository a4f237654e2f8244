"""Jobs through Ray's job submission API: submit a script with its project, follow, stop.

The script's project (its git root, or its folder) is uploaded to the cluster as the working dir,
without what its .gitignore ignores; rayfleet's own folder (state, keys) and VCS data are always
excluded from it: a private key must never travel with a job.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import auth, raynoise, ui
from infra.core.errors import JobError, UsageError

if TYPE_CHECKING:
    from infra.core.endpoint import Endpoint

# multirun/: what a Hydra sweep leaves behind (outputs and logs of every run), never job input.
# ray-token, *.rayfleet.json: a member's token (their folder, a bundle) in the project they submit.
_ALWAYS_EXCLUDED = [".rayfleet/", ".git/", "**/__pycache__/", ".venv/", "*.pem", "id_*",
                    "multirun/", "ray-token", "*.rayfleet.json"]
#: What never travels with a working dir (jobs and Serve applications alike).
ALWAYS_EXCLUDED = _ALWAYS_EXCLUDED
_EXIT = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}


def dashboard_ready(url: str, token_path: Path | None = None, timeout: float = 2.0) -> bool:
    """True when the dashboard at `url` accepts job API calls (what `submit` needs).

    A token-auth cluster answers 401 without the token, so it is presented whenever there is one.
    The standard library's client, not requests: `up` asks this the moment `ray start` returns,
    and importing requests there cost every local `up` ~55 ms (bench/local_up.py).
    """
    import http.client
    import urllib.error
    import urllib.request

    headers = auth.headers(token_path)  # an unreadable token is its own error, not "not ready"
    try:
        request = urllib.request.Request(f"{url}/api/jobs/", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as refused:  # an error status, e.g. 401 without the token
        refused.close()
        return False
    # Refused, timed out, reset mid-answer, or a malformed URL: not ready.
    except (OSError, http.client.HTTPException, ValueError):
        return False


def job_client(endpoint: Endpoint) -> Any:
    """Ray's job SDK client for `endpoint`, authenticated with its token; one line on failure."""
    from ray.job_submission import JobSubmissionClient

    url = endpoint.dashboard_url
    try:
        return JobSubmissionClient(url, headers=auth.headers(endpoint.token_path))
    except Exception as exc:
        message = auth.scrub(str(exc), endpoint.token_path).splitlines()[0]
        # Ray words a 401/403 "Authentication failed: <the answer>" and adds a paragraph on its own
        # tokens; the answer is what a gateway says (expired, removed, ...): that, as refused.
        for ray_words in ("Authentication failed: ", "Authentication required: "):
            if message.startswith(ray_words):
                raise JobError(f"{url} refused: {message.removeprefix(ray_words)}") from None
        raise JobError(f"cannot reach the job API at {url}: {message}") from None


def list_nodes(endpoint: Endpoint) -> list[Any]:
    """Ray's node list (state API, with details), authenticated like every other call of ours."""
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    client = StateApiClient(address=endpoint.dashboard_url, headers=auth.headers(endpoint.token_path))
    nodes: list[Any] = client.list(StateResource.NODES, options=ListApiOptions(detail=True),
                                   raise_on_missing_output=False)
    return nodes


def runtime_env(path: str | None, working_dir: Path) -> dict[str, Any]:
    """The runtime env for a job: the user's file (if any) plus working dir and excludes (what we
    never ship, then what the project's .gitignore ignores)."""
    env: dict[str, Any] = {}
    if path:
        import yaml

        try:
            env = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise UsageError(f"--runtime-env {path}: no such file") from None
        except yaml.YAMLError as exc:
            raise UsageError(f"--runtime-env {path}: not valid YAML ({exc})".splitlines()[0]) from None
        if not isinstance(env, dict):
            raise UsageError(f"--runtime-env {path}: expected a mapping (env_vars:, pip:, ...)")
    env.setdefault("working_dir", str(working_dir))
    env["excludes"] = (list(env.get("excludes", [])) + _ALWAYS_EXCLUDED
                       + gitignored(Path(env["working_dir"])))
    return env


def _git(folder: Path, *args: str) -> str | None:
    """`git -C folder ARGS`'s output, or None when git is missing or `folder` is in no repository."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _literal(path: str) -> str:
    """A gitignore pattern (Ray's `excludes` syntax) that matches exactly `path`, anchored at the
    working dir: wildcard and comment characters in file names are escaped."""
    escaped = "".join(f"\\{char}" if char in "*?[]\\!#" else char for char in path)
    return "/" + escaped


def gitignored(working_dir: Path) -> list[str]:
    """What the project's .gitignore rules leave out of `working_dir`, as Ray `excludes`.

    In a git repository git itself says which files its rules (every .gitignore, .git/info/exclude,
    the user's global excludes) ignore; fully ignored folders come as one entry. Outside one, the
    folder's own .gitignore lines are used as they are (Ray reads them with gitignore's syntax).
    """
    listed = _git(working_dir, "ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                  "--directory")
    if listed is not None:
        return [_literal(path) for path in listed.split("\0") if path]
    ignore_file = working_dir / ".gitignore"
    if not ignore_file.is_file():
        return []
    lines = (line.rstrip() for line in ignore_file.read_text(errors="replace").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def project_dir(script: Path) -> Path:
    """What `submit` uploads by default: the git root of the script's project, else its folder."""
    folder = script.resolve().parent
    top = _git(folder, "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top and top.strip() else folder


def entrypoint(script: str, args: list[str], working_dir: Path) -> str:
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"SCRIPT {script}: no such file")
    try:
        relative = path.resolve().relative_to(working_dir.resolve())
    except ValueError:
        raise UsageError(
            f"SCRIPT {script}: must be inside {working_dir}, which is uploaded as the working dir; "
            "pick another with --working-dir"
        ) from None
    return shlex.join(["python", relative.as_posix(), *args])


def prepare(script: str, args: list[str], runtime_env_file: str | None,
            working_dir: str | None = None) -> tuple[str, dict[str, Any]]:
    """Check the job's inputs before anything is contacted: (entrypoint, runtime env).

    The upload is `working_dir` when given, else the script's project (`project_dir`).
    """
    if working_dir is not None:
        folder = Path(working_dir)
        if not folder.is_dir():
            raise UsageError(f"--working-dir {working_dir}: no such folder")
    elif Path(script).is_file():
        folder = project_dir(Path(script))
    else:
        raise UsageError(f"SCRIPT {script}: no such file")
    folder = folder.resolve()
    return entrypoint(script, args, folder), runtime_env(runtime_env_file, folder)


#: How Ray's job SDK words an HTTP answer it did not expect, before the answer's own text.
_RAY_HTTP_WORDS = re.compile(r"Request failed with status code (\d{3}): ")


def submit(endpoint: Endpoint, command: str, env: dict[str, Any], wait: bool,
           again: str = "invoke {verb} {job}") -> int:
    """Submit `command`; follow its logs when `wait`; return the exit code to leave with.
    `again`: how the hints name a command on this job (`{verb}`, `{job}`), its cluster included."""
    client = job_client(endpoint)
    with ui.step(f"submitting `{command}` (uploading {Path(env['working_dir']).name}/)"):
        try:
            job_id = client.submit_job(entrypoint=command, runtime_env=env)
        except Exception as exc:
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            answer = _RAY_HTTP_WORDS.match(said)
            if answer and 400 <= int(answer.group(1)) < 500:
                # The job API (a gateway: a cap, a budget) refused it, in its own words.
                raise JobError(f"submit refused: {said[answer.end():]}") from None
            raise JobError(f"submission failed: {said}") from None
    ui.info(f"job {job_id} submitted")
    if not wait:
        ui.out(job_id)
        ui.info(f"follow it with `{again.format(verb='logs', job=job_id)}`, stop it with "
                f"`{again.format(verb='stop-job', job=job_id)}`")
        return 0
    return follow(client, job_id, again)


def follow(client: Any, job_id: str, again: str = "invoke {verb} {job}") -> int:
    """Stream a job's logs until it ends; return an exit code that reflects its status."""
    shown = 0  # characters of the log already written: a re-attached stream starts from the top
    lines = raynoise.LineFilter(colour=sys.stdout.isatty())

    async def tail() -> None:
        nonlocal shown
        seen = 0
        async for chunk in client.tail_job_logs(job_id):
            new = chunk[max(0, shown - seen):]
            seen += len(chunk)
            if new:
                sys.stdout.write(lines.feed(new))
                sys.stdout.flush()
                shown += len(new)

    try:
        for attempt in range(5):
            try:
                asyncio.run(tail())
                break
            except RuntimeError as exc:
                # Ray's log stream ends with "closed unexpectedly" (1006) when the connection
                # drops while the job runs (seen under heavy load); the job itself is unaffected,
                # so attach again and print only what was not printed yet.
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                status = str(client.get_job_status(job_id).value)
                running = status in ("PENDING", "RUNNING")
                if running and "closed unexpectedly" in reason and attempt < 4:
                    ui.warn(f"the log stream of job {job_id} dropped ({reason}); attaching again")
                    continue
                if running:
                    raise JobError(f"lost the log stream of job {job_id} ({reason}); it keeps "
                                   f"running: `{again.format(verb='logs', job=job_id)} --follow`"
                                   ) from None
                break
    except KeyboardInterrupt:
        sys.stdout.write(lines.flush())
        ui.info(
            f"\nstopped following; job {job_id} keeps running on the cluster. "
            f"Stop it with `{again.format(verb='stop-job', job=job_id)}`, follow again with "
            f"`{again.format(verb='logs', job=job_id)}`"
        )
        return 130
    sys.stdout.write(lines.flush())
    status = str(client.get_job_status(job_id).value)
    ui.info(f"job {job_id} {status}")
    return _EXIT.get(status, 1)


def _job_error(job_id: str, exc: Exception, status_command: str) -> JobError:
    """Ray's answer about one job, in our words: a job the cluster does not know is said plainly,
    with where to find the ones it has."""
    text = str(exc)
    if "does not exist" in text or "status code 404" in text:
        return JobError(f"job {job_id}: no such job on this cluster; `{status_command}` lists its "
                        "jobs")
    return JobError(f"job {job_id}: {text.splitlines()[0] if text else type(exc).__name__}")


def logs(endpoint: Endpoint, job_id: str, follow_logs: bool,
         status_command: str = "invoke status") -> int:
    client = job_client(endpoint)
    try:
        if follow_logs:
            client.get_job_status(job_id)  # a job the cluster does not know: one clear line
            return follow(client, job_id)
        lines = raynoise.LineFilter(colour=sys.stdout.isatty())
        text = client.get_job_logs(job_id)
        sys.stdout.write(lines.feed(text) + lines.flush())
    except RuntimeError as exc:
        raise _job_error(job_id, exc, status_command) from None
    return 0


def stop(endpoint: Endpoint, job_id: str, status_command: str = "invoke status") -> str:
    client = job_client(endpoint)
    try:
        client.stop_job(job_id)
    except RuntimeError as exc:
        raise _job_error(job_id, exc, status_command) from None

    def ended(step: ui.Step) -> str | None:
        status = str(client.get_job_status(job_id).value)
        step.detail(status)
        return status if status in _EXIT else None

    return ui.wait_for(ended, f"job {job_id} to stop", timeout=60)


def last_job(endpoint: Endpoint) -> str:
    """The id of the job submitted last to the cluster (by whoever), for `logs` and `stop-job`."""
    found = job_client(endpoint).list_jobs()
    if not found:
        raise JobError("no job on this cluster yet; submit one with `invoke submit SCRIPT`")
    last = max(found, key=lambda job: job.start_time or 0)
    return str(last.submission_id or last.job_id)


def list_jobs(endpoint: Endpoint, why_stopped: bool = False) -> list[dict[str, str]]:
    """One row per job; `why_stopped` adds Ray's message of each stopped job as "stopped" (through a
    gateway: who stopped it and why, which stock `ray job status` does not print)."""
    rows = []
    for job in job_client(endpoint).list_jobs():
        status = str(job.status.value if hasattr(job.status, "value") else job.status)
        row = {"job": str(job.submission_id or job.job_id), "status": status,
               "entrypoint": str(job.entrypoint)}
        if why_stopped:
            row["stopped"] = str(job.message or "") if status == "STOPPED" else ""
        rows.append(row)
    return rows
