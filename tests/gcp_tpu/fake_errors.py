"""Google's two error shapes, as the fakes answer them (Compute's `errors[].reason`, and the
gRPC-style `status` + `details[]` ErrorInfo of the TPU, IAM and Resource Manager APIs)."""

from __future__ import annotations

import re
from typing import Any

#: Google's label rules (cloud.google.com/compute/docs/labeling-resources; the TPU API's are the
#: same): at most 64 labels, keys 1-63 lowercase letters, digits, _ and -, starting with a letter;
#: values 0-63 of the same. The discovery documents type labels only as a string map.
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def label_problem(labels: Any) -> str:
    """Why Google would refuse these labels ('' if it would not)."""
    if not isinstance(labels, dict):
        return ""
    if len(labels) > 64:
        return f"{len(labels)} labels, at most 64 are allowed"
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(str(key)):
            return f"label key {key!r} does not match [a-z][a-z0-9_-]{{0,62}}"
        if not _LABEL_VALUE.fullmatch(str(value)):
            return f"label value {value!r} of {key} does not match [a-z0-9_-]{{0,63}}"
    return ""


def compute_error(status: int, reason: str, message: str, service_disabled: str = "") -> dict:
    body: dict[str, Any] = {"code": status, "message": message,
                            "errors": [{"message": message, "domain": "global", "reason": reason}]}
    if service_disabled:
        body["status"] = "PERMISSION_DENIED"
        body["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "SERVICE_DISABLED", "domain": "googleapis.com",
                            "metadata": {"service": service_disabled,
                                         "consumer": "projects/123456789"}}]
    return {"error": body}


def grpc_error(status: int, status_name: str, message: str, reason: str = "",
               service: str = "tpu.googleapis.com") -> dict:
    body: dict[str, Any] = {"code": status, "message": message, "status": status_name}
    if reason:
        body["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                            "domain": "googleapis.com",
                            "metadata": {"service": service, "consumer": "projects/123456789"}}]
    return {"error": body}


def rate_limited(api: str = "compute") -> dict:
    if api == "compute":
        return compute_error(429, "rateLimitExceeded", "Rate Limit Exceeded")
    return grpc_error(429, "RESOURCE_EXHAUSTED",
                      "Quota exceeded for quota metric 'Read requests' and limit 'Read requests "
                      "per minute' of service 'tpu.googleapis.com'", "RATE_LIMIT_EXCEEDED")


def service_disabled(service: str) -> dict:
    name = {"tpu.googleapis.com": "Cloud TPU API",
            "compute.googleapis.com": "Compute Engine API",
            "serviceusage.googleapis.com": "Service Usage API"}[service]
    message = (f"{name} has not been used in project 123456789 before or it is disabled. Enable "
               f"it by visiting https://console.developers.google.com/apis/api/{service}/overview"
               "?project=123456789 then retry.")
    if service == "compute.googleapis.com":
        return compute_error(403, "accessNotConfigured", message, service_disabled=service)
    return grpc_error(403, "PERMISSION_DENIED", message, "SERVICE_DISABLED", service)


def quota_exhausted(limit: str, where: str, service: str = "tpu.googleapis.com") -> dict:
    """An exhausted allocation quota as the TPU API answers it at once: HTTP 429
    RESOURCE_EXHAUSTED naming the quota limit, with a QuotaFailure and an ErrorInfo."""
    message = f"Quota limit '{limit}' has been exceeded. Limit: 0 in {where}."
    body = grpc_error(429, "RESOURCE_EXHAUSTED", message)
    body["error"]["details"] = [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
         "violations": [{"subject": limit, "description": message}]},
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "QUOTA_EXCEEDED",
         "domain": "googleapis.com", "metadata": {"service": service, "quota_limit": limit,
                                                  "consumer": "projects/123456789"}}]
    return body
