"""Google's identity side, faked: the OAuth token endpoint, IAM service accounts, Cloud Resource
Manager (project + IAM policy) and the GCE metadata server.

Faithful where Ray and google-auth depend on it: the token endpoint verifies the JWT assertion of a
service-account key against the public key registered for it (audience = token_uri), answers
`invalid_grant` for revoked keys (google-auth then raises RefreshError), and every API request must
carry a token it issued (401 otherwise, which google-auth answers with one refresh). The metadata
server answers by the caller's address: each VM or TPU host sees its own service account, project and
TPU attributes, and anything that is not one of the fake's machines gets 404s.
"""

from __future__ import annotations

import secrets
import threading
import time
import urllib.parse
from typing import Any

from tests.gcp_tpu.fake_errors import grpc_error

TOKEN_URI = "https://oauth2.googleapis.com/token"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def _unauthenticated() -> dict[str, Any]:
    return grpc_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. "
                      "Expected OAuth 2 access token, login cookie or other valid authentication "
                      "credential.")


class Identity:
    """Tokens, service accounts, the project and its IAM policy."""

    def __init__(self, project: str, project_number: str = "123456789") -> None:
        self.project = project
        self.project_number = project_number
        self.lock = threading.RLock()
        #: Public keys (PEM) of service-account keys, by private_key_id.
        self.keys: dict[str, str] = {}
        #: Keys whose grants are refused (revoked or deleted in the console).
        self.revoked: set[str] = set()
        #: access token -> (service-account email, expiry time).
        self.tokens: dict[str, tuple[str, float]] = {}
        self.token_lifetime = 3599
        self.service_accounts: dict[str, dict[str, Any]] = {}
        self.policy: dict[str, Any] = {"version": 1, "etag": "BwYAAAAAAAA=", "bindings": [
            {"role": "roles/owner", "members": ["user:teacher@example.edu"]}]}
        #: Every metadata request as (caller ip, path).
        self.metadata_requests: list[tuple[str, str]] = []

    # --- OAuth ---------------------------------------------------------------------------------

    def register_key(self, key_id: str, public_pem: str) -> None:
        with self.lock:
            self.keys[key_id] = public_pem

    def issue(self, email: str) -> dict[str, Any]:
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        with self.lock:
            self.tokens[token] = (email, time.time() + self.token_lifetime)
        return {"access_token": token, "expires_in": self.token_lifetime, "token_type": "Bearer"}

    def token(self, form: str) -> tuple[int, dict[str, Any]]:
        """POST https://oauth2.googleapis.com/token with a JWT-bearer grant."""
        from google.auth import exceptions, jwt

        fields = {k: v[0] for k, v in urllib.parse.parse_qs(form).items()}
        if fields.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, {"error": "unsupported_grant_type",
                         "error_description": "Invalid grant_type: " + fields.get("grant_type", "")}
        assertion = fields.get("assertion", "")
        try:
            header = jwt.decode_header(assertion)
            key_id = str(header.get("kid", ""))
            with self.lock:
                public, revoked = self.keys.get(key_id), key_id in self.revoked
            if public is None or revoked:
                return 400, {"error": "invalid_grant",
                             "error_description": "Invalid JWT Signature."}
            claims = jwt.decode(assertion, certs={key_id: public}, audience=TOKEN_URI)
        except (ValueError, exceptions.GoogleAuthError) as exc:
            return 400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {exc}"}
        return 200, self.issue(str(claims.get("iss")))

    def authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        with self.lock:
            found = self.tokens.get(header.removeprefix("Bearer "))
        return found is not None and found[1] > time.time()

    def unauthenticated(self) -> tuple[int, dict[str, Any]]:
        return 401, _unauthenticated()

    # --- IAM -------------------------------------------------------------------------------------

    def iam(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        # v1/projects/{p}/serviceAccounts[/{email}]
        if parts[:2] != ["v1", "projects"] or len(parts) < 4 or parts[3] != "serviceAccounts":
            return 404, grpc_error(404, "NOT_FOUND", f"Unknown path {path}")
        if parts[2] not in (self.project, "-"):
            return 403, grpc_error(403, "PERMISSION_DENIED", "Permission 'iam.serviceAccounts."
                                   "get' denied on resource (or it may not exist).")
        with self.lock:
            if len(parts) == 5 and method == "GET":
                account = self.service_accounts.get(urllib.parse.unquote(parts[4]))
                if account is None:
                    return 404, grpc_error(404, "NOT_FOUND", "Unknown service account")
                return 200, account
            if len(parts) == 4 and method == "POST":
                account_id = str((body or {}).get("accountId", ""))
                email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
                if email in self.service_accounts:
                    return 409, grpc_error(409, "ALREADY_EXISTS", f"Service account {account_id} "
                                           "already exists within project")
                given = (body or {}).get("serviceAccount") or {}
                account = {"name": f"projects/{self.project}/serviceAccounts/{email}",
                           "projectId": self.project, "uniqueId": str(10**20 + len(self.keys)),
                           "email": email, "displayName": given.get("displayName", ""),
                           "description": given.get("description", ""),
                           "etag": "MDEwMjE5MjA=", "oauth2ClientId": "1"}
                self.service_accounts[email] = account
                return 200, account
        return 400, grpc_error(400, "INVALID_ARGUMENT", f"unsupported {method} {path}")

    # --- Cloud Resource Manager --------------------------------------------------------------------

    def crm(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        rest = path.strip("/").removeprefix("v1/projects/")
        project, _, verb = rest.partition(":")
        if project != self.project:
            # CRM says 403 both for a project that does not exist and one we may not see.
            return 403, grpc_error(403, "PERMISSION_DENIED", "The caller does not have permission")
        with self.lock:
            if not verb and method == "GET":
                return 200, {"projectNumber": self.project_number, "projectId": self.project,
                             "lifecycleState": "ACTIVE", "name": self.project,
                             "createTime": "2025-09-01T00:00:00.000Z"}
            if verb == "getIamPolicy" and method == "POST":
                return 200, _copy(self.policy)
            if verb == "setIamPolicy" and method == "POST":
                policy = (body or {}).get("policy") or {}
                if policy.get("etag") not in (None, self.policy["etag"]):
                    return 409, grpc_error(409, "ABORTED", "There were concurrent policy changes. "
                                           "Please retry the whole read-modify-write with exponential "
                                           "backoff.")
                self.policy = {**_copy(policy), "etag": f"BwY{secrets.token_hex(4)}="}
                return 200, _copy(self.policy)
        return 400, grpc_error(400, "INVALID_ARGUMENT", f"unsupported {method} {path}")

    # --- the metadata server ----------------------------------------------------------------------

    def metadata(self, caller: str, machine: tuple[str, dict[str, Any], int] | None,
                 attributes: dict[str, str], path: str, query: dict[str, str],
                 flavor: str | None) -> tuple[int, Any]:
        """(status, text or JSON) for GET http://metadata.google.internal<path> from `caller`."""
        with self.lock:
            self.metadata_requests.append((caller, path))
        if path in ("", "/"):
            return 200, "computeMetadata/\n"
        if flavor != "Google":
            return 403, "Missing required header: Metadata-Flavor"
        if machine is None:
            return 404, "not found"
        kind, resource, index = machine
        prefix = "/computeMetadata/v1/"
        if not path.startswith(prefix):
            return 404, "not found"
        key = path.removeprefix(prefix).rstrip("/")
        accounts = resource.get("serviceAccounts") or (
            [resource["serviceAccount"]] if resource.get("serviceAccount") else [])
        account = accounts[0] if accounts else None
        simple = {
            "project/project-id": self.project,
            "project/numeric-project-id": self.project_number,
            "universe/universe-domain": "googleapis.com",
            "instance/id": str(resource.get("id", "")),
            "instance/name": str(resource.get("name", "")).rsplit("/", 1)[-1],
        }
        if key in simple:
            return 200, simple[key]
        if key.startswith("instance/attributes/"):
            name = key.removeprefix("instance/attributes/")
            values = {**attributes, "agent-worker-number": str(index)} if kind == "tpu" else {}
            return (200, values[name]) if name in values else (404, "not found")
        if key.startswith("instance/service-accounts/"):
            if account is None:
                return 404, "not found"
            email = str(account.get("email"))
            which, _, leaf = key.removeprefix("instance/service-accounts/").partition("/")
            if which not in ("default", email):
                return 404, "not found"
            if leaf == "" and query.get("recursive") == "true":
                return 200, {"aliases": ["default"], "email": email,
                             "scopes": account.get("scopes") or account.get("scope") or [SCOPE]}
            if leaf == "email":
                return 200, email
            if leaf == "token":
                return 200, self.issue(email)
        return 404, "not found"


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)
