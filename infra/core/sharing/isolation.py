"""`sharing.isolation: cluster`, the owner's side: what `plan` says and refuses, what `up` writes.

The head runs the member clusters (infra/node/member_clusters.py, in the gateway) through the
privileged starter (infra/node/member_starter.py); here, before anything is created, a spec whose
head cannot hold the walls is refused in one line (the provider's table, capabilities.py, and
root where member users are made on this machine), and at `up` the starter's config is written
where the head interface says the head is, and named in the gateway's config: on this machine
root's own 0600 file beside the gateway's config (the gateway runs as root); on a head set up
over SSH (Lambda, GCP-TPU: the gateway runs as a user of its own, Ray as another) root's own
command and 0600 config there, installed by setup/users/users.sh with the one sudoers rule that
lets the gateway's user run it. Never by the provider's name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from infra.core import privilege, shipping
from infra.core.errors import SpecError
from infra.core.head import HeadAccess
from infra.core.spec import ClusterSpec
from infra.node import gateway_config, shell
from infra.node import member_clusters as mc

#: The head machine's memory per active member cluster: one Ray head (GCS, raylet, dashboard and
#: its agents, the autoscaler monitor), idle, measured by bench/isolation.py on the local provider.
HEAD_MB_PER_MEMBER = 700

#: The head's services a member cluster does not get, refused with `isolation: cluster` (the
#: field, the value refused, the fix, why): one server per member would cost as much again as
#: the member's Ray head, and the shared one would either miss the member clusters or mix every
#: member's data in one store. Serve is refused by the gateway (gateway_isolated.py): it is no
#: spec field.
SERVICES = (
    ("tracking", "mlflow", "none", "member clusters start without the tracking server's address, "
     "and one store would show every member's runs to each"),
    ("metrics", "prometheus", "none", "it scrapes the base cluster only, never a member's; "
     "a member's usage comes from the gateway, not from it"))


def isolated(selected: ClusterSpec) -> bool:
    return selected.sharing is not None and selected.sharing.isolation == "cluster"


def check(selected: ClusterSpec) -> None:
    """What `plan` and `up` refuse beyond the spec's own validation (which refuses providers
    without member clusters): a head service members would not get (SERVICES), and member
    users made on this machine without root."""
    if not isolated(selected):
        return
    for field, value, fix, why in SERVICES:
        if getattr(selected, field) == value:
            raise SpecError(f"{selected.source}: {field}: {value} is not per member with "
                            f"sharing.isolation: cluster ({why}); set `{field}: {fix}` or use "
                            "`isolation: shared`")
    if type(selected).CAPABILITIES.member_clusters_need_local_root and os.geteuid() != 0:
        raise SpecError(f"{selected.source}: sharing.isolation: cluster needs root to create "
                        "member users on this machine; run `invoke up` as root or use "
                        "`isolation: shared`")


def plan_note(selected: ClusterSpec) -> str:
    """`plan`'s words on the choice and its cost ('' for `isolation: shared`)."""
    if not isolated(selected):
        return ""
    assert selected.sharing is not None
    most = selected.sharing.max_active_members
    return (f"; isolation: cluster — each member gets a Ray cluster of their own (a Unix user of "
            f"its own) at their first request, stopped after "
            f"{selected.sharing.member_idle_minutes:g} idle minutes; cost: one Ray head per "
            f"active member on the head machine (at most {most} at once, about "
            f"{HEAD_MB_PER_MEMBER} MB each, {most * HEAD_MB_PER_MEMBER / 1024:.1f} GB at most), "
            "no packing across members")


def with_member_clusters(selected: ClusterSpec, access: HeadAccess,
                         config: gateway_config.Config, folder: Path) -> gateway_config.Config:
    """The gateway's config, naming the starter's config it reads, for `isolation: cluster`
    (unchanged otherwise). A head whose daemons run as the node's users (`node_users`: set up
    over SSH, with sudo) gets the starter installed there as root's own command (install_on_head);
    a head on this machine (root, refused otherwise by `check`) gets root's 0600 config beside the
    gateway's, which runs as root and calls the starter directly."""
    if not isolated(selected):
        return config
    path = install_on_head(selected, access) if access.node_users else write_here(selected, folder)
    return dataclasses.replace(config, isolation="cluster",
                               member_clusters_config=access.head_path(path))


def write_here(selected: ClusterSpec, folder: Path) -> str:
    assert selected.sharing is not None
    # The head is this machine: its CPUs (unless the spec sets them) and memory, read here.
    starter = mc.on_this_machine(mc.StarterConfig(
        cluster=selected.name, tmp_root="/tmp", token_dir=str(folder / "member-tokens"),
        gateway_uid=os.getuid(), gateway_gid=os.getgid(),
        python_bin=str(Path(sys.executable).parent),
        num_cpus=int(getattr(selected, "num_cpus", None) or 0), cpus=0.0, memory_mb=0,
        max_active_members=selected.sharing.max_active_members,
        member_idle_minutes=selected.sharing.member_idle_minutes,
        sudo=[] if os.geteuid() == 0 else ["sudo", "-n"]))
    path = folder / mc.CONFIG_FILE
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mc.write_starter_config(path, starter)
    return str(path)


#: Where `up` stages the starter's files on a head for setup/users/users.sh (`starter:`), in the
#: SSH user's private dir; the gateway's copy of its config lands at the same path in its home.
STAGED = ".rayfleet/member-starter"
GATEWAY_COPY = f"{STAGED}/{mc.CONFIG_FILE}"
#: Where the starter keeps the gateway's copies of member tokens on such a head (root's 0750 dir
#: of the gateway's group, outside every user's home).
HEAD_TOKEN_DIR = "/var/lib/rayfleet-members/{cluster}/tokens"
#: The starter as users.sh installs it, and the one thing the gateway's user may run with sudo.
STARTER_COMMAND = ("sudo", "-n", "/etc/rayfleet/member-starter")


def head_starter_config(selected: ClusterSpec) -> mc.StarterConfig:
    """The starter's config for a head set up over SSH: the head's own users, Python, CPUs and
    memory (read there: 0 and '' below), the token copies in a dir of root's outside every
    user's home."""
    assert selected.sharing is not None
    return mc.StarterConfig(
        cluster=selected.name, tmp_root="/tmp",
        token_dir=HEAD_TOKEN_DIR.format(cluster=selected.name),
        gateway_uid=-1, gateway_gid=-1, gateway_user=privilege.GATEWAY_USER, python_bin="",
        num_cpus=int(getattr(selected, "num_cpus", None) or 0), cpus=0.0, memory_mb=0,
        max_active_members=selected.sharing.max_active_members,
        member_idle_minutes=selected.sharing.member_idle_minutes, command=list(STARTER_COMMAND))


def install_on_head(selected: ClusterSpec, access: HeadAccess) -> str:
    """The starter installed on the head by users.sh as root (its config root's 0600, its code
    root's, one sudoers rule for the gateway's user), the gateway's copy of the config in its
    home; that copy's path. One SFTP session and one command: the folder of the head's Ray
    Python, as its node environment finds `ray`, is read there."""
    text = json.dumps(dataclasses.asdict(head_starter_config(selected)), indent=2).encode()
    access.put_private({f"~/{STAGED}/member-starter.json": text, f"~/{GATEWAY_COPY}": text,
                        f"~/{STAGED}/node.zip": shipping.node_zip(),
                        # A head set up by an older rayfleet has a users.sh without `starter:`.
                        f"~/{privilege.USERS_SCRIPT}":
                            (privilege.SCRIPTS_SOURCE / "users.sh").read_bytes()})
    python = shell.home(f"~/{STAGED}/python")
    install = privilege.AS_ROOT + shell.argv(
        "bash", shell.home(f"~/{privilege.USERS_SCRIPT}"), shell.home("~"),
        f"gateway:{GATEWAY_COPY}", f"starter:{STAGED}")
    access.run(shell.all_of(f'{access.activate}dirname "$(command -v ray)" > {python}', install),
               timeout=120, check=True)
    return f"~/{GATEWAY_COPY}"
