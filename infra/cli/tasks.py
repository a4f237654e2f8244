"""rayfleet's front door: `rayfleet --list` (or `invoke --list` in the checkout) shows every task,
`rayfleet <task> --help` each option.

Tasks only parse options, call `infra.cli.commands` and turn errors into one line and an exit code.
Imports of infra happen inside the tasks so that listing tasks stays fast. The tasks live in the
package so that the `rayfleet` console script (`program` below, Invoke's own `Program` over this
module) runs them from any directory; the checkout's tasks.py re-exports them for `invoke`. A new
task is a `@task` function in this module (a shared cluster's: in tasks_sharing.py, imported
below): both commands pick it up.
"""

from __future__ import annotations

import shlex
import sys

from invoke import Collection, Context, task

from infra.cli.door import CLUSTER_HELP, one_line_errors
from infra.cli.help import RayfleetProgram
from infra.cli.tasks_sharing import (  # noqa: F401 (the tasks of this program)
    join,
    member_add,
    member_bundles,
    member_remove,
    member_update,
    members,
    rotate_token,
    usage,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rayfleet")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@task(help={**CLUSTER_HELP, "json": "Print machine-readable JSON instead of tables."})
@one_line_errors
def plan(c: Context, provider: str | None = None, cluster: str | None = None,
         json: bool = False) -> None:
    """Render and validate what `up` would create, without creating anything; diff vs last up."""
    from infra.cli import commands

    commands.plan(provider, cluster, json)


@task(help={
    **CLUSTER_HELP,
    "keep_partial": "If the cluster cannot be completed, keep what was created (it stays in "
                    "state, and keeps costing money until `invoke teardown`).",
})
@one_line_errors
def up(c: Context, provider: str | None = None, cluster: str | None = None,
       keep_partial: bool = False) -> None:
    """Create the cluster (default: a local Ray head on this machine) and wait until it is ready."""
    from infra.cli import commands

    commands.up(provider, cluster, keep_partial)


@task(help={**CLUSTER_HELP, "json": "Print machine-readable JSON instead of tables."})
@one_line_errors
def status(c: Context, provider: str | None = None, cluster: str | None = None,
           json: bool = False) -> int:
    """Show the cluster's resources, Ray nodes, Ray resources and jobs (a joined member: their jobs)."""
    from infra.cli import commands
    from infra.core.sharing import membership

    if membership.joined(cluster):
        from infra.cli import sharing as commands_sharing

        return commands_sharing.status(str(cluster), json)

    return commands.status(provider, cluster, json)


@task(help=CLUSTER_HELP)
@one_line_errors
def dashboard(c: Context, provider: str | None = None, cluster: str | None = None) -> None:
    """Print the dashboard URL; for remote clusters, keep a tunnel to it open until Ctrl+C."""
    from infra.cli import commands
    from infra.core.sharing import membership

    if membership.joined(cluster):
        from infra.cli import sharing as commands_sharing

        return commands_sharing.dashboard(str(cluster))

    commands.dashboard(provider, cluster)


@task(positional=["script"], help={
    **CLUSTER_HELP,
    "script": "Python script to run. Its project (git root, else its folder) is uploaded as the "
              "working dir, without what .gitignore ignores. Arguments for it go after `--`, "
              "e.g. `invoke submit examples/cpu_example.py -- 8`.",
    "working_dir": "Upload this folder instead (it must contain SCRIPT).",
    "runtime_env": "YAML file with a Ray runtime env (env_vars, pip, ...), e.g. "
                   "setup/runtime/cpu.yaml.",
    "wait": "Follow the job's logs and exit with its status (default). --no-wait prints the "
            "job id and returns at once.",
})
@one_line_errors
def submit(c: Context, script: str, runtime_env: str | None = None, wait: bool = True,
           provider: str | None = None, cluster: str | None = None,
           working_dir: str | None = None) -> int:
    """Run a Python script on the cluster as a Ray job, streaming its logs.

    Usage: invoke submit [OPTIONS] SCRIPT [-- ARGS...]
    """
    from infra.cli import commands

    args = shlex.split(c.remainder) if c.remainder else []
    return commands.submit(provider, cluster, script, args, runtime_env, wait, working_dir)


@task(positional=["job"], help={**CLUSTER_HELP,
                                "job": "Job id printed by `invoke submit` (default: the last job).",
            "follow": "Keep streaming until the job ends."})
@one_line_errors
def logs(c: Context, job: str | None = None, follow: bool = False, provider: str | None = None,
         cluster: str | None = None) -> int:
    """Print a job's logs."""
    from infra.cli import commands

    return commands.logs(provider, cluster, job or None, follow)


@task(name="stop-job", positional=["job"], help={**CLUSTER_HELP,
                             "job": "Job id printed by `invoke submit` (default: the last job)."})
@one_line_errors
def stop_job(c: Context, job: str | None = None, provider: str | None = None,
             cluster: str | None = None) -> None:
    """Stop a running job and wait until Ray reports it stopped."""
    from infra.cli import commands

    commands.stop_job(provider, cluster, job or None)


@task(help={**CLUSTER_HELP, "json": "Print machine-readable JSON instead of a table."})
@one_line_errors
def doctor(c: Context, provider: str | None = None, cluster: str | None = None,
           json: bool = False) -> int:
    """Show Ray and Python versions on every node; warn (exit 1) where they differ from here."""
    from infra.cli import commands

    return commands.doctor(provider, cluster, json)


@task(help=CLUSTER_HELP)
@one_line_errors
def teardown(c: Context, provider: str | None = None, cluster: str | None = None) -> None:
    """Remove every resource of the cluster, verify none is left, then forget its state."""
    from infra.cli import commands

    commands.teardown(provider, cluster)


@task(name="list", help={
    "json": "Print machine-readable JSON instead of a table.",
    "timeout": "Seconds to wait for each provider's answer (default 0: the provider's own, 20 s "
               "for most); a provider that does not answer gets a row saying so.",
})
@one_line_errors
def list_(c: Context, json: bool = False, timeout: float = 0.0) -> int:
    """List every cluster of this checkout with its state, nodes, $/h, uptime, cost and autodown.

    One row per state file; providers are asked in parallel, and one that does not answer is a row
    saying so and a warning (exit 0), never an error.
    """
    from infra.cli import listing

    return listing.list_clusters(json, timeout or None)


@task(iterable=["only"], help={
    "delete": "Remove the listed resources that are yours (after showing the list; asks unless "
              "--yes).",
    "yes": "Do not ask before deleting (for scripts).",
    "all_owners": "Also list resources with a cluster id and ANOTHER owner mark (a colleague's). "
                  "They are never deleted unless named with --only.",
    "only": "Delete only this resource (name or id as listed; repeat for more). The only way to "
            "delete a colleague's.",
    "json": "Print machine-readable JSON instead of a table.",
})
@one_line_errors
def sweep(c: Context, delete: bool = False, yes: bool = False, all_owners: bool = False,
          only: list[str] | None = None, json: bool = False) -> int:
    """Find (and with --delete remove) leaked resources: yours, with no state file here.

    Looks in every provider this machine has credentials for, for resources that carry a rayfleet
    cluster id and your owner mark but belong to no state file here (a crashed or lost checkout).
    Resources without rayfleet's marks are never listed.
    """
    from infra.cli import sweep as sweeping

    return sweeping.run(delete, yes, all_owners, list(only or []), json)


@task(help={**CLUSTER_HELP,
            "close": "End the tunnel a remote cluster's `invoke env` opened and print `unset ...`."})
@one_line_errors
def env(c: Context, provider: str | None = None, cluster: str | None = None,
        close: bool = False) -> None:
    """Print `export RAY_ADDRESS=... RAY_AUTH_MODE=token ...` for Ray's own tools: eval "$(invoke env)".

    Local clusters: `ray status`, `ray job submit` and a driver's `ray.init()` then work as is.
    Remote clusters: opens (or reuses) a tunnel to the head for the job API and Ray Client.
    """
    from infra.cli import access
    from infra.core.sharing import membership

    if membership.joined(cluster) and not close:
        from infra.cli import sharing as commands_sharing

        return commands_sharing.env(str(cluster))

    access.env(provider, cluster, close)


@task(help=CLUSTER_HELP)
@one_line_errors
def ssh(c: Context, provider: str | None = None, cluster: str | None = None) -> int:
    """Open a shell on the cluster's head (local: a shell here with the cluster's Ray environment).

    Commands can also come on stdin: `echo hostname | invoke ssh --provider=lambda`.
    """
    from infra.cli import access

    return access.shell(provider, cluster)


@task(name="exec", help=CLUSTER_HELP)
@one_line_errors
def exec_(c: Context, provider: str | None = None, cluster: str | None = None) -> int:
    """Run a command on the cluster's head and exit with its exit code: `invoke exec -- CMD`."""
    from infra.cli import access

    return access.exec_(provider, cluster, c.remainder)


@task(positional=["direction", "local", "remote"], help={
    **CLUSTER_HELP,
    "direction": "`up` copies LOCAL to REMOTE on the head, `down` copies REMOTE to LOCAL.",
    "local": "A file or folder on this machine (a trailing / copies a folder's contents).",
    "remote": "A path on the head, relative to the login user's home (local clusters: to the "
              "current directory).",
})
@one_line_errors
def sync(c: Context, direction: str, local: str, remote: str, provider: str | None = None,
         cluster: str | None = None) -> int:
    """Copy files to (`sync up LOCAL REMOTE`) or from (`sync down LOCAL REMOTE`) the head with rsync."""
    from infra.cli import access

    return access.sync(provider, cluster, direction, local, remote)


@task(help={"json": "Print machine-readable JSON instead of a table.",
            "timeout": "Seconds to wait for each provider's checks (default 30)."})
@one_line_errors
def check(c: Context, json: bool = False, timeout: float = 30.0) -> int:
    """Show which providers this machine can use, and how to fix what is missing.

    Credentials, APIs, Slurm, ssh/rsync; from each provider's default spec, clusters/<provider>.yaml.
    """
    from infra.cli import check as checking

    return checking.run(json, timeout)


@task(help={**CLUSTER_HELP,
            "copy": "Copy the cluster's tracking data (runs, metrics, models, artifacts) from a "
                    "cloud head to .rayfleet/tracking/<cluster>/ now, and exit."})
@one_line_errors
def mlflow(c: Context, provider: str | None = None, cluster: str | None = None,
           copy: bool = False) -> None:
    """Print the MLflow UI's URL and how to log in; for remote clusters, keep a tunnel open."""
    from infra.cli import serve as commands_serve

    if copy:
        commands_serve.copy_tracking(provider, cluster)
    else:
        commands_serve.mlflow(provider, cluster)


@task(name="serve-deploy", help={
    **CLUSTER_HELP,
    "target": "A Serve config YAML (e.g. examples/serve.yaml) or an import path module:app, "
              "inside the current directory (uploaded as the applications' working dir).",
})
@one_line_errors
def serve_deploy(c: Context, target: str, provider: str | None = None,
                 cluster: str | None = None) -> None:
    """Deploy Ray Serve applications through Ray's Serve REST API; print their URLs.

    Adds or replaces the named applications and keeps every other one; waits until Serve runs
    them, and rolls a failed one back. Replica autoscaling comes from the config.
    """
    from infra.cli import serve as commands_serve

    commands_serve.serve_deploy(provider, cluster, target)


@task(name="serve-status", help={**CLUSTER_HELP, "json": "Print machine-readable JSON instead of a table."})
@one_line_errors
def serve_status(c: Context, json: bool = False, provider: str | None = None,
                 cluster: str | None = None) -> None:
    """Show the cluster's Serve applications: status, URL, replicas."""
    from infra.cli import serve as commands_serve

    commands_serve.serve_status(provider, cluster, json)


@task(name="serve-delete", help={**CLUSTER_HELP, "name": "The application's name (see serve-status)."})
@one_line_errors
def serve_delete(c: Context, name: str, provider: str | None = None,
                 cluster: str | None = None) -> None:
    """Delete one Serve application (the others keep running) and wait until it is gone."""
    from infra.cli import serve as commands_serve

    commands_serve.serve_delete(provider, cluster, name)


@task(name="serve-url", help={**CLUSTER_HELP, "name": "Only this application's URL."})
@one_line_errors
def serve_url(c: Context, name: str | None = None, provider: str | None = None,
              cluster: str | None = None) -> None:
    """Print the HTTP URL of each Serve application, reachable from this machine."""
    from infra.cli import serve as commands_serve

    commands_serve.serve_url(provider, cluster, name)


@task(help={**CLUSTER_HELP, "once": "Print one frame and exit (no live refresh).",
            "json": "Print one frame as a JSON object, for scripts (implies --once)."})
@one_line_errors
def top(c: Context, provider: str | None = None, cluster: str | None = None, once: bool = False,
        json: bool = False) -> None:
    """Live view of a cluster (needs `metrics: prometheus`; Ctrl+C quits).

    Nodes by type, CPU/GPU/TPU/memory in use, pending demand, the autoscaler, running jobs, $/h.
    """
    from infra.cli import metrics as commands_metrics

    commands_metrics.top_command(provider, cluster, once, json)


@task(help={**CLUSTER_HELP, "out": "Where to write the page (default: <cluster>-report.html).",
            "json": "Print every job, member and node-hour as JSON instead (ISO 8601 times).",
            "since": "Only from this date on (e.g. 2026-09-01, UTC): a new term's report."})
@one_line_errors
def report(c: Context, provider: str | None = None, cluster: str | None = None,
           out: str | None = None, json: bool = False, since: str | None = None) -> None:
    """One self-contained HTML page of the cluster's life: nodes, use, jobs, members, cost.

    Every run of the cluster's name (each kept at its teardown by cluster id), the running one live
    from its Prometheus; a shared cluster's members' table and jobs from the gateway's record.
    """
    from infra.cli import metrics as commands_metrics

    commands_metrics.report_command(provider, cluster, out, json, since)


def main() -> None:
    """The `rayfleet` command: every task above, from any directory (specs by name come from the
    checkout's clusters/, or give a path), and no tasks.py to look for."""
    program.run()


program = RayfleetProgram(namespace=Collection.from_module(sys.modules[__name__]), name="rayfleet",
                          binary="rayfleet", version=_version(),
                          # May be left out: the last job; a roster instead of one member.
                          optional_positionals={"logs": {"job"}, "stop-job": {"job"},
                                                "member-add": {"name"}})
