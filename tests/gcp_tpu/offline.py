"""An offline Google for Ray's own GCP node provider, on the test bed.

Ray has no endpoint knob for Google (see ../shared/autoscaling.md, "GCP offline"), so the real names
are redirected instead: the test bed's shared hosts file maps `compute.googleapis.com`, `serviceusage...`,
`tpu.googleapis.com`, `iam...`, `cloudresourcemanager...`, `oauth2...` and
`metadata.google.internal` to the client namespace, where the fake listens on 443 (TLS, with a
certificate from a CA made for this run) and 80 (the metadata server). Clients trust that CA through
`HTTPLIB2_CA_CERTS`: every request of Ray's clients, google-auth's token refreshes and the TPU
discovery fetch go through httplib2. Nothing here listens outside the test bed's namespaces.

The VMs and TPU hosts the fake creates are test-bed hosts (`BedMachines`): their addresses are
the hosts' addresses, the SSH key in a node's metadata is authorised on them, and deleting or
preempting a node ends every process on its hosts (only sshd stays, like a machine's image).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import secrets
import shlex
import socket
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.fake_identity import TOKEN_URI, Identity
from tests.testbed import Testbed
from tests.testbed.hosts import LIVE_PROCESSES, Host, ray_bin_dir
from tests.waiting import wait_while

GOOGLE_NAMES = ["compute.googleapis.com", "tpu.googleapis.com", "serviceusage.googleapis.com",
                "iam.googleapis.com",
                "cloudresourcemanager.googleapis.com", "oauth2.googleapis.com",
                "www.googleapis.com", "metadata.google.internal"]
_CLONE_NEWNET = 0x40000000


class TestCa:
    """A certificate authority for one run, and the fake's certificate for every Google name."""

    __test__ = False

    def __init__(self, folder: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        folder.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                f"rayfleet test CA {secrets.token_hex(4)}")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                           False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_NAMES[0])]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in GOOGLE_NAMES]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_path = folder / "test-ca.pem"
        self.ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_path = folder / "google.pem"
        self.cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_path = folder / "google.key"
        fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))

    def env(self) -> dict[str, str]:
        """What every client of the offline Google needs: trust in this CA only for httplib2 (the
        rest of the machine's trust store is untouched), and the metadata server by name."""
        return {"HTTPLIB2_CA_CERTS": str(self.ca_path),
                "GCE_METADATA_IP": "metadata.google.internal",
                "GCE_METADATA_HOST": "metadata.google.internal"}


def write_service_account_key(path: Path, identity: Identity, email: str) -> Path:
    """A fresh RSA service-account key whose public half the fake's token endpoint knows."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_id = secrets.token_hex(20)
    identity.register_key(key_id, key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    info = {"type": "service_account", "project_id": identity.project, "private_key_id": key_id,
            "private_key": key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()).decode(),
            "client_email": email, "client_id": "1", "token_uri": TOKEN_URI,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "universe_domain": "googleapis.com"}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    return path


def socket_in_netns(netns_path: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket created inside another network namespace.

    setns(CLONE_NEWNET) affects only the calling thread, so a short-lived thread enters the
    namespace, creates and binds the socket (which keeps that namespace for its whole life) and
    exits; the rest of the process never leaves the root namespace.
    """
    result: dict[str, Any] = {}

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(netns_path, os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {netns_path}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            result["socket"] = sock
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    sock: socket.socket = result["socket"]
    return sock


def fresh_image(host: Host) -> None:
    """Make a host's login shell look like a cloud image's: no pyenv/conda init from this
    machine's ~/.bashrc (its `pyenv rehash` takes a lock that an SSH session killed by Ray's
    "waiting for SSH" probe leaves behind, stalling every later login), just the tests' Ray on
    PATH, as a VM image with Ray preinstalled would have."""
    path_line = f"export PATH={ray_bin_dir()}:$PATH"
    host.run(f"printf '%s\\n' {shlex.quote(path_line)} > /root/.bashrc; "
             "rm -f /root/.pyenv/shims/.pyenv-shim", check=True, timeout=30)


#: What of a node's own may still run on a host: Ray, its workers and dashboard, our daemons.
NODE_PROCESSES = (f"{LIVE_PROCESSES} | grep -E '[r]aylet|[g]cs_server|[r]ay::|[d]ashboard|"
                  "[i]nfra[.]node|[p]rometheus|[m]lflow' || true")


class BedMachines:
    """The fake's machines are test-bed hosts, handed out in order and given back when deleted."""

    def __init__(self, bed: Testbed, hosts: list[Host]) -> None:
        self.bed = bed
        self.free = list(hosts)
        self.used: dict[str, list[Host]] = {}
        self.attributes: dict[str, dict[str, str]] = {}
        self.lock = threading.Lock()
        self.shutdowns: list[threading.Thread] = []

    def boot(self, name: str, hosts: int, ssh_keys: str,
             attributes: dict[str, str]) -> list[str] | None:
        with self.lock:
            if len(self.free) < hosts:
                return None
            taken, self.free = self.free[:hosts], self.free[hosts:]
            self.used[name] = taken
            for host in taken:
                self.attributes[host.ip] = dict(attributes)
        for host in taken:
            fresh_image(host)
        # Google's guest agent installs `user:key` lines of the node's metadata for that user.
        for line in ssh_keys.splitlines():
            user, _, key = line.partition(":")
            if user == taken[0].ssh_user and key.strip():
                self.bed.authorize_key(key.strip())
        return [h.ip for h in taken]

    def host_of(self, name: str) -> list[Host]:
        with self.lock:
            return list(self.used.get(name, []))

    def shutdown(self, name: str) -> None:
        with self.lock:
            hosts = self.used.pop(name, [])

        def power_off() -> None:
            for host in hosts:
                # Everything but the host's init and sshd ends, as when the VM goes away; the
                # files Ray and the installer left are removed so the next node starts fresh.
                host.run(r"""
listener=$(pgrep -o -x sshd || echo 0)
for p in $(ps -eo pid=); do
  case "$p" in 1|"$$"|"$listener") ;; *) kill -9 "$p" 2>/dev/null ;; esac
done
rm -rf /root/rayfleet /root/ray_bootstrap_config.yaml /root/ray_bootstrap_key.pem \
  /root/.rayfleet /tmp/ray/* /dev/shm/* 2>/dev/null
# The node setup's users and firewall (users.sh, guard.sh) went with the VM's disk too.
for user in rayfleet-ray rayfleet-scaler; do userdel -r "$user" >/dev/null 2>&1; done
nft delete table inet rayfleet_guard 2>/dev/null
true""", timeout=60)
                # `kill -9` returns before a big process has finished exiting (a CI run at load
                # 8 found Ray's GCS still there, `R [gcs_server]`, after the head deleted its
                # own VM): a VM that went away runs nothing, and the host's next node meets none.
                wait_while(lambda machine=host: machine.run(NODE_PROCESSES).stdout.strip(),
                           "the powered-off machine's processes to exit", timeout=30, interval=0.2)
            with self.lock:
                for host in hosts:
                    self.attributes.pop(host.ip, None)
                self.free.extend(hosts)

        thread = threading.Thread(target=power_off, daemon=True)
        # Started before it is listed, both under the lock: `wait_idle` runs on another thread and
        # joins what it finds listed, and joining a thread not yet started raises.
        with self.lock:
            thread.start()
            self.shutdowns.append(thread)

    def wait_idle(self, timeout: float = 60) -> None:
        with self.lock:
            started = list(self.shutdowns)
        for thread in started:
            thread.join(timeout)


class OfflineGoogle:
    """The fake Compute/TPU APIs, identity services and metadata server, served in the test bed."""

    def __init__(self, bed: Testbed, ca: TestCa, fake: FakeGcp, machines: BedMachines) -> None:
        self.bed = bed
        self.ca = ca
        self.fake = fake
        self.identity = Identity(fake.project)
        self.machines = machines
        fake.machines = machines
        self.ip = bed.client.ip
        self._servers: list[ThreadingHTTPServer] = []
        #: (host header, method, path, caller) of every request, for assertions.
        self.log: list[tuple[str, str, str, str]] = []
        self._discovery = _bundled("tpu.v2alpha1.json")

    def start(self) -> OfflineGoogle:
        self.bed.add_host_names(self.ip, GOOGLE_NAMES)
        netns = f"/run/netns/{self.bed.client.netns}"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca.cert_path, self.ca.key_path)
        self._serve(socket_in_netns(netns, (self.ip, 443)), context)
        self._serve(socket_in_netns(netns, (self.ip, 80)), None)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self.machines.wait_idle()

    def resolves_here(self, node_argv: list[str]) -> dict[str, str]:
        """What each Google name resolves to inside a node (argv prefix entering it)."""
        import subprocess

        script = 'for n in "$@"; do echo "$n $(getent ahostsv4 "$n" | head -1 | cut -d" " -f1)"; done'
        done = subprocess.run([*node_argv, "bash", "-c", script, "-", *GOOGLE_NAMES],
                              capture_output=True, text=True, timeout=30, check=False)
        found: dict[str, str] = {}
        for line in done.stdout.splitlines():
            name, _, ip = line.partition(" ")
            if ip.strip():
                found[name] = ip.strip()
        return found

    # --- serving ---------------------------------------------------------------------------------

    def _serve(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        google = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                google._dispatch(self, tls=context is not None)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[Any, Any]:
                conn, addr = self.socket.accept()
                if context is not None:
                    # The handshake runs in the handler's thread, on first read.
                    conn = context.wrap_socket(conn, server_side=True,
                                               do_handshake_on_connect=False)
                return conn, addr

        server = Server((self.ip, 0), Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.server_address = sock.getsockname()
        threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
        self._servers.append(server)

    def _dispatch(self, handler: BaseHTTPRequestHandler, tls: bool) -> None:
        host = (handler.headers.get("Host") or "").split(":")[0]
        parsed = urllib.parse.urlsplit(handler.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        caller = handler.client_address[0]
        method = handler.command
        self.log.append((host, method, parsed.path, caller))
        headers: dict[str, str] = {}
        if not tls:
            if host != "metadata.google.internal":
                status, payload = 404, "not found"
            else:
                attributes = self.machines.attributes.get(caller, {})
                status, payload = self.identity.metadata(
                    caller, self.fake.machine_at(caller), attributes, parsed.path, query,
                    handler.headers.get("Metadata-Flavor"))
            headers["Metadata-Flavor"] = "Google"
        elif host == "oauth2.googleapis.com" and parsed.path == "/token" and method == "POST":
            status, payload = self.identity.token(raw.decode())
        elif host == "tpu.googleapis.com" and parsed.path == "/$discovery/rest":
            # Ray's discovery URL has no {version} placeholder, so no version is asked for.
            status, payload = (200, self._discovery) if query.get("version") in (
                None, "v2alpha", "v2alpha1") else (
                404, {"error": {"code": 404, "message": "Discovery document not found"}})
        elif not self.identity.authorized(handler.headers.get("Authorization")):
            status, payload = self.identity.unauthenticated()
        else:
            body = json.loads(raw) if raw else None
            if host == "iam.googleapis.com":
                status, payload = self.identity.iam(method, parsed.path, body)
            elif host == "cloudresourcemanager.googleapis.com":
                status, payload = self.identity.crm(method, parsed.path, body)
            elif host in ("compute.googleapis.com", "tpu.googleapis.com",
                          "serviceusage.googleapis.com"):
                with self.fake.lock:
                    self.fake.requests.append({"method": method, "path": parsed.path,
                                               "query": query, "body": body, "headers": {}})
                    status, payload, headers = self.fake._answer(method, parsed.path, query, body)
            else:
                status, payload = 404, {"error": {"code": 404, "message": f"no API at {host}"}}
        if isinstance(payload, str):
            data, kind = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, kind = json.dumps(payload).encode(), "application/json; charset=UTF-8"
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)


def _bundled(name: str) -> dict[str, Any]:
    import googleapiclient

    path = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents" / name
    document: dict[str, Any] = json.loads(path.read_text())
    return document
