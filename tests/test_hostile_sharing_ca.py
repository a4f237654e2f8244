"""The cluster's sharing CA against its own key in the wrong hands (issue 35): members trust the
CA for every HTTPS connection of a shell that points REQUESTS_CA_BUNDLE or SSL_CERT_FILE at their
bundle's CA file, so a certificate the CA's key signs for any other site must fail verification.

Every verification here is a real TLS handshake through Python's ssl module (what Ray's clients,
requests and aiohttp, verify with), over memory buffers: no socket, no network."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from infra.core.sharing import certs as sharing_certs

CLUSTER = "classroom"
HEAD = "203.0.113.7"


def _handshake(ca_file: Path, cert_pem: bytes, key_pem: bytes, hostname: str,
               tmp_path: Path) -> str:
    """"ok", or why a client that trusts `ca_file` refused a server presenting `cert_pem` for
    `hostname` (Python's ssl: OpenSSL's chain, name-constraint and hostname checks)."""
    chain, key = tmp_path / "served.pem", tmp_path / "served.key"
    chain.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(chain, key)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end, out, into in (("client", client, c_out, s_in),
                                     ("server", server, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLCertVerificationError as refused:
                    return str(refused.verify_message)
                except ssl.SSLError:
                    if name == "server":  # the client's alert after it refused
                        done[name] = True
                    else:
                        raise
            into.write(out.read())
        if all(done.values()):
            return "ok"
    raise AssertionError("the handshake never finished")


def _forge(ca_dir: Path, *, dns: list[str] = (), ips: list[str] = (),  # type: ignore[assignment]
           common_name: str = "rayfleet forged") -> tuple[bytes, bytes]:
    """A server certificate signed with the cluster CA's key, as whoever stole it would make."""
    ca_cert = x509.load_pem_x509_certificate((ca_dir / sharing_certs.CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / sharing_certs.CA_KEY).read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    alt = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _served(cluster: str) -> tuple[bytes, bytes]:
    cert, key = sharing_certs.server_paths(cluster)
    return cert.read_bytes(), key.read_bytes()


@pytest.mark.usefixtures("rf_home")
def test_the_gateways_certificate_verifies_and_a_stolen_ca_key_mints_nothing_else(
        tmp_path: Path) -> None:
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD])
    ca = sharing_certs.ca_cert_path(CLUSTER)
    assert _handshake(ca, *_served(CLUSTER), HEAD, tmp_path) == "ok"
    # The constraint is critical: a client that does not understand it must refuse the CA.
    extension = x509.load_pem_x509_certificate(ca.read_bytes()).extensions \
        .get_extension_for_class(x509.NameConstraints)
    assert extension.critical
    # Any other head's IPv4 address (a cloud head after autodown) is signable: it verifies.
    assert _handshake(ca, *_forge(ca.parent, ips=["198.51.100.9"]), "198.51.100.9", tmp_path) == "ok"
    assert _handshake(ca, *_forge(ca.parent, dns=["localhost"]), "localhost", tmp_path) == "ok"
    # Whatever a public site is reached by: names, IPv6, a name in the subject alone.
    for hostname, forged in [
            ("github.com", _forge(ca.parent, dns=["github.com"])),
            ("pypi.org", _forge(ca.parent, dns=["*.org", "pypi.org"])),
            ("localhost.attacker.example", _forge(ca.parent, dns=["localhost.attacker.example"])),
            ("2001:db8::1", _forge(ca.parent, ips=["2001:db8::1"])),
            ("github.com", _forge(ca.parent, common_name="github.com"))]:
        refused = _handshake(ca, *forged, hostname, tmp_path)
        assert refused == "permitted subtree violation", (hostname, refused)


@pytest.mark.usefixtures("rf_home")
def test_a_loopback_heads_ca_signs_for_loopback_only(tmp_path: Path) -> None:
    """The local provider's gateway listens on 127.0.0.1: its CA signs no other address."""
    sharing_certs.ensure_server_cert(CLUSTER, ["127.0.0.1"], ("127.0.0.0/8",))
    ca = sharing_certs.ca_cert_path(CLUSTER)
    assert _handshake(ca, *_served(CLUSTER), "127.0.0.1", tmp_path) == "ok"
    refused = _handshake(ca, *_forge(ca.parent, ips=["1.1.1.1"]), "1.1.1.1", tmp_path)
    assert "permitted subtree violation" in refused, refused
    with pytest.raises(sharing_certs.CertificateError, match=r"may not sign for 198\.51\.100\.9"):
        sharing_certs.ensure_server_cert(CLUSTER, ["198.51.100.9"], ("127.0.0.0/8",))


@pytest.mark.usefixtures("rf_home")
def test_a_name_outside_the_cas_constraints_is_refused_in_one_line() -> None:
    with pytest.raises(sharing_certs.CertificateError) as refused:
        sharing_certs.ensure_server_cert(CLUSTER, [HEAD, "node07.hpc.example.edu", "localhost"])
    assert "node07.hpc.example.edu" in str(refused.value) and "\n" not in str(refused.value)
    assert "localhost" not in str(refused.value).split("(", 1)[0]


def _old_ca(cluster: str) -> Path:
    """A CA as rayfleet made them before name constraints, and its gateway certificate."""
    folder = sharing_certs.server_paths(cluster)[0].parent
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rayfleet {cluster} CA")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    (folder / sharing_certs.CA_KEY).write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (folder / sharing_certs.CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return folder / sharing_certs.CA_CERT


@pytest.mark.usefixtures("rf_home")
def test_an_old_ca_without_constraints_is_replaced_only_while_no_member_holds_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _old_ca(CLUSTER)
    before = old.read_bytes()
    # Members hold bundles naming it: it stays (they would all need new bundles), with a warning.
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD], replaceable=False)
    assert old.read_bytes() == before
    assert sharing_certs.constraints_of(old) is None
    warned = capsys.readouterr().err
    assert "has no name constraints" in " ".join(warned.split()), warned
    assert "member-remove" in warned
    assert _handshake(old, *_served(CLUSTER), HEAD, tmp_path) == "ok"
    # No member: the next `up` makes it again, with constraints, and a certificate from it.
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD], replaceable=True)
    assert old.read_bytes() != before and sharing_certs.constraints_of(old) is not None
    assert _handshake(old, *_served(CLUSTER), HEAD, tmp_path) == "ok"
    refused = _handshake(old, *_forge(old.parent, dns=["github.com"]), "github.com", tmp_path)
    assert "permitted subtree violation" in refused, refused


@pytest.mark.usefixtures("rf_home")
def test_the_spec_hostname_is_the_one_dns_name_besides_localhost(tmp_path: Path) -> None:
    """`sharing.hostname`: the CA signs for that name (and names under it, which only its owner's
    DNS can point anywhere) and for no other."""
    name = "ray.class.example.edu"
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD, name], dns=(name,))
    ca = sharing_certs.ca_cert_path(CLUSTER)
    assert _handshake(ca, *_served(CLUSTER), name, tmp_path) == "ok"
    refused = _handshake(ca, *_forge(ca.parent, dns=["example.edu"]), "example.edu", tmp_path)
    assert refused == "permitted subtree violation", refused


@pytest.mark.usefixtures("rf_home")
def test_a_hostname_added_later_gets_a_new_ca_only_while_no_member_holds_the_old(
        tmp_path: Path) -> None:
    name = "ray.class.example.edu"
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD])
    ca = sharing_certs.ca_cert_path(CLUSTER)
    first = ca.read_bytes()
    # Members hold the first CA: one line saying what to do, nothing changed.
    with pytest.raises(sharing_certs.CertificateError) as refused:
        sharing_certs.ensure_server_cert(CLUSTER, [HEAD, name], dns=(name,), replaceable=False)
    assert name in str(refused.value) and "member-remove" in str(refused.value)
    assert "\n" not in str(refused.value) and ca.read_bytes() == first
    # No member: a new CA that signs for it.
    sharing_certs.ensure_server_cert(CLUSTER, [HEAD, name], dns=(name,), replaceable=True)
    assert ca.read_bytes() != first
    assert _handshake(ca, *_served(CLUSTER), name, tmp_path) == "ok"
