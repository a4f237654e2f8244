"""Sharing a cluster, the owner's side: the gateway at `up`, the member registry, bundles, usage.

The owner's registry is `.rayfleet/sharing/<cluster>/members.json` (names, roles, expiry, the
SHA-256 of each token; never a token). A member's token exists in exactly one place on the owner's
machine: the bundle file `member-add` writes (0600), which the owner sends. For a head on this
machine (the local provider) that folder is also the gateway's data dir, so a change reaches the
gateway at its next request; a remote head gets the file over SFTP (at every `up` and every
change), handed with sudo to the gateway's own user (`rayfleet-gateway`: no sudo, no key, not
Ray's user), into its `~/.rayfleet/gateway` (0700: neither Ray's user nor any job can read it;
the SSH user reaches it only through sudo, as it reads usage back). Usage stays
with the registry too: a remote head's copy is fetched by `members` and at `teardown`, and given
back to a new head at `up`, so it survives teardown, autodown and the next `up` (like the tracking
store). A head whose batch job runs the gateway itself (`head.SharedFsHead`, Slurm) gets the
same files in its folder on the site's shared filesystem; the job's supervisor starts the gateway
once its config is there and ends it with the job.

Where the head is and how files and daemons get there is the head's (`HeadAccess`): this module
writes the same files and asks for the same daemon whatever the head.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infra.core import paths, privilege
from infra.core.costs import NodePrices
from infra.core.errors import RayfleetError, SpecError, UsageError
from infra.core.head import GatewayFiles, HeadAccess, LocalHead
from infra.core.progress import Progress, Step, timed, warn
from infra.core.sharing import certs as sharing_certs
from infra.core.sharing import isolation, term_people
from infra.core.sharing import term as sharing_term
from infra.core.sharing.owner_token import ensure_owner_token
from infra.core.sharing.owner_token import jobs_run_as_owner as jobs_run_as_owner
from infra.core.sharing.owner_token import owner_token_path as owner_token_path
from infra.core.sharing.owner_token import privilege_warning as privilege_warning
from infra.core.sharing.owner_token import renew_owner_token as renew_owner_token
from infra.core.spec import ClusterSpec
from infra.core.state import State
from infra.node import gateway_config, gateway_files, gateway_state, member_usage, net
from infra.node.files import atomic_write

#: What a bundle says it is; `join` refuses anything else.
BUNDLE_KIND = "rayfleet-member-bundle/1"


#: Where a head keeps the gateway's files (`HeadAccess.gateway_files`).
HeadFiles = GatewayFiles


def head_files(access: HeadAccess, cluster: str) -> GatewayFiles:
    """Where this head keeps cluster `cluster`'s gateway files: on a head of its own under
    `~/.rayfleet`; on a head whose job runs the gateway, in its folder on the shared work dir;
    on this machine, the owner's sharing folder itself."""
    return access.gateway_files(cluster)


def gateway_user(selected: ClusterSpec, access: HeadAccess) -> str | None:
    """The node user a head runs the gateway as (privilege.GATEWAY_USER: no sudo, no key, not
    Ray's user), where setup makes the node's users (`Capabilities.separate_ray_user`) and the
    head's daemons may run as them; None: the SSH user (no such head today), this machine's
    owner, or the head's own job (Slurm)."""
    if not (access.node_users and type(selected).CAPABILITIES.separate_ray_user):
        return None
    return privilege.GATEWAY_USER


class SharingError(RayfleetError):
    """A sharing verb cannot do what was asked (no `sharing:`, unknown member, ...)."""


def folder(cluster: str) -> Path:
    return paths.home() / "sharing" / cluster


def registry_path(cluster: str) -> Path:
    return folder(cluster) / gateway_state.MEMBERS_FILE


def check_spec(selected: ClusterSpec) -> None:
    """What `plan` and `up` refuse about `sharing:` before anything is created: a provider whose
    head gets no gateway (first: its reason stands whatever else the block says), and (issue 29)
    where Ray runs as the owner's own account, members' jobs do too, so the owner must say they
    accept that."""
    sharing = selected.sharing
    if sharing is None:
        return
    if not type(selected).CAPABILITIES.sharing_gateway:
        why = type(selected).CAPABILITIES.sharing_refusal.format(provider=selected.provider)
        raise SpecError(f"{selected.source}: sharing: {why}; remove the block "
                        "(docs/concepts/sharing.md)")
    isolation.check(selected)
    # With `isolation: cluster` members' jobs run as users of their own, not as the owner.
    if not (type(selected).CAPABILITIES.separate_ray_user or sharing.members_run_as_owner
            or isolation.isolated(selected)):
        raise SpecError(f"{selected.source}: sharing.members_run_as_owner: required on "
                        f"{selected.provider}: rayfleet cannot create a user for Ray there, so "
                        "members' jobs run as your own account and can read your files; add "
                        "`members_run_as_owner: true` under sharing: to accept that")


# --- the registry ------------------------------------------------------------------------------

def read_registry(cluster: str) -> dict[str, dict[str, Any]]:
    """The entries the gateway reads (`members`); the file's other sections: sharing_term."""
    members: dict[str, dict[str, Any]] = sharing_term.read_book(cluster)["members"]
    return members


def write_registry(cluster: str, members: dict[str, dict[str, Any]],
                   owner: dict[str, Any] | None = None) -> None:
    """The registry with `members`; the owner's entry kept as it is unless `owner` is given, and
    every other section (the removed members: sharing_term) kept as it is."""
    book = sharing_term.read_book(cluster) if registry_path(cluster).exists() else {}
    data: dict[str, Any] = {**book, "members": members}
    if owner is not None:
        data["owner"] = owner
    sharing_term.write_book(cluster, data)


def apply_term(selected: ClusterSpec) -> bool:
    """Write each member's effective expiry (theirs, capped by `sharing.ends`) into the registry
    the gateway reads; whether it changed (then a remote head needs the file again)."""
    book = sharing_term.read_book(selected.name)
    if not sharing_term.apply_ends(book["members"], sharing_term.ends_of(selected.sharing)):
        return False
    sharing_term.write_book(selected.name, book)
    return True


def new_member(admin: bool, expires_days: float | None) -> tuple[dict[str, Any], str]:
    """The registry entry of a new member and their token (returned once, never stored here).
    `id` is random: a name added again is another member, who sees nothing of the first's."""
    token = secrets.token_hex(32)
    now = dt.datetime.now(dt.timezone.utc)
    expires = (now + dt.timedelta(days=expires_days)).isoformat(timespec="seconds") \
        if expires_days else None
    return ({"role": "admin" if admin else "member", "added": now.isoformat(timespec="seconds"),
             "expires": expires, "id": secrets.token_hex(8),
             "token_sha256": gateway_state.token_hash(token)}, token)


def bundle(cluster: str, url: str, member: str, token: str) -> dict[str, str]:
    return {"kind": BUNDLE_KIND, "cluster": cluster, "address": url, "member": member,
            "ca_cert": sharing_certs.ca_cert_path(cluster).read_text(), "token": token}


# --- the gateway on the head -------------------------------------------------------------------

#: The gateway's rules that are the spec's `sharing` fields of the same name, as written there.
SPEC_RULES = ("max_running_jobs_per_member", "max_job_hours", "members_see_dashboard",
              "max_upload_mb", "max_member_upload_mb", "max_member_connections",
              "max_member_uploads", "max_member_tails", "members_may_pip", "member_budget_hours",
              "member_budget_usd", "budget_usd")


def gateway_settings(selected: ClusterSpec, access: HeadAccess, state: State, address: str,
                     prices: NodePrices | None = None) -> tuple[gateway_config.Config, Path]:
    """The gateway's config for this head, and where it goes (this machine: the sharing folder)."""
    assert selected.sharing is not None
    names = [address, *access.names]
    hostname = selected.sharing.hostname
    if hostname:
        names.append(hostname)
    # The CA signs only for these kinds of names (sharing_certs); one that no member's bundle
    # holds yet may be made again to fit them.
    cert, key = sharing_certs.ensure_server_cert(
        selected.name, names, type(selected).CAPABILITIES.sharing_ca_ranges,
        replaceable=not read_registry(selected.name), dns=(hostname,) if hostname else ())
    token = access.env.get("RAY_AUTH_TOKEN_PATH")
    where = head_files(access, selected.name)
    config = gateway_config.Config(
        cluster=selected.name, host=access.listen_host,
        port=selected.sharing.port, upstream=f"http://127.0.0.1:{access.dashboard_port}",
        # Every path as the gateway on the head opens it.
        token_path=access.head_path(token) if token else token, cert=str(cert), key=str(key),
        data_dir=access.head_path(where.data),
        **{name: getattr(selected.sharing, name) for name in SPEC_RULES},
        price_per_hour=prices.floor_usd if prices else 0.0,
        node_prices=dict(prices.by_type) if prices else {},
        head_type=prices.head_type if prices else "",
        secret_paths=[access.head_path(access.tracking_password)]
        if selected.tracking == "mlflow" else [])
    config = isolation.with_member_clusters(selected, access, config, folder(selected.name))
    return config, folder(selected.name) / gateway_config.CONFIG_FILE


def ensure_gateway(selected: ClusterSpec, access: HeadAccess, state: State,
                   prices: NodePrices | None, progress: Progress) -> str | None:
    """Start the cluster's gateway unless it runs with this config; its https:// address.
    `prices`: the provider's node prices, for the cost share (None: the cluster costs $0)."""
    if selected.sharing is None:
        return None
    address = access.address
    hostname = selected.sharing.hostname
    url = f"https://{hostname or address}:{selected.sharing.port}"
    members = read_registry(selected.name)
    warn(progress, stale_bundles_warning(members, url, state.info.gateway_url))
    config, config_path = gateway_settings(selected, access, state, address, prices)
    if not members:
        write_registry(selected.name, {})
    ensure_owner_token(selected.name)
    apply_term(selected)  # `sharing.ends` may have changed since the last `up`
    read_usage(selected, access)  # the running head's accounting first, then given back
    start_gateway(access, config, config_path, gateway_user(selected, access))
    with timed(progress, f"waiting for the sharing gateway on {url}"):
        started = access.answers(config.port, timeout=60)
    if not started:
        raise SharingError(f"the sharing gateway did not start on the head within 60 s; see "
                           f"{head_files(access, selected.name).log} there (`invoke ssh`)")
    if state.info.gateway_url != url:
        state.set_info(gateway_url=url)
    # A loopback address is this machine's own: nobody points DNS at it.
    if hostname and not net.is_loopback(address):
        progress(Step(f"sharing.hostname: point DNS for {hostname} at {address} (an A record; "
                      "the head's address now): members' bundles name it and need no change"))
    return url


def stale_bundles_warning(members: dict[str, dict[str, Any]], url: str,
                          previous: str | None) -> str | None:
    """One line when members hold bundles naming another address (the head came back on a new
    one: Lambda gives a new instance a new IP); each entry records the address its bundle names."""
    stale = sorted(name for name, entry in members.items()
                   if (entry.get("address") or previous) not in (None, url))
    if not stale:
        return None
    return (f"the gateway is now at {url}: members {', '.join(stale)} need a new bundle "
            "(`invoke member-remove NAME` then `invoke member-add NAME`; their usage is kept)")


def start_gateway(access: HeadAccess, config: gateway_config.Config, config_path: Path,
                  user: str | None = None) -> None:
    """The one place that starts the gateway, under the head daemons' one supervisor
    (`HeadAccess.ensure_daemon`), with the certificate, its key, the registry (hashes only) and
    the last usage copy as 0600 files in its 0700 data dir, all where the head keeps them
    (`head_files`), and, for a node `user` (gateway_user), its own copies of the Ray token and the
    tracking password in that user's home. On this machine those files are the owner's own; a
    head whose job runs the gateway gets them on the shared file system, the config last.
    `config_path`: the owner's copy of a gateway config here (the sharing folder)."""
    where = head_files(access, config.cluster)
    cert, key = Path(config.cert), Path(config.key)
    on_head = {**asdict(config), "cert": access.head_path(where.cert),
               "key": access.head_path(where.key)}
    files = {where.cert: cert.read_bytes(), where.key: key.read_bytes(),
             f"{where.data}/{gateway_state.MEMBERS_FILE}":
                 registry_path(config.cluster).read_bytes()}
    usage = folder(config.cluster) / gateway_state.USAGE_FILE
    if usage.exists():
        files[f"{where.data}/{gateway_state.USAGE_FILE}"] = usage.read_bytes()
    # What it reads of the SSH user's (home-relative paths): its copies, the SSH user's kept.
    copies = tuple(p for p in (config.token_path, *config.secret_paths)
                   if p and not p.startswith("/")) if user else ()
    # `always`: a gateway that ends unasked, exit 0 included, is back within seconds (only its
    # supervisor's stop ends it: teardown, `up` with a new config, the head's end).
    access.ensure_daemon("infra.node.gateway", where.config,
                         gateway_config.config_text(gateway_config.Config(**on_head)),
                         secrets=files, log=where.log, user=user, copies=copies,
                         restart="always")


def stop_local(config_path: Path) -> None:
    """Stop the gateway started here with `config_path` and its supervisor, if they run."""
    LocalHead(where="this machine").stop_daemon(str(config_path))


def stop_gateway(selected: ClusterSpec, access: HeadAccess | None) -> None:
    """At teardown: the gateway goes with the cluster (its members and usage stay). A gateway
    its head's job runs ends with that job, which teardown cancels next: only its usage here."""
    if access is None:  # the head is gone; a gateway started here goes too
        stop_local(folder(selected.name) / gateway_config.CONFIG_FILE)
        return
    with contextlib.suppress(RayfleetError):
        access.stop_daemon(head_files(access, selected.name).config,
                           gateway_user(selected, access))
    # After it stopped (its last tick written): the head's accounting kept here.
    with contextlib.suppress(RayfleetError, OSError):
        read_usage(selected, access)


def push_registry(selected: ClusterSpec, access: HeadAccess) -> None:
    """Put the registry where the gateway reads it (on this machine it reads the owner's own)."""
    access.put_private({f"{head_files(access, selected.name).data}/{gateway_state.MEMBERS_FILE}":
                        registry_path(selected.name).read_bytes()},
                       gateway_user(selected, access))


def read_usage(selected: ClusterSpec, access: HeadAccess | None) -> dict[str, Any]:
    """The gateway's usage file (a remote head's when it answers, else the last copy here); with
    `isolation: cluster`, each member cluster's state and usage under `member_clusters`, by
    member id (infra/node/member_usage.py)."""
    found = _head_json(selected, access, gateway_state.USAGE_FILE)
    # Through its typed form (gateway_files.UsageFile): what 84e0693 wrote reads the same.
    data = gateway_files.UsageFile.from_dict(found if isinstance(found, dict) else {}).to_dict()
    if isolation.isolated(selected):
        found = _head_json(selected, access, member_usage.USAGE_FILE)
        data["member_clusters"] = found if isinstance(found, dict) else {}
    return data


def job_records(usage: dict[str, Any]) -> dict[str, gateway_files.JobRecord]:
    """The job records of what `read_usage` returned, by submission id (each a copy of its own:
    callers update them with Ray's view)."""
    return {key: gateway_files.JobRecord.from_dict(record)
            for key, record in usage.get("jobs", {}).items()}


def _head_json(selected: ClusterSpec, access: HeadAccess | None, name: str) -> Any:
    """A file of the gateway's data dir, as JSON (None: none, or not JSON)."""
    local = folder(selected.name) / name
    if access is not None:
        path = f"{head_files(access, selected.name).data}/{name}"
        user = gateway_user(selected, access)
        text = access.read(path, user)
        if not text and user is not None:
            # A head whose gateway ran as the SSH user (before its own user): its last usage,
            # which the first `up` since hands over to the new user (and so away from here).
            text = access.read(path)
        if text and text != _text(local):  # on this machine the head's file is this one
            atomic_write(local, text, mode=0o600)
    try:
        return json.loads(local.read_text())
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text()
    return None


def recorded_for(record: gateway_files.JobRecord, name: str, entry: dict[str, Any]) -> bool:
    """Whether a job record of the gateway's usage is member `name`'s (registry `entry`): by the
    member id made at `member-add`; records and entries from before ids match by name."""
    if record.member != name:
        return False
    # A record from before ids has no `member_id` key at all (a null is no legacy record).
    recorded = gateway_state.legacy_id(name) if "member_id" in record.absent else record.member_id
    return recorded == \
        entry.get("id", gateway_state.legacy_id(name))


def member_job_ids(selected: ClusterSpec, impl: Any, name: str,
                   entry: dict[str, Any]) -> set[str]:
    """The ids of every job the gateway recorded as submitted by member `name`."""
    from infra.core import state

    current = state.read(selected.name)
    access = None
    with contextlib.suppress(Exception):  # a head that is gone: the usage copy kept here
        access = impl.head_access(current) if current is not None and not current.empty else None
    usage = read_usage(selected, access)
    return {key for key, record in job_records(usage).items()
            if recorded_for(record, name, entry)}


def name_members(selected: ClusterSpec, impl: Any, current: State,
                 rows: list[dict[str, str]]) -> None:
    """Each job row of `status` with its member, by the gateway's record ("" for a job not
    submitted through the gateway: the owner's own, or one started inside the cluster), and why
    the cluster stopped it when it did."""
    access = None
    with contextlib.suppress(Exception):
        access = impl.head_access(current)
    records = job_records(read_usage(selected, access))
    for row in rows:
        record = records.get(row["job"]) or gateway_files.JobRecord()
        row["member"] = str(record.member or "")
        row["stopped"] = str(record.stopped_reason or "")


def require_sharing(selected: ClusterSpec) -> None:
    if selected.sharing is None:
        raise UsageError(f"{selected.source}: sharing: this cluster is not shared; add a "
                         "`sharing:` block to its spec and run `invoke up` (docs/concepts/sharing.md)")


def budget_status(selected: ClusterSpec, access: HeadAccess | None) -> dict[str, Any] | None:
    """For the owner's `status`: the cluster's budget, and each member at or past 80 % of theirs,
    from the gateway's usage file (None when the spec sets no budget)."""
    shared = selected.sharing
    if shared is None or not (shared.budget_usd or shared.member_budget_hours
                              or shared.member_budget_usd):
        return None
    usage = read_usage(selected, access)
    rows = sharing_term.rows_of(sharing_term.read_book(selected.name), usage, job_records(usage),
                                shared)
    rows = term_people.people(rows, shared)  # a budget is per person per term, across a re-add
    return {"cluster": sharing_term.cluster_budget(shared, usage),
            "members_near": [{"name": r["name"], "used": r["budget_used"],
                              "job_hours": r["job_hours"], "cost_share_usd": r["cost_share_usd"]}
                             for r in rows if r["status"] != "removed"
                             and (r["budget_used"] or 0) >= sharing_term.WARN_AT]}


def plan_note(selected: ClusterSpec, current: State | None) -> str | None:
    """`plan`'s line on sharing: the gateway, its port, who may reach it, the term's limits."""
    shared = selected.sharing
    if shared is None:
        return None
    text = f"sharing: a gateway (HTTPS) on the head, port {shared.port}"
    if shared.allowed_source_ranges:
        text += f", reachable from {', '.join(shared.allowed_source_ranges)} only"
    url = current.info.gateway_url if current is not None else None
    text += f"; now at {url}" if url else "; `invoke up` starts it"
    limits = [f"access ends {sharing_term.shown(ends)}"
              for ends in [sharing_term.ends_of(shared)] if ends]
    limits += [f"{label} {value:g}" for label, value in (
        ("member budget (job-hours)", shared.member_budget_hours),
        ("member budget ($)", shared.member_budget_usd),
        ("cluster budget ($)", shared.budget_usd)) if value]
    text += isolation.plan_note(selected)
    return text + (f"; the term: {', '.join(limits)}" if limits else "")
