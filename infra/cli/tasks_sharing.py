"""The front door's tasks of a shared cluster: its members (add, bundles, update, remove, list),
its token, and a member's own (usage, join). infra/cli/tasks.py imports them, so `invoke` and
`rayfleet` list them with the others."""

from __future__ import annotations

from invoke import Context, Exit, task

from infra.cli.door import CLUSTER_HELP, one_line_errors


@task(name="member-add", positional=["name"], help={
    **CLUSTER_HELP,
    "name": "The member's name (lowercase letters, digits, - or _), e.g. alice.",
    "admin": "An admin member sees and acts on every member's jobs.",
    "expires_days": "The member's access ends after this many days (fractions allowed; "
                    "default 0: never; with --roster: for rows whose expires is empty).",
    "out": "Where the member's folder goes (default ./<cluster>-<name>/: bundle, token, CA files, "
           "env.sh); a path ending in .json writes the bundle alone there. With --roster: the "
           "folder each member's folder goes in (default: here).",
    "roster": "A CSV file with the columns name,role,expires (empty cells: member, no expiry): "
              "adds everyone not a member yet; members already there keep their tokens; "
              "removed members are skipped (--readd brings them back), expired ones named.",
    "readd": "With --roster: add again the removed members it lists (each gets a new token).",
})
@one_line_errors
def member_add(c: Context, name: str | None = None, admin: bool = False,
               expires_days: float = 0.0, out: str | None = None, roster: str | None = None,
               readd: bool = False, provider: str | None = None,
               cluster: str | None = None) -> None:
    """Add a member (or a roster: --roster) to a shared cluster and write each one's folder.

    The cluster's spec has a `sharing:` block; the folder holds the bundle, token, CA and env.sh.
    """
    if roster:
        from infra.cli import term as commands_term

        if name:
            raise Exit(f"error: member-add {name} --roster {roster}: give a NAME or a roster, "
                       "not both", code=2)
        return commands_term.member_add_roster(provider, cluster, roster, out,
                                               expires_days or None, admin, readd)
    if not name:
        raise Exit("error: member-add: give the member's NAME, or --roster FILE.csv", code=2)
    from infra.cli import sharing as commands_sharing

    commands_sharing.member_add(provider, cluster, name, admin, expires_days or None, out)


@task(name="member-bundles", help={
    **CLUSTER_HELP,
    "dir": "The folder holding the members' folders or bundle files (default: here).",
})
@one_line_errors
def member_bundles(c: Context, dir: str | None = None, provider: str | None = None,
                   cluster: str | None = None) -> None:
    """Rewrite every member's folder found in --dir for the gateway's current address, same tokens."""
    from infra.cli import term as commands_term

    commands_term.member_bundles(provider, cluster, dir)


@task(name="member-update", positional=["name"], help={
    **CLUSTER_HELP, "name": "The member to change.",
    "expires": "When their access ends: a date (the end of that day, UTC), an ISO datetime, or "
               "never; sharing.ends still caps it.",
    "role": "member, or admin (sees and acts on every member's jobs).",
})
@one_line_errors
def member_update(c: Context, name: str, expires: str | None = None, role: str | None = None,
                  provider: str | None = None, cluster: str | None = None) -> None:
    """Change a member's expiry or role, keeping their token (and so their folder)."""
    from infra.cli import term as commands_term

    commands_term.member_update(provider, cluster, name, expires, role)


@task(name="member-remove", help={
    **CLUSTER_HELP, "name": "The member to remove.",
    "stop_jobs": "Also stop the member's pending and running jobs.",
    "rotate": "Also give the cluster a new Ray token (rotate-token: Ray restarts).",
})
@one_line_errors
def member_remove(c: Context, name: str, stop_jobs: bool = False, rotate: bool = False,
                  provider: str | None = None, cluster: str | None = None) -> None:
    """Remove a member: their next request to the gateway is refused."""
    from infra.cli import sharing as commands_sharing

    commands_sharing.member_remove(provider, cluster, name, stop_jobs, rotate)


@task(name="rotate-token", help={
    **CLUSTER_HELP, "yes": "Go on although Ray restarts: every running job, actor and Serve app ends."})
@one_line_errors
def rotate_token(c: Context, yes: bool = False, provider: str | None = None,
                 cluster: str | None = None) -> None:
    """Give the cluster a new Ray token (Ray restarts); the old one, which any job could read, is refused."""
    from infra.cli import sharing as commands_sharing

    commands_sharing.rotate_token(provider, cluster, yes)


@task(help={**CLUSTER_HELP, "json": "Print machine-readable JSON instead of a table."})
@one_line_errors
def members(c: Context, json: bool = False, provider: str | None = None,
            cluster: str | None = None) -> None:
    """List a shared cluster's members: role, added, expires, last seen, jobs, job-hours, cost share."""
    from infra.cli import sharing as commands_sharing

    commands_sharing.members(provider, cluster, json)


@task(help={"cluster": "The cluster you joined (its name).",
            "json": "Print a JSON object (instants ISO 8601), for scripts."})
@one_line_errors
def usage(c: Context, json: bool = False, cluster: str | None = None) -> None:
    """A member's own job-hours, cost share and budget left on a cluster they joined."""
    from infra.cli import term as commands_term

    commands_term.usage(cluster, json)


@task(positional=["bundle"], help={
    "bundle": "The bundle file the cluster's owner sent you.",
    "address": "Reach the gateway here instead of at the bundle's address, e.g. "
               "https://localhost:8443 through your own `ssh -L` to a Slurm head"})
@one_line_errors
def join(c: Context, bundle: str, address: str = "") -> None:
    """Join a shared cluster as a member: then submit, logs, stop-job, status, dashboard, env."""
    from infra.cli import sharing as commands_sharing

    commands_sharing.join(bundle, address or None)
