"""The cluster's own certificate authority and the gateway's server certificate (`sharing:`).

The CA is made at the first `up` of a cluster with `sharing:` and lives on the owner's machine only
(`.rayfleet/keys/<cluster>/sharing-ca.key`, 0600): members pin its certificate (it is in their
bundle), and only the owner can sign a gateway certificate with it. The gateway's certificate names
the address(es) members reach it by; a new address gets a new certificate from the same CA, so a
member's bundle keeps verifying (its address line may need updating: `up` says so).

Members trust the CA for every HTTPS connection of a shell that points REQUESTS_CA_BUNDLE or
SSL_CERT_FILE at their bundle's CA file, so the CA carries a critical NameConstraints extension:
it may sign for `localhost`, the spec's `sharing.hostname` and the IPv4 ranges its provider's
heads are reached in (`Capabilities.sharing_ca_ranges`), and for no other DNS name and no IPv6
address. Whoever got its key could not pass off a certificate for any public site by name. A CA
made before it had constraints, or whose constraints leave out a hostname set since, is made
again at the next `up` while the cluster has no members; otherwise `up` warns (no constraints)
or stops in one line (a name it may not sign for).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from infra.core import paths, ui
from infra.core.errors import RayfleetError
from infra.node.files import atomic_write

if TYPE_CHECKING:
    from cryptography import x509

CA_KEY = "sharing-ca.key"
CA_CERT = "sharing-ca.pem"
SERVER_KEY = "gateway.key"
SERVER_CERT = "gateway.pem"
#: A class runs for a term or two; the gateway's certificate is renewed at any `up` before then.
CA_DAYS = 5 * 365
SERVER_DAYS = 398
#: The only DNS name a gateway certificate names (a member's own tunnel, Slurm); RFC 6761 keeps
#: it, and every name under it, on the member's own machine.
DNS_NAMES = ("localhost",)
#: Where a CA made without `sharing_ca_ranges` may sign: any IPv4 address (a cloud head's public
#: one changes with every new head), never IPv6 (the gateway listens on IPv4 only).
ANY_IPV4 = ("0.0.0.0/0",)


class CertificateError(RayfleetError):
    """The gateway's certificate cannot name an address its cluster's CA may not sign for."""


def ca_cert_path(cluster: str) -> Path:
    return paths.keys_dir(cluster) / CA_CERT


def server_paths(cluster: str) -> tuple[Path, Path]:
    """(certificate, private key) of the cluster's gateway, on this machine."""
    folder = paths.keys_dir(cluster)
    return folder / SERVER_CERT, folder / SERVER_KEY


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _private_dir(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)


def name_constraints(ranges: Sequence[str], dns: Sequence[str] = ()) -> x509.NameConstraints:
    """What a cluster's CA may sign: DNS_NAMES, the DNS names `dns` (the spec's
    `sharing.hostname`) and the IPv4 `ranges`, nothing else by name or address (a type with
    permitted subtrees admits only names inside them)."""
    from cryptography import x509

    permitted: list[x509.GeneralName] = [x509.DNSName(name)
                                         for name in dict.fromkeys([*DNS_NAMES, *dns])]
    for text in ranges:
        network = ipaddress.ip_network(text)
        if network.version != 4:
            raise ValueError(f"{text}: the gateway listens on IPv4 only")
        permitted.append(x509.IPAddress(network))
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None)


def constraints_of(cert_path: Path) -> x509.NameConstraints | None:
    """The CA certificate's name constraints (None: it has none, made before they existed)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        return cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None


def ensure_ca(cluster: str, ranges: Sequence[str] = ANY_IPV4, replaceable: bool = False,
              dns: Sequence[str] = (), needed: Sequence[str] = ()) -> Path:
    """The cluster CA's certificate, made (with its key, 0600) on first use; the key never leaves.

    `ranges`, `dns`: what the CA may sign for (name_constraints). `replaceable`: no bundle names
    this CA (the cluster has no members), so one without name constraints, or whose constraints
    leave out one of the addresses `needed`, is made again; otherwise it stays (every member
    would need a new bundle), with a warning when it has no constraints."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = paths.keys_dir(cluster)
    cert_path, key_path = folder / CA_CERT, folder / CA_KEY
    if cert_path.exists() and key_path.exists():
        key_path.chmod(0o600)
        constraints = constraints_of(cert_path)
        if constraints is not None and (not replaceable
                                        or all(permits(constraints, a) for a in needed)):
            return cert_path
        if constraints is None and not replaceable:
            ui.warn(f"sharing: the cluster's CA ({cert_path}) has no name constraints: whoever "
                    "got its key could make certificates that members' shells trust for any "
                    "site; to replace it, remove every member (`invoke member-remove NAME`), run "
                    "`invoke up`, then add them again (docs/concepts/sharing.md)")
            return cert_path
    _private_dir(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rayfleet {cluster} CA")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(name_constraints(ranges, dns), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first: a CA certificate without its key would be a CA nobody can sign with.
    atomic_write(key_path, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), mode=0o600)
    atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return cert_path


def server_names(cert_path: Path) -> list[str]:
    """The addresses a gateway certificate names (empty when there is none)."""
    from cryptography import x509

    if not cert_path.exists():
        return []
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sorted([str(ip) for ip in alt.get_values_for_type(x509.IPAddress)]
                  + alt.get_values_for_type(x509.DNSName))


def permits(constraints: x509.NameConstraints | None, address: str) -> bool:
    """Whether a CA with `constraints` may sign for `address` (an IP or a DNS name)."""
    from cryptography import x509

    if constraints is None:
        return True
    allowed = constraints.permitted_subtrees or []
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        name = address.lower().rstrip(".")
        return any(name == n.value or name.endswith("." + n.value)
                   for n in allowed if isinstance(n, x509.DNSName))
    return any(isinstance(n.value, (ipaddress.IPv4Network, ipaddress.IPv6Network))
               and ip.version == n.value.version and ip in n.value
               for n in allowed if isinstance(n, x509.IPAddress))


def ensure_server_cert(cluster: str, addresses: list[str], ranges: Sequence[str] = ANY_IPV4,
                       replaceable: bool = False, dns: Sequence[str] = ()) -> tuple[Path, Path]:
    """The gateway's certificate and key for `addresses` (IPs or DNS names), signed by the
    cluster's CA (ensure_ca: `ranges`, `dns`, `replaceable`); reused while it names the same
    addresses, was signed by that CA and has a month left."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert_file = ensure_ca(cluster, ranges, replaceable, dns, addresses)
    constraints = constraints_of(ca_cert_file)
    outside = sorted(a for a in set(addresses) if not permits(constraints, a))
    if outside:
        assert constraints is not None
        signs = ", ".join(str(n.value) for n in constraints.permitted_subtrees or [])
        raise CertificateError(
            f"sharing: the cluster's CA may not sign for {', '.join(outside)} (only for "
            f"{signs}), and members' bundles hold it: remove every member (`invoke member-remove "
            "NAME`), run `invoke up` (a new CA), then add them again; or reach the head by a name "
            "or address it signs for (docs/concepts/sharing.md)")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
    cert_path, key_path = server_paths(cluster)
    wanted = sorted(set(addresses))
    if server_names(cert_path) == wanted and key_path.exists():
        current = x509.load_pem_x509_certificate(cert_path.read_bytes())
        # A CA made again (it had no name constraints) signs the gateway's certificate again.
        if current.not_valid_after_utc - _now() > dt.timedelta(days=30) \
                and _signed_by(current, ca_cert):
            return cert_path, key_path
    ca_key = serialization.load_pem_private_key((ca_cert_file.parent / CA_KEY).read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for address in wanted:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            alt.append(x509.DNSName(address))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rayfleet {cluster} gateway")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    atomic_write(key_path, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), mode=0o600)
    atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return cert_path, key_path


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
