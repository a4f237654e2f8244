"""A member's side of a shared cluster: `join BUNDLE`, then the usual verbs through the gateway.

`join` keeps what the bundle holds under `.rayfleet/joined/<cluster>/` (a 0700 folder): the token
as a 0600 file (Ray's own RAY_AUTH_TOKEN_PATH reads it), the cluster's CA certificate, and a CA
file that holds the cluster's CA *and* the public CAs (certifi's list), so that pointing
REQUESTS_CA_BUNDLE/SSL_CERT_FILE at it pins the gateway without breaking any other HTTPS in that
shell (either variable replaces the default list). The bundle file itself is not kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from infra.core import paths, spec
from infra.core.endpoint import Endpoint
from infra.core.errors import RayfleetError, UsageError
from infra.node import shell
from infra.node.files import atomic_write

BUNDLE_KIND = "rayfleet-member-bundle/1"
TOKEN_FILE = "ray-token"
CA_FILE = "ca.pem"
CA_BUNDLE_FILE = "ca-bundle.pem"
INFO_FILE = "cluster.json"
#: What a member's `env` sets, in the order printed. Not RAY_ADDRESS: an https address there
#: makes `python script.py` (ray.init()) fail with "Invalid Ray address"; Ray's job CLI and
#: JobSubmissionClient read RAY_API_SERVER_ADDRESS first.
ENV_NAMES = ("RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH",
             "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


class MembershipError(RayfleetError):
    """A bundle cannot be joined, or a joined cluster cannot be used as asked."""


def folder(cluster: str) -> Path:
    return paths.home() / "joined" / cluster


def joined(cluster: str | None) -> dict[str, str] | None:
    """The joined cluster `--cluster` names. A name means the joined cluster even where a spec of
    that name is visible (a class's repository that ships its cluster's spec): a spec is then
    reached by its path (`--cluster clusters/NAME.yaml`), which never means a joined cluster."""
    if not cluster or cluster.endswith((".yaml", ".yml")) or "/" in cluster:
        return None
    try:
        info = json.loads((folder(cluster) / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def refuse_owner_verb(cluster: str | None, verb: str) -> None:
    """One line for a verb only the owner has (`up`, `teardown`, `member-*`, `ssh`, ...)."""
    info = joined(cluster)
    if info is not None:
        raise UsageError(f"`{verb}` is the owner's: you joined {cluster!r} as member "
                         f"{info['member']!r}; ask the cluster's owner (a spec of that name is "
                         f"reached by its path: --cluster clusters/{cluster}.yaml)")


def _bad(path: str, why: str) -> MembershipError:
    return MembershipError(f"{path}: {why}; ask the cluster's owner for your bundle "
                           "(`invoke member-add NAME` writes it)")


def read_bundle(path: str) -> dict[str, str]:
    """A bundle file, or the member folder `member-add` wrote (the one bundle in it)."""
    if Path(path).is_dir():
        found = sorted(Path(path).glob("*.rayfleet.json"))
        if len(found) != 1:
            raise _bad(path, f"a folder with {len(found)} bundles (*.rayfleet.json); give the "
                             "bundle's own path")
        path = str(found[0])
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise _bad(path, "no such file") from None
    except (OSError, ValueError, UnicodeDecodeError):
        raise _bad(path, "not a rayfleet member bundle (not JSON)") from None
    if not isinstance(data, dict) or data.get("kind") != BUNDLE_KIND:
        raise _bad(path, "not a rayfleet member bundle (no `kind: " + BUNDLE_KIND + "`)")
    for key in ("cluster", "address", "member", "ca_cert", "token"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise _bad(path, f"the bundle has no {key}")
    if not spec.NAME_PATTERN.match(data["cluster"]):
        raise _bad(path, f"cluster name {data['cluster']!r} is not a rayfleet cluster name")
    if not data["address"].startswith("https://"):
        raise _bad(path, "the bundle's address is not https://")
    if "BEGIN CERTIFICATE" not in data["ca_cert"]:
        raise _bad(path, "the bundle's ca_cert is not a PEM certificate")
    return data


def join(path: str, address: str | None = None) -> str:
    """Keep a bundle's cluster, address, CA and token; the cluster's name. `address`: where this
    member reaches the gateway instead of the bundle's (their own SSH tunnel to a Slurm head,
    https://localhost:PORT: the gateway's certificate names localhost and 127.0.0.1 there)."""
    data = read_bundle(path)
    if address is not None:
        if not re.fullmatch(r"https://[A-Za-z0-9_.:\[\]-]+:\d{1,5}", address):
            raise MembershipError(f"--address {address!r}: give https://HOST:PORT, e.g. "
                                  "https://localhost:8443 for your own SSH tunnel")
        data = {**data, "address": address}
    target = folder(data["cluster"])
    write_credentials(target, data["ca_cert"], data["token"])
    atomic_write(target / INFO_FILE, json.dumps({k: data[k] for k in ("cluster", "address",
                                                                      "member")}, indent=2))
    return data["cluster"]


def write_credentials(target: Path, ca_cert: str, token: str) -> None:
    """What Ray's own clients read, in a 0700 folder: the token (0600), the cluster's CA, and a
    CA file of the cluster's CA *and* the public CAs."""
    import certifi

    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o700)
    atomic_write(target / TOKEN_FILE, token, mode=0o600)
    atomic_write(target / CA_FILE, ca_cert, mode=0o644)
    public = _public_cas(certifi.where())
    atomic_write(target / CA_BUNDLE_FILE, ca_cert.rstrip() + "\n" + public, mode=0o644)


def _public_cas(certifi_file: str) -> str:
    """The public CAs this machine trusts: certifi's list (what `requests` uses) and the system's
    own file (what Python's ssl and curl use; it may hold a site's own CA)."""
    import ssl

    texts = [Path(certifi_file).read_text()]
    system = ssl.get_default_verify_paths().cafile
    if system and Path(system).is_file() and Path(system).resolve() != Path(certifi_file).resolve():
        texts.append(Path(system).read_text())
    return "\n".join(t.rstrip() for t in texts) + "\n"


def env_values(cluster: str) -> dict[str, str]:
    info = joined(cluster)
    if info is None:
        raise MembershipError(f"cluster {cluster!r} is not joined here; `invoke join BUNDLE` first")
    where = folder(cluster)
    return {"RAY_API_SERVER_ADDRESS": info["address"],
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(where / TOKEN_FILE),
            "REQUESTS_CA_BUNDLE": str(where / CA_BUNDLE_FILE),
            "SSL_CERT_FILE": str(where / CA_BUNDLE_FILE)}


def exports(cluster: str) -> str:
    values = env_values(cluster)
    return shell.export({k: values[k] for k in ENV_NAMES})


def endpoint(cluster: str) -> Endpoint:
    """The gateway as an Endpoint for rayfleet's own job verbs; Ray's clients in this process
    verify it against the cluster's CA (plus the public ones)."""
    values = env_values(cluster)
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        os.environ[name] = values[name]
    return Endpoint(values["RAY_API_SERVER_ADDRESS"], values["RAY_API_SERVER_ADDRESS"],
                    token_path=Path(values["RAY_AUTH_TOKEN_PATH"]))


def leave(cluster: str) -> None:
    shutil.rmtree(folder(cluster), ignore_errors=True)


def describe(cluster: str) -> dict[str, Any]:
    info = joined(cluster) or {}
    return {"cluster": cluster, "member": info.get("member"), "address": info.get("address")}
