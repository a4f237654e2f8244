"""Pre-flight's TPU quota check, read from Service Usage v1beta1 (`consumerQuotaMetrics`).

Why this API: of the two Google documents for quotas, only Service Usage ships with
google-api-python-client 2.202.0 (v1beta1 lists a service's quota metrics with every zone's and
region's limit); the Cloud Quotas API has no bundled document, and Compute's `regions.get` has no
TPU quotas. Neither API reports TPU *usage*, so the check is about the limit: a zone whose TPU quota
for the generation is 0 refuses every create at once (HTTP 429 "Quota limit ... has been
exceeded"), the common case for a new project, and that is what `up` refuses before creating
anything. Metric names are matched by generation and preemptibility (NOTES.md, an assumption);
a project where none matches, or where Service Usage cannot be read, gets a warning, never a stop.
"""

from __future__ import annotations

import re
from typing import Any

from infra.node.gcp_tpu.api import Gcp, GcpError, GcpQuotaError
from infra.providers.gcp_tpu.spec import Spec

#: Words a quota's metric id or display name uses for a generation (`v5litepod` is v5e there).
_WORDS = {"v5litepod": ("v5e", "v5lite", "v5_lite", "v5litepod")}


def limit(metrics: list[dict[str, Any]], generation: str, preemptible: bool, zone: str,
          region: str) -> tuple[str, int] | None:
    """(quota name, limit) of the first metric for `generation` in `zone`; -1 is unlimited."""
    words = _WORDS.get(generation, (generation,))
    for metric in metrics:
        text = f"{metric.get('metric', '')} {metric.get('displayName', '')}".lower()
        tokens = set(re.split(r"[^a-z0-9]+", text.replace("tpu_", "tpu ")))
        if not tokens & set(words) or ("preemptible" in tokens) != preemptible:
            continue
        for quota in metric.get("consumerQuotaLimits") or []:
            buckets = quota.get("quotaBuckets") or []
            chosen = (next((b for b in buckets if (b.get("dimensions") or {}).get("zone") == zone),
                           None)
                      or next((b for b in buckets
                               if (b.get("dimensions") or {}).get("region") == region), None)
                      or next((b for b in buckets if not b.get("dimensions")), None))
            if chosen is not None and "effectiveLimit" in chosen:
                name = str(metric.get("displayName") or metric.get("metric"))
                return name, int(chosen["effectiveLimit"])
    return None


def check(spec: Spec, api: Gcp, region: str, passed: list[str],
          warnings: list[str]) -> None:
    """Refuse a TPU worker type with min_workers > 0 whose quota in the zone is 0; warn for the
    autoscaled ones and when the quotas cannot be read."""
    try:
        metrics = api.tpu_quota_metrics()
    except GcpError as exc:
        warnings.append(f"TPU quotas not checked ({str(exc).removeprefix('gcp-tpu: ')})")
        return
    checked = []
    for name, worker in spec.tpu_workers.items():
        generation = worker.slice.generation.name
        found = limit(metrics, generation, worker.provisioning != "standard", spec.zone, region)
        if found is None:
            warnings.append(f"tpu_workers.{name}: no {generation} TPU quota listed for "
                            f"{spec.zone}; not checked")
            continue
        quota, value = found
        if value == 0 and worker.min_workers > 0:
            raise GcpQuotaError(
                f"gcp-tpu: tpu_workers.{name}: TPU quota '{quota}' is 0 in {spec.zone}; request "
                f"quota at https://console.cloud.google.com/iam-admin/quotas?project="
                f"{spec.project}, or pick another zone", reason="QUOTA_EXCEEDED")
        if value == 0:
            warnings.append(f"tpu_workers.{name}: TPU quota '{quota}' is 0 in {spec.zone}; the "
                            "autoscaler's TPU launches will be refused")
            continue
        checked.append(f"{quota}: {'unlimited' if value < 0 else value}")
    if checked:
        passed.append(f"TPU quotas in {spec.zone}: {'; '.join(checked)}")
