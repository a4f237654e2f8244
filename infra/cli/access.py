"""`invoke env`, `ssh`, `exec` and `sync`: Ray's own tools and a user's hands on a running cluster.

Every provider says how its head is reached (`Provider.head_access`); nothing here knows which
provider it talks to.
"""

from __future__ import annotations

import shlex

from infra.cli import common
from infra.core import auth, tunnels, ui
from infra.core.head import Direction, HeadAccess
from infra.core.sharing import membership

#: What `invoke env` sets, in the order it prints them (and `--close` unsets).
ENV_NAMES = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def _access(provider: str | None, cluster: str | None) -> tuple[str, HeadAccess]:
    membership.refuse_owner_verb(cluster, "ssh/exec/sync")
    selected, impl = common.select(provider, cluster)
    return selected.name, impl.head_access(common.running(selected))


def exports(env: dict[str, str]) -> str:
    """One `export` line for a POSIX shell, values quoted."""
    return "export " + " ".join(f"{k}={shlex.quote(env[k])}" for k in ENV_NAMES if k in env)


def env(provider: str | None, cluster: str | None, close: bool) -> None:
    """Print the `export` line that points Ray's own CLI and drivers at the cluster."""
    selected, impl = common.select(provider, cluster)
    if close:
        closed = tunnels.close(selected.name)
        ui.out("unset " + " ".join(ENV_NAMES), markup=False)
        ui.info(f"tunnel to {selected.name!r} closed" if closed else "no tunnel was open")
        return
    current = common.running(selected)
    access = impl.head_access(current)
    flag = common.cluster_flag(selected)
    remote = {"dashboard": access.dashboard_port or 0}
    if access.client_port:
        remote["client"] = access.client_port
    local, pid, reused = access.forward(selected.name, remote)
    if pid is None:  # the head's ports are this machine's: its own environment reaches it
        ui.out(exports(access.env), markup=False)
        ui.info(f"# after eval: `ray status`, `ray job submit -- python x.py` and `ray.init()` in a "
                f"driver all reach {selected.name!r}")
        return
    values = {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{local['dashboard']}",
              **auth.client_env(current)}
    if "client" in local:
        values["RAY_ADDRESS"] = f"ray://127.0.0.1:{local['client']}"
    ui.out(exports(values), markup=False)
    ui.info(f"# tunnel to {access.where} {'still open' if reused else 'opened'} (pid {pid}; "
            f"`invoke env{flag} --close` ends it). Through it: the job API (`ray job submit`, "
            "`ray job logs`)" + (" and Ray Client for drivers (`ray.init()` uses ray://)"
                                 if "client" in local else "")
            + f". The GCS is not tunneled: run `ray status` on the head with "
            f"`invoke exec{flag} -- ray status`")


def forward(provider: str | None, cluster: str | None, name: str, port: int) -> int:
    """The local port of the cluster's detached tunnel (the one `invoke env` opens) that reaches
    `port` on the head's loopback, opening or growing that tunnel; for URLs printed for other
    programs, which must outlive this command (`invoke serve-url`)."""
    selected, impl = common.select(provider, cluster)
    access = impl.head_access(common.running(selected))
    local, pid, reused = access.forward(selected.name, {name: port})
    if pid is None:
        return local[name]  # the head's port is this machine's own
    ui.info(f"tunnel to {access.where} {'still open' if reused else 'opened'} (pid {pid}; "
            f"`invoke env{common.cluster_flag(selected)} --close` or `invoke teardown` ends it)")
    return local[name]


def shell(provider: str | None, cluster: str | None) -> int:
    """A shell on the head (local: here, in the cluster's Ray environment)."""
    name, access = _access(provider, cluster)
    return access.attach(cluster=name)


def exec_(provider: str | None, cluster: str | None, command: str) -> int:
    """Run one shell command line on the head; its exit code is ours."""
    if not command.strip():
        from infra.core.errors import UsageError

        raise UsageError("exec: no command; put it after `--`, e.g. `invoke exec -- nproc`")
    _, access = _access(provider, cluster)
    return access.attach(command)


def sync(provider: str | None, cluster: str | None, direction: str, local: str,
         remote: str) -> int:
    """rsync LOCAL to REMOTE on the head (`up`) or REMOTE on the head to LOCAL (`down`)."""
    if direction not in ("up", "down"):
        from infra.core.errors import UsageError

        raise UsageError(f"sync {direction}: the first argument is `up` (to the head) or "
                         "`down` (from it)")
    way: Direction = "up" if direction == "up" else "down"
    _, access = _access(provider, cluster)
    return access.sync(way, local, remote)
