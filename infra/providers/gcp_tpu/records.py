"""What the GCP TPU provider records in state (infra/core/state.py), one model per resource kind."""

from __future__ import annotations

from typing import ClassVar

from infra.core.state import Attrs


class SshKey(Attrs):
    """The cluster's key pair on this machine; its id is the key's folder."""

    KIND: ClassVar[str] = "ssh-key"


class Cluster(Attrs):
    """The Ray cluster that `ray up` made (head VM and the autoscaler's nodes); its id is its
    name."""

    KIND: ClassVar[str] = "gcp-ray-cluster"

    project: str
    zone: str
    #: The rendered Ray cluster config (`ray down` runs with it; without one, the label sweep
    #: alone removes the nodes), and the hash of what `ray up` last ran with.
    config: str | None = None
    config_sha256: str | None = None
    credentials_file: str | None = None
    #: The head's SSH user and dashboard port (the spec's when a record lacks them).
    ssh_user: str | None = None
    dashboard_port: int | None = None
    #: The label value its VMs and TPUs carry (the state's cluster id); older files lack it and
    #: used the cluster's name.
    label_id: str | None = None
    #: The head VM's name and addresses, once `ray up` made it.
    head: str | None = None
    head_ip: str | None = None
    head_internal_ip: str | None = None


class Firewall(Attrs):
    """A firewall rule that opens the dashboard or gateway; its id is the rule's name."""

    KIND: ClassVar[str] = "gcp-firewall"

    project: str
    ranges: list[str]
    port: int


class Queued(Attrs):
    """A queued TPU request for one slice; its id is the request's id."""

    KIND: ClassVar[str] = "gcp-queued-resource"

    project: str | None = None
    zone: str
    #: The slice (spec name) and which of its requests.
    slice: str | None = None
    index: int | None = None
