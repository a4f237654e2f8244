"""Which Google credentials rayfleet's own API calls (api.py) use: the spec's key file, else
application-default credentials, found without probing a metadata server off Google's VMs.

Callers import these from api.py, which re-exports them. Parsed here, never refreshed: the first
call (api.py `Gcp._call`) says, in one line, when Google refuses them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from infra.node.gcp_tpu.errors import GcpCredentialsError, _one_line

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


@dataclass(frozen=True)
class Credentials:
    """Credentials we found, and how `ray up` must be told about them."""

    #: google.auth credentials object (never printed, never stored).
    credentials: Any
    #: Human description for messages, e.g. "application-default credentials".
    source: str
    #: A key file to hand to `ray up` as GOOGLE_APPLICATION_CREDENTIALS (a path, never contents).
    file: str | None


def find_credentials(credentials_file: str | None, spec_source: str) -> Credentials:
    """The spec's key file, else application-default credentials; GcpCredentialsError if none.

    Application-default means, in google-auth's order: GOOGLE_APPLICATION_CREDENTIALS, gcloud's
    ADC file, the metadata server of a GCE VM. google-auth is asked only when one of those can
    exist: off GCE it would probe 169.254.169.254 with retries (seconds of waiting, and a packet
    to an address that is not ours). Files are parsed, never refreshed here.
    """
    import google.auth
    from google.auth import exceptions

    if credentials_file:
        found = _load_key_file(credentials_file, spec_source)
        return Credentials(found, f"credentials_file {credentials_file}", credentials_file)
    named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None
    if named or os.path.isfile(_gcloud_adc_file()) or _on_gce():
        try:
            found, _ = google.auth.default(scopes=SCOPES)
        except (exceptions.GoogleAuthError, ValueError, OSError) as exc:
            raise GcpCredentialsError(
                f"gcp-tpu: application-default credentials are unusable ({_one_line(str(exc))}); "
                "run `gcloud auth application-default login` or set credentials_file: in "
                f"{spec_source}") from None
        # `ray up` finds them the same way; a named key file is passed on explicitly anyway.
        return Credentials(found, "application-default credentials", named)
    raise GcpCredentialsError(
        "gcp-tpu: no Google credentials found; run `gcloud auth application-default login` or "
        f"set credentials_file: in {spec_source}")


def _load_key_file(path: str, spec_source: str) -> Any:
    """A service-account (or authorized-user) key file; other credential types are refused."""
    from google.auth import exceptions
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    def bad(reason: str) -> GcpCredentialsError:
        return GcpCredentialsError(
            f"gcp-tpu: credentials_file {path} {reason}; download a service-account key (JSON) "
            f"or remove credentials_file: from {spec_source} to use application-default "
            "credentials")

    try:
        with open(path) as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        raise bad("is not a readable JSON key file") from None
    kind = info.get("type") if isinstance(info, dict) else None
    try:
        if kind == "service_account":
            return service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
        if kind == "authorized_user":
            return user_credentials.Credentials.from_authorized_user_info(info, scopes=SCOPES)
    except (exceptions.GoogleAuthError, ValueError) as exc:
        raise bad(f"is not a usable {kind} key ({_one_line(str(exc))})") from None
    raise bad(f"holds {kind!r} credentials, not a service-account key")


def _gcloud_adc_file() -> str:
    folder = os.environ.get("CLOUDSDK_CONFIG") or os.path.join(
        os.path.expanduser("~"), ".config", "gcloud")
    return os.path.join(folder, "application_default_credentials.json")


def _on_gce() -> bool:
    """Where google-auth would ask a metadata server: a Google VM (its DMI product name), or a
    machine whose environment names one (google-auth's GCE_METADATA_HOST / GCE_METADATA_IP). Not
    with NO_GCE_CHECK=true, which stops google-auth from looking. On a head, the autodown action
    thus uses the VM's service account, as Ray's autoscaler beside it does."""
    if os.environ.get("NO_GCE_CHECK") == "true":
        return False
    if os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP"):
        return True
    try:
        with open("/sys/class/dmi/id/product_name") as handle:
            return handle.read().strip().startswith("Google")
    except OSError:
        return False

