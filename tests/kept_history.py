"""What the autoscaling beds check in the metrics history teardown keeps (tests/slurm/
test_e2e_metrics.py, tests/lambda_cloud/test_e2e_autoscale.py): teardown said where it kept it,
and its worker series went 0 -> 2 -> 0 with the demand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def kept_run(home: Path, cluster: str) -> Path:
    """The one run's history teardown kept for `cluster` under `home` (.rayfleet): each run is its
    own file, named by its cluster id (infra/core/metrics/report_runs.py)."""
    runs = sorted((home / "metrics" / cluster / "runs").glob("*.json.gz"))
    assert len(runs) == 1, f"one run kept for {cluster}, found {runs}"
    return runs[0]


def check_workers_went_0_2_0(kept: Path, said: str, head_type: str) -> dict[str, Any]:
    """The kept copy at `kept` (teardown's output `said` names it): its nodes-by-type series,
    the head's type left out, start at 0 workers, reach 2, and are back at 0 after. Returns the
    copy."""
    assert f"metrics history kept in {kept}" in said, said
    data: dict[str, Any] = json.loads(gzip.decompress(kept.read_bytes()))
    workers: dict[float, float] = {}
    for series in data["series"]["nodes_by_type"]:
        if series["labels"].get("NodeType") != head_type:
            for t, v in series["values"]:
                workers[t] = workers.get(t, 0.0) + v
    counts = [workers[t] for t in sorted(workers)]
    assert counts and counts[0] == 0, f"{counts}; the kept copy: {summary(data)}"
    two = counts.index(2.0) if 2.0 in counts else -1
    assert two > 0 and 0.0 in counts[two:], f"worker series never went 0 -> 2 -> 0: {counts}"
    return data


def summary(data: dict[str, Any]) -> str:
    """What a kept copy holds, for a failure message: its window, each series' labels and point
    count, and its jobs (whose cluster it is)."""
    series = {name: [(found.get("labels"), len(found.get("values", []))) for found in listed]
              for name, listed in data.get("series", {}).items()}
    jobs = [(job.get("status"), job.get("entrypoint")) for job in data.get("jobs", [])]
    return (f"since {data.get('since')} until {data.get('until')} step {data.get('step')}; "
            f"series {series}; jobs {jobs}")
