"""The autodown watcher (infra/node/autodown.py) on a head this machine reaches over SSH (Lambda,
GCP): putting it there supervised, stopping it, and reading its marker with whether it runs.

The mechanism is the head's (`infra.core.head.HeadAccess`: its supervised daemons, its files); this
module holds only what is the watcher's own: its config, marker and log paths on the head.
"""

from __future__ import annotations

from infra.core.autodown import view as autodown_view
from infra.core.head import HeadAccess
from infra.node import autodown


def install(head: HeadAccess, config: autodown.Config, secrets: dict[str, bytes] | None = None,
            user: str | None = None) -> None:
    """Put the node package, the watcher's config and `secrets` (home-relative path -> content,
    0600) on the head, then start the watcher there supervised unless it runs; as the node user
    `user` when given (the one that holds the cloud credential: infra/core/privilege.py), with its
    files in that user's home."""
    head.ensure_daemon("infra.node.autodown", autodown.HEAD_CONFIG, autodown.config_text(config),
                       secrets, log=autodown.HEAD_LOG, user=user)


def stop(head: HeadAccess, user: str | None = None) -> None:
    """Stop the head's autodown watcher (and its supervisor) and remove its config."""
    head.stop_daemon(autodown.HEAD_CONFIG, user)


def head_marker(head: HeadAccess, user: str | None = None) -> str | None:
    """The watcher's marker on a running head, with `watcher_running` (does the watcher or its
    supervisor run, by process identity) when the head can say; None when it cannot say."""
    text, status = head.read_with_status(autodown.HEAD_MARKER, autodown.HEAD_CONFIG, user)
    return autodown_view.with_watcher_status(text, status)
