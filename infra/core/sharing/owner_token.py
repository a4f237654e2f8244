"""The owner's own gateway token, and what a member's job can reach where it runs as the owner.

The owner reaches their shared cluster's gateway with a token of their own (never the cluster's
Ray token, which every node holds and the gateway accepts from nobody): `owner-token` (0600) in
the cluster's sharing folder, its SHA-256 as the registry's `owner` entry. Where members' jobs run
as the owner's account (local; slurm with a shared home) a job can copy it and use it from
anywhere through the gateway; so `member-remove` and `rotate-token` renew it (infra/cli/sharing.py
then puts the registry where the gateway reads it), and `plan` and `up` say so in one line.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.core.sharing import isolation
from infra.core.sharing import term as sharing_term
from infra.core.spec import ClusterSpec
from infra.node import gateway_state
from infra.node.files import atomic_write


def owner_token_path(cluster: str) -> Path:
    """The owner's own gateway token (0600): never the cluster's Ray token, which every node
    holds (so any member's job can read it) and which the gateway accepts from nobody."""
    return sharing_term.registry_path(cluster).parent / "owner-token"


def _new_owner_token(path: Path) -> str:
    token = secrets.token_hex(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, token, mode=0o600)
    return token


def ensure_owner_token(cluster: str) -> Path:
    """The owner's gateway token, made once (and again by `renew_owner_token`); its hash in the
    registry the gateway reads."""
    path = owner_token_path(cluster)
    token = path.read_text().strip() if path.exists() else ""
    if not token:
        token = _new_owner_token(path)
    digest = gateway_state.token_hash(token)
    book = sharing_term.read_book(cluster)
    owner = book.get("owner")
    if not isinstance(owner, dict) or owner.get("token_sha256") != digest:
        book["owner"] = {"token_sha256": digest}
        sharing_term.write_book(cluster, book)
    return path


def renew_owner_token(cluster: str, book: dict[str, Any] | None = None) -> Path:
    """A new owner's gateway token (`member-remove`, `rotate-token`): where members' jobs run as
    the owner's account one may have copied the old one, which is refused once this registry
    reaches the gateway (`owner.push_registry`; on this machine it reads this very file, and at
    every request checks whether it changed). `book`: the registry to write with the new hash, in
    the same write (a removal). The token file first: should the registry's write fail, the next
    `up` registers the file's token (`ensure_owner_token`), never the old one again."""
    path = owner_token_path(cluster)
    token = _new_owner_token(path)
    data = book if book is not None else sharing_term.read_book(cluster)
    data["owner"] = {"token_sha256": gateway_state.token_hash(token)}
    sharing_term.write_book(cluster, data)
    return path


def jobs_run_as_owner(selected: ClusterSpec) -> bool:
    """Whether members' jobs run as the owner's own account: no user for Ray of its own on the
    provider (local, slurm; `owner.check_spec` then requires `members_run_as_owner`), and no
    member clusters."""
    return (selected.sharing is not None and not type(selected).CAPABILITIES.separate_ray_user
            and not isolation.isolated(selected))


def privilege_warning(selected: ClusterSpec) -> str | None:
    """`plan` and `up` say it as a warning: one line on what a member's job can reach where it
    runs as the owner's account (None where it does not). Exactly that: a job reads and changes
    what the account can on its node, which on local (and slurm with a shared home) is
    rayfleet's folder too, the owner's gateway token in it included (renewed by `member-remove`
    and `rotate-token`, readable again by a job then running)."""
    if not jobs_run_as_owner(selected):
        return None
    from rich.markup import escape

    return (f"{selected.source}: sharing.members_run_as_owner: members' jobs run as your own "
            f"account on this {selected.provider} cluster, so a job can read and change whatever "
            "that account can on its node: your files, SSH keys and cloud credentials there, and "
            f"wherever {escape(str(paths.home()))} is on that node (always on local, on slurm with "
            "a shared home) rayfleet's keys (the sharing CA's among them), this cluster's members "
            "file and your gateway token "
            f"({escape(str(owner_token_path(selected.name)))}), good from anywhere through the "
            "gateway until `invoke member-remove` or `invoke rotate-token` replaces it (a job "
            "still running can read the new one)")
