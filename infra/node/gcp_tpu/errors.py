"""Google's error answers as typed one-line errors (both shapes: Compute's `errors[].reason` and
the gRPC-style `status` + `details[]`), and which of them may pass if retried.

A 429 is two different things on Google's APIs: a rate limit ("... per minute", reason
RATE_LIMIT_EXCEEDED / rateLimitExceeded), which passes with time, and an exhausted allocation quota
("Quota limit 'TPUV4PodPerProjectPerZoneForTPUAPI' has been exceeded", a `QuotaFailure` detail),
which does not: the TPU API refuses a create over quota at once with 429 RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import json
import re
from typing import Any

from infra.node.errors import ProviderError

_SERVICES = {"compute.googleapis.com": "Compute Engine API", "tpu.googleapis.com": "Cloud TPU API",
             "serviceusage.googleapis.com": "Service Usage API"}
_RATE = re.compile(r"per (minute|second|100 seconds)|Per(Minute|Second)", re.IGNORECASE)
_QUOTA_NAME = re.compile(r"Quota (?:limit )?'([^']+)'(?: has been)? exceeded", re.IGNORECASE)


class GcpError(ProviderError):
    """A Google API call failed; `status`/`reason` are Google's, `retryable` says if it may pass."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "",
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retryable = retryable


class GcpCredentialsError(GcpError):
    """No usable Google credentials."""


class GcpApiDisabledError(GcpError):
    """The project has not enabled an API we need (`service` is e.g. tpu.googleapis.com)."""

    service: str = ""


class GcpNotFoundError(GcpError):
    """The project, zone, type, rule or node does not exist (or is not visible to us)."""


class GcpPermissionError(GcpError):
    """The credentials lack a permission."""


class GcpQuotaError(GcpError):
    """A quota (CPUs, addresses, firewall rules, TPUs) is exhausted."""


class GcpOperationError(GcpError):
    """A long-running operation ended with an error or did not end in time."""


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def classify(status: int, content: bytes | str, what: str, project: str) -> GcpError:
    """A Google error answer as a typed one-line error. Both error shapes are read: Compute's
    (`errors[].reason`) and the gRPC-style one (`status` plus `details[]` ErrorInfo)."""
    body = _error_body(content)
    message = _one_line(str(body.get("message") or f"HTTP {status}"))
    reasons = {str(e.get("reason")) for e in body.get("errors", []) if isinstance(e, dict)}
    service = ""
    for detail in body.get("details", []):
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("ErrorInfo"):
            reasons.add(str(detail.get("reason")))
            service = str((detail.get("metadata") or {}).get("service", "")) or service
    reasons.discard("None")
    reason = next(iter(sorted(reasons)), str(body.get("status", "")))
    if reasons & {"SERVICE_DISABLED", "accessNotConfigured"}:
        service = service or ("tpu.googleapis.com" if "TPU" in message else "compute.googleapis.com")
        error = GcpApiDisabledError(
            f"gcp-tpu: the {_SERVICES.get(service, service)} is not enabled in project {project}; "
            f"run `gcloud services enable {service} --project {project}` and retry in a minute",
            status=status, reason=reason)
        error.service = service
        return error
    quota = quota_name(body)
    if quota:
        return GcpQuotaError(
            f"gcp-tpu: {what}: quota {quota} is exhausted ({message}); free some or request more "
            f"at https://console.cloud.google.com/iam-admin/quotas?project={project}",
            status=status, reason="QUOTA_EXCEEDED")
    if status == 429 or reasons & {"rateLimitExceeded", "userRateLimitExceeded",
                                   "RATE_LIMIT_EXCEEDED"}:
        return GcpError(f"gcp-tpu: {what}: Google rate limit ({message}); wait a minute and retry",
                        status=status, reason=reason or "rateLimitExceeded", retryable=True)
    if reasons & {"quotaExceeded", "QUOTA_EXCEEDED"} or (status == 403 and "quota" in message.lower()):
        return GcpQuotaError(
            f"gcp-tpu: {what}: quota exceeded ({message}); free some or request more at "
            f"https://console.cloud.google.com/iam-admin/quotas?project={project}",
            status=status, reason=reason or "quotaExceeded")
    if status == 404:
        return GcpNotFoundError(f"gcp-tpu: {what}: not found ({message})", status=status,
                                reason=reason)
    if status in (401, 403):
        return GcpPermissionError(
            f"gcp-tpu: {what}: permission denied ({message}); check the project id and that "
            f"your account has Compute Admin and TPU Admin roles on {project}",
            status=status, reason=reason)
    return GcpError(f"gcp-tpu: {what}: HTTP {status} ({message})", status=status, reason=reason,
                    retryable=status >= 500)


def quota_name(body: dict[str, Any]) -> str:
    """The exhausted allocation quota an error names ('' if none, or if it is a rate limit)."""
    names: list[str] = []
    for detail in body.get("details", []) if isinstance(body.get("details"), list) else []:
        if not isinstance(detail, dict):
            continue
        kind = str(detail.get("@type", ""))
        if kind.endswith("QuotaFailure"):
            names += [str(v.get("subject") or v.get("description") or "")
                      for v in detail.get("violations", []) if isinstance(v, dict)]
        elif kind.endswith("ErrorInfo"):
            names.append(str((detail.get("metadata") or {}).get("quota_limit") or ""))
    match = _QUOTA_NAME.search(str(body.get("message", "")))
    if match:
        names.append(match.group(1))
    names = [n for n in names if n]
    if not names or any(_RATE.search(n) for n in names) or _RATE.search(str(body.get("message"))):
        return ""
    return names[0]


def is_quota_refusal(status: int, content: bytes | str) -> bool:
    """A 429 that names an exhausted allocation quota: retrying cannot help."""
    if status != 429:
        return False
    return bool(quota_name(_error_body(content)))


def _error_body(content: bytes | str) -> dict[str, Any]:
    try:
        body = json.loads(content or b"{}").get("error", {})
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        body = {}
    return body if isinstance(body, dict) else {"message": str(body)}

