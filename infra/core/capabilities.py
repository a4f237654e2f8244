"""What each provider does: one table per provider, in the manner of SkyPilot's
`CloudImplementationFeatures`.

Every "does this provider do X" (and every default a provider sets for a key the spec leaves out)
is read from the spec class's `CAPABILITIES`, never from the provider's name: the spec's own
validators, `up`, `plan`, `invoke check`, sharing and the autodown report alike. The spec class
holds it (not the provider) because a spec is validated before any provider exists.
`commands.refuse_what_the_provider_lacks` is the one check of a spec against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    #: It reaches its nodes over SSH (`invoke check` then checks ssh and rsync here).
    ssh: bool = False
    #: `up` starts an MLflow tracking server (infra/core/tracking/client.py) for `tracking: mlflow`,
    #: and its endpoints carry `tracking_url`; elsewhere `plan` and `up` refuse the key in one line.
    tracking: bool = False
    #: `up` starts a Prometheus on the head for `metrics: prometheus`
    #: (infra/core/metrics/prometheus.py), and its endpoints carry `metrics_url`; elsewhere `up`
    #: says in one line that it has none.
    metrics: bool = False
    #: `up` starts the sharing gateway on the head (infra/core/sharing/owner.py); elsewhere `plan`
    #: and `up` refuse a `sharing:` block in one line, giving `sharing_refusal` (`{provider}`: its name).
    sharing_gateway: bool = False
    sharing_refusal: str = "the gateway does not run on {provider} heads yet"
    #: The head has a public address: `sharing:` must name `allowed_source_ranges`.
    sharing_needs_ranges: bool = False
    #: The IPv4 ranges members reach this provider's heads in: all that the cluster's sharing CA
    #: may sign for besides `localhost` and `sharing.hostname` (infra/core/sharing/certs.py's name
    #: constraints). A cloud head made again after autodown has a new public address, anywhere:
    #: every IPv4 address.
    sharing_ca_ranges: tuple[str, ...] = ("0.0.0.0/0",)
    #: Ray runs as a Unix user of its own that setup creates (not the owner's account); where it
    #: does not, `sharing:` must say `members_run_as_owner: true`.
    separate_ray_user: bool = False
    #: A head that removes itself may be gone before this machine read its last marker (it
    #: deletes its own VM or instance): nothing left after a countdown then counts as a
    #: self-removal at the end of that countdown (see `autodown_view.decide`).
    autodown_last_word_may_be_lost: bool = False
    #: Minutes of idleness after which a cluster removes itself when its spec says nothing about
    #: `autodown` (paid providers set it); None: off unless the spec turns it on.
    autodown_default_minutes: float | None = None
    #: `metrics` when the spec says nothing.
    metrics_default: str = "prometheus"
    #: Top-level spec keys that `up` on a running cluster puts in effect there (a head daemon it
    #: restarts with its new config); any other change needs a new cluster (infra/core/drift.py).
    applied_by_up: frozenset[str] = frozenset()
    #: `sharing.isolation: cluster` holds here: the head's member-cluster daemon
    #: (infra/node/member_clusters.py) gives each member a Ray cluster of their own as a Unix user
    #: of its own; elsewhere the spec is refused in one line giving `member_clusters_refusal`.
    member_clusters: bool = False
    member_clusters_refusal: str = "each member's own cluster is not built for {provider} yet"
    #: The head is this machine: member users are made here, so `plan` and `up` need root.
    member_clusters_need_local_root: bool = False


#: A paid cloud's head (lambda, gcp-tpu): reached over SSH; tracking and metrics beside Ray; the
#: sharing gateway on the head as a user of its own, its port opened by a firewall rule to
#: `sharing.allowed_source_ranges` (the head has a public address); Ray as `rayfleet-ray`, with
#: no sudo and no credential; the head removes its own VM or instance last; paid by the hour, so
#: an idle cluster removes itself after an hour unless its spec says otherwise.
CLOUD_HEAD = Capabilities(ssh=True, tracking=True, metrics=True, sharing_gateway=True,
                          sharing_needs_ranges=True, separate_ray_user=True,
                          autodown_last_word_may_be_lost=True, autodown_default_minutes=60,
                          # The watcher, the tracking server and the gateway: each a supervised
                          # daemon that `up` restarts when its config differs.
                          applied_by_up=frozenset({"autodown", "sharing"}),
                          # Through the head interface: the starter installed as root's command
                          # there, the gateway's user running it with `sudo -n` (isolation.py).
                          member_clusters=True)
