"""Service Usage v1beta1 in the fake: `services.consumerQuotaMetrics.list` for
tpu.googleapis.com, which pre-flight reads for TPU quotas.

Google does not publish the TPU quota metrics' ids; the fake names them after the quota limits seen
in TPU error messages (`TPUV4PodPerProjectPerZoneForTPUAPI` ...), with display names in Google's
console wording ("TPU v4 cores per project per zone"). A limit has a default bucket (no
dimensions) and, with `view=FULL`, one bucket per zone; `effectiveLimit` is a decimal string
(int64), -1 meaning unlimited. `tpu_quota[(metric, zone)] = n` sets a zone's limit.
"""

from __future__ import annotations

import re
from typing import Any

from tests.gcp_tpu.fake_errors import grpc_error

#: (metric id, display name) of the TPU quotas the fake lists.
TPU_METRICS = [
    ("tpu.googleapis.com/tpu_v4_pod_cores", "TPU v4 cores per project per zone"),
    ("tpu.googleapis.com/tpu_v4_pod_cores_preemptible",
     "Preemptible TPU v4 cores per project per zone"),
    ("tpu.googleapis.com/tpu_v5e_chips", "TPU v5e chips per project per zone"),
    ("tpu.googleapis.com/tpu_v5e_chips_preemptible",
     "Preemptible TPU v5e chips per project per zone"),
    ("tpu.googleapis.com/tpu_v6e_chips", "TPU v6e chips per project per zone"),
    ("tpu.googleapis.com/tpu_v6e_chips_preemptible",
     "Preemptible TPU v6e chips per project per zone"),
]


class QuotaApi:
    """Mixed into FakeGcp."""

    project: str
    zones: dict[str, str]
    page_size: int

    def _quota_init(self) -> None:
        #: (metric id, zone) -> limit; zones not listed get `tpu_quota_default`.
        self.tpu_quota: dict[tuple[str, str], int] = {}
        self.tpu_quota_default = 64
        #: Zones without any TPU quota: every TPU metric is 0 there, and TPU creates get 429.
        self.tpu_quota_zones: set[str] = set()

    def _service_usage(self, method: str, path: str,
                       query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        match = re.fullmatch(r"projects/([^/]+)/services/([^/]+)/consumerQuotaMetrics", path)
        if not match or method != "GET":
            return 404, grpc_error(404, "NOT_FOUND", f"Resource '{path}' was not found",
                                   service="serviceusage.googleapis.com")
        project, service = match.groups()
        if project != self.project:
            return 403, grpc_error(403, "PERMISSION_DENIED", f"Permission denied on resource "
                                   f"project {project}.", service="serviceusage.googleapis.com")
        parent = f"projects/{project}/services/{service}"
        metrics = [self._metric(parent, metric, display, query.get("view") == "FULL")
                   for metric, display in (TPU_METRICS if service == "tpu.googleapis.com" else [])]
        size = min(int(query.get("pageSize") or 500), self.page_size)  # AIP-158: may be fewer
        start = int(query.get("pageToken") or "0")
        page: dict[str, Any] = {}
        if metrics[start:start + size]:
            page["metrics"] = metrics[start:start + size]
        if start + size < len(metrics):
            page["nextPageToken"] = str(start + size)
        return 200, page

    def _metric(self, parent: str, metric: str, display: str, full: bool) -> dict[str, Any]:
        encoded = metric.replace("/", "%2F")
        buckets: list[dict[str, Any]] = [{"effectiveLimit": str(self.tpu_quota_default),
                                          "defaultLimit": str(self.tpu_quota_default)}]
        for zone in sorted(self.zones) if full else []:
            limit = (0 if zone in self.tpu_quota_zones else
                     self.tpu_quota.get((metric, zone), self.tpu_quota_default))
            buckets.append({"effectiveLimit": str(limit), "defaultLimit":
                            str(self.tpu_quota_default), "dimensions": {"zone": zone}})
        return {"name": f"{parent}/consumerQuotaMetrics/{encoded}", "displayName": display,
                "metric": metric, "unit": "1/{project}/{zone}",
                "consumerQuotaLimits": [{
                    "name": f"{parent}/consumerQuotaMetrics/{encoded}/limits/%2Fproject%2Fzone",
                    "metric": metric, "unit": "1/{project}/{zone}", "isPrecise": True,
                    "allowsAdminOverrides": True, "quotaBuckets": buckets}]}
