"""The cluster's own certificate authority and the gateway's server certificate (`sharing:`).

The CA is made at the first `up` of a cluster with `sharing:` and lives on the owner's machine only
(`.rayfleet/keys/<cluster>/sharing-ca.key`, 0600): members pin its certificate (it is in their
bundle), and only the owner can sign a gateway certificate with it. The gateway's certificate names
the address(es) members reach it by; a new address gets a new certificate from the same CA, so a
member's bundle keeps verifying (its address line may need updating: `up` says so).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from infra import paths
from infra.node.files import atomic_write

CA_KEY = "sharing-ca.key"
CA_CERT = "sharing-ca.pem"
SERVER_KEY = "gateway.key"
SERVER_CERT = "gateway.pem"
#: A class runs for a term or two; the gateway's certificate is renewed at any `up` before then.
CA_DAYS = 5 * 365
SERVER_DAYS = 398


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


def ensure_ca(cluster: str) -> Path:
    """The cluster CA's certificate, made (with its key, 0600) on first use; the key never leaves."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = paths.keys_dir(cluster)
    cert_path, key_path = folder / CA_CERT, folder / CA_KEY
    if cert_path.exists() and key_path.exists():
        key_path.chmod(0o600)
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


def ensure_server_cert(cluster: str, addresses: list[str]) -> tuple[Path, Path]:
    """The gateway's certificate and key for `addresses` (IPs or DNS names), signed by the
    cluster's CA; reused while it names the same addresses and has a month left."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert_file = ensure_ca(cluster)
    cert_path, key_path = server_paths(cluster)
    wanted = sorted(set(addresses))
    if server_names(cert_path) == wanted and key_path.exists():
        current = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if current.not_valid_after_utc - _now() > dt.timedelta(days=30):
            return cert_path, key_path
    ca_cert = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
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
