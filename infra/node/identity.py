"""Who owns a resource: the cluster id every resource carries, and the owner mark of whoever ran `up`.

A name is never proof of ownership: a colleague's cluster made from the same example spec has the
same names. So the first `up` of a cluster draws a random id, stored in its state, and every resource
rayfleet creates carries it (a tag, label, name part, job comment, temp-dir part or process marker).
Providers adopt, report or remove only what carries their cluster's id.

The owner mark (a hash of user and machine, or the `RAYFLEET_OWNER` variable) tells a leak sweep
which resources with a cluster id are this user's: it is a hint for listing, not proof of anything.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import secrets
import socket

#: Tag / label keys (lowercase, digits, dashes: valid on Lambda, GCP and as Slurm comment words).
TAG_CLUSTER = "rayfleet-cluster"
TAG_OWNER = "rayfleet-owner"
TAG_NAME = "rayfleet-name"
#: Stands for the cluster id in names that `plan` shows before the first `up` has made one; the
#: same in every provider (and valid where ids go: GCP labels, Lambda names, temp dirs).
ID_PLACEHOLDER = "assigned-at-first-up"

_ID = re.compile(r"^[0-9a-f]{8}$")


def new_cluster_id() -> str:
    """A fresh random cluster id: 8 hex characters (32 bits; enough within one account or site)."""
    return secrets.token_hex(4)


def is_cluster_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def owner_mark() -> str:
    """12 hex characters naming this user on this machine (or `RAYFLEET_OWNER`, hashed)."""
    explicit = os.environ.get("RAYFLEET_OWNER")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    who = explicit or f"{user}@{socket.getfqdn()}"
    return hashlib.sha256(who.encode()).hexdigest()[:12]
